// cusnap-copy-bandwidth: the machine's ceiling for copies between device
// memory and pinned host memory, through the driver API, to compare the
// save and load of shared memory at checkpoint and restore with
// (bench/shared_checkpoint.sh); with --file-dir, also the host's ceilings for
// moving the same bytes into and out of files in that directory (the page
// cache, where the checkpoint's part files are written).
//
//   cusnap-copy-bandwidth [--mib N] [--rounds R] [--streams S] [--chunk-mib C]
//                         [--file-dir DIR [--file-threads T]]
//
// Allocates N MiB of device memory (cuMemAlloc, default 1024) and one pinned
// host buffer of C MiB (cuMemHostAlloc, default 64) per stream (S streams,
// default 4, non-blocking), as a checkpoint's staging buffers are. A round
// copies all N MiB device-to-host (cuMemcpyDtoHAsync), C MiB chunks dealt to
// the streams in turn, chunk i on stream i % S into that stream's buffer,
// then waits for every stream; then the same host-to-device
// (cuMemcpyHtoDAsync). One round first warms up (not counted); of the next
// R (default 5) the best of each direction is kept. Before that one chunk
// goes there and back and must come back unchanged.
//
// --file-dir DIR: after the device measurements (and after freeing what they
// held), the N MiB are split into T (default: the online CPUs, at most 16)
// slices of whole pages, one per thread; two anonymous buffers of N MiB are
// allocated and pre-faulted (the source filled with a pattern). Of R rounds,
// the best of each is kept:
//   file_write: every thread creates its own file DIR/cusnap-copy-bandwidth.
//     PID.K.bin (O_CREAT | O_TRUNC; the previous round's files are removed
//     first, untimed) and writes its slice of the source to it with 32 MiB
//     pwrite calls, then closes it;
//   file_read: every thread opens its file again and reads it back with 32 MiB
//     pread calls into its slice of the other buffer (from the page cache,
//     which is not dropped).
// After the last round the bytes read back must equal the source. Then R
// rounds of memcpy: every thread copies its slice from one anonymous buffer to
// the other. A pass is timed from the moment all T threads are released
// (created and waiting) to the end of the last. The files are removed at the
// end, after a failure, and on SIGINT, SIGTERM or SIGHUP. Before anything
// else DIR must have N MiB free plus a margin (the larger of 64 MiB and N/16).
//
// Prints one line of JSON on stdout:
//   {"d2h_gbps":..,"h2d_gbps":..,"mib":N,"rounds":R,"streams":S,"chunk_mib":C,"device":".."}
// and with --file-dir, before the closing brace:
//   ,"file_write_gbps":..,"file_read_gbps":..,"memcpy_gbps":..,"file_threads":T,"file_dir":".."
// GB/s are 10^9 bytes per second. Exit status 2 when a driver call fails,
// the chunk came back changed, DIR lacks room or a file or memory operation
// fails (the message names it), 64 on a bad option.
//
// It links the driver by its soname (libcuda.so.1) and carries no run path:
// the loader path decides between the real and the simulated driver.
#include <cuda.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr const char* kUsage =
    "usage: cusnap-copy-bandwidth [--mib N] [--rounds R] [--streams S] [--chunk-mib C]\n"
    "                             [--file-dir DIR [--file-threads T]]\n";

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "cusnap-copy-bandwidth: %s\n%s", why, kUsage);
  std::exit(64);
}

void check(CUresult r, const char* call) {
  if (r == CUDA_SUCCESS) return;
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  std::fprintf(stderr, "cusnap-copy-bandwidth: %s failed: %s (%d)\n", call, name ? name : "?",
               int(r));
  std::exit(2);
}
#define CHECK(call) check((call), #call)

struct Options {
  uint64_t mib = 1024;
  unsigned rounds = 5;
  unsigned streams = 4;
  uint64_t chunk_mib = 64;
  std::string file_dir;       // empty: no file measurements
  unsigned file_threads = 0;  // 0: the online CPUs, at most 16
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::printf(
          "%s"
          "Pinned device<->host copy bandwidth (driver API), best of R rounds, as one line of "
          "JSON.\n"
          "--file-dir DIR: then also, with T threads (default: the online CPUs, at most 16)\n"
          "each on its own file in DIR, the write of N MiB into fresh files and their read\n"
          "back (32 MiB pwrite/pread, page cache), and memcpy between anonymous buffers.\n",
          kUsage);
      std::exit(0);
    }
    if (i + 1 >= argc) usage(("missing value after " + a).c_str());
    if (a == "--file-dir") {
      o.file_dir = argv[++i];
      if (o.file_dir.empty()) usage("empty directory after --file-dir");
      continue;
    }
    char* end = nullptr;
    unsigned long v = std::strtoul(argv[++i], &end, 10);
    if (*end != '\0' || v == 0) usage(("not a positive number after " + a).c_str());
    if (a == "--mib")
      o.mib = v;
    else if (a == "--rounds")
      o.rounds = unsigned(std::min(v, 1000ul));
    else if (a == "--streams")
      o.streams = unsigned(std::min(v, 64ul));
    else if (a == "--chunk-mib")
      o.chunk_mib = v;
    else if (a == "--file-threads")
      o.file_threads = unsigned(std::min(v, 256ul));
    else
      usage(("unknown option " + a).c_str());
  }
  if (o.file_threads != 0 && o.file_dir.empty()) usage("--file-threads needs --file-dir");
  if (o.file_threads == 0) {
    long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
    o.file_threads = unsigned(std::clamp(cpus, 1l, 16l));
  }
  return o;
}

// JSON string contents: the device name, escaped where needed.
std::string json_escape(const char* s) {
  std::string out;
  for (; *s; ++s) {
    unsigned char c = static_cast<unsigned char>(*s);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out;
}

// --- the host's ceilings: files in --file-dir, memcpy -------------------------

constexpr uint64_t kIoBytes = 32ull << 20;  // per pwrite / pread call

// The files of the file measurements, removed at the end, on a failure and on
// SIGINT / SIGTERM / SIGHUP. Filled before the handlers are installed and not
// changed while they are.
std::vector<std::string> g_files;

void remove_files() {
  for (const std::string& f : g_files) ::unlink(f.c_str());
}

extern "C" void on_signal(int sig) {
  for (const std::string& f : g_files) ::unlink(f.c_str());  // async-signal-safe
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

[[noreturn]] void file_fail(const std::string& why) {
  remove_files();
  std::fprintf(stderr, "cusnap-copy-bandwidth: %s\n", why.c_str());
  std::exit(2);
}

// DIR must be a writable directory with N MiB plus a margin free; else exit 2.
void check_file_dir(const std::string& dir, uint64_t mib) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    std::fprintf(stderr, "cusnap-copy-bandwidth: --file-dir %s: %s\n", dir.c_str(),
                 std::strerror(errno));
    std::exit(2);
  }
  if (!S_ISDIR(st.st_mode)) {
    std::fprintf(stderr, "cusnap-copy-bandwidth: --file-dir %s: not a directory\n", dir.c_str());
    std::exit(2);
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    std::fprintf(stderr, "cusnap-copy-bandwidth: --file-dir %s: not writable: %s\n", dir.c_str(),
                 std::strerror(errno));
    std::exit(2);
  }
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) != 0) {
    std::fprintf(stderr, "cusnap-copy-bandwidth: --file-dir %s: statvfs: %s\n", dir.c_str(),
                 std::strerror(errno));
    std::exit(2);
  }
  const uint64_t margin = std::max<uint64_t>(64, mib / 16);
  const uint64_t free_mib = uint64_t(vfs.f_bavail) * uint64_t(vfs.f_frsize) >> 20;
  if (free_mib < mib + margin) {
    std::fprintf(stderr,
                 "cusnap-copy-bandwidth: --file-dir %s has %llu MiB free; the file measurements "
                 "need %llu MiB there (--mib %llu plus a %llu MiB margin)\n",
                 dir.c_str(), static_cast<unsigned long long>(free_mib),
                 static_cast<unsigned long long>(mib + margin), static_cast<unsigned long long>(mib),
                 static_cast<unsigned long long>(margin));
    std::exit(2);
  }
}

// Runs fn(k) on n threads at once; seconds from the moment all of them are
// created and released to the end of the last. A thread that fails records
// why in *err (the first failure wins).
template <class F>
double parallel(unsigned n, F fn) {
  std::atomic<unsigned> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  threads.reserve(n);
  try {
    for (unsigned k = 0; k < n; ++k)
      threads.emplace_back([&, k] {
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        fn(k);
      });
  } catch (const std::exception& e) {
    go.store(true, std::memory_order_release);
    for (std::thread& t : threads) t.join();
    file_fail(std::string("starting a thread: ") + e.what());
  }
  while (ready.load() < n) std::this_thread::yield();
  auto t0 = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  for (std::thread& t : threads) t.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct HostCeilings {
  double file_write_gbps = 0, file_read_gbps = 0, memcpy_gbps = 0;
  unsigned threads = 0;
};

HostCeilings measure_host(const Options& o, uint64_t size) {
  // Slices of whole pages, one per thread; no thread without bytes.
  const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  uint64_t per = (size + o.file_threads - 1) / o.file_threads;
  per = (per + page - 1) / page * page;
  const unsigned n = unsigned((size + per - 1) / per);
  auto slice = [&](unsigned k, uint64_t* off, uint64_t* len) {
    *off = k * per;
    *len = std::min(per, size - *off);
  };

  const std::string base = o.file_dir + (o.file_dir.back() == '/' ? "" : "/") +
                           "cusnap-copy-bandwidth." + std::to_string(::getpid()) + ".";
  for (unsigned k = 0; k < n; ++k) g_files.push_back(base + std::to_string(k) + ".bin");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int {}, old_term {}, old_hup {};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGHUP, &sa, &old_hup);

  auto map = [&](const char* what) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      file_fail(std::string("mmap of the ") + what + " buffer (" + std::to_string(size >> 20) +
                " MiB): " + std::strerror(errno));
    return static_cast<unsigned char*>(p);
  };
  unsigned char* src = map("source");
  unsigned char* dst = map("destination");

  std::mutex mu;
  std::string err;
  auto fail = [&](const std::string& why) {
    std::lock_guard<std::mutex> l(mu);
    if (err.empty()) err = why;
  };
  auto failed = [&] {
    std::lock_guard<std::mutex> l(mu);
    return !err.empty();
  };
  auto check_err = [&] {
    if (!err.empty()) file_fail(err);
  };

  // Pre-fault both buffers, the source with a pattern, on the same threads.
  parallel(n, [&](unsigned k) {
    uint64_t off, len;
    slice(k, &off, &len);
    auto* p = reinterpret_cast<uint64_t*>(src + off);
    for (uint64_t w = 0, words = len / 8; w < words; ++w)
      p[w] = (off / 8 + w + 1) * 0x9E3779B97F4A7C15ull;
    std::memset(dst + off, 0, len);
  });

  auto write_file = [&](unsigned k) {
    uint64_t off, len;
    slice(k, &off, &len);
    const std::string& path = g_files[k];
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return fail("creating " + path + ": " + std::strerror(errno));
    for (uint64_t done = 0; done < len && !failed();) {
      ssize_t w = ::pwrite(fd, src + off + done, std::min(kIoBytes, len - done), off_t(done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        fail("writing " + path + ": " + (w < 0 ? std::strerror(errno) : "wrote nothing"));
        break;
      }
      done += uint64_t(w);
    }
    if (::close(fd) != 0) fail("closing " + path + ": " + std::strerror(errno));
  };
  auto read_file = [&](unsigned k) {
    uint64_t off, len;
    slice(k, &off, &len);
    const std::string& path = g_files[k];
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail("opening " + path + ": " + std::strerror(errno));
    for (uint64_t done = 0; done < len && !failed();) {
      ssize_t r = ::pread(fd, dst + off + done, std::min(kIoBytes, len - done), off_t(done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        fail("reading " + path + ": " + (r < 0 ? std::strerror(errno) : "shorter than written"));
        break;
      }
      done += uint64_t(r);
    }
    ::close(fd);
  };

  double best_w = 1e300, best_r = 1e300, best_m = 1e300;
  for (unsigned r = 0; r < o.rounds; ++r) {
    remove_files();  // fresh files every round, untimed
    best_w = std::min(best_w, parallel(n, write_file));
    check_err();
    best_r = std::min(best_r, parallel(n, read_file));
    check_err();
  }
  // The bytes read back are the bytes written.
  parallel(n, [&](unsigned k) {
    uint64_t off, len;
    slice(k, &off, &len);
    if (std::memcmp(src + off, dst + off, len) != 0)
      fail(g_files[k] + " read back differs from what was written");
  });
  check_err();
  remove_files();

  for (unsigned r = 0; r < o.rounds; ++r)
    best_m = std::min(best_m, parallel(n, [&](unsigned k) {
                        uint64_t off, len;
                        slice(k, &off, &len);
                        std::memcpy(dst + off, src + off, len);
                      }));

  ::munmap(src, size);
  ::munmap(dst, size);
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGHUP, &old_hup, nullptr);
  g_files.clear();

  HostCeilings h;
  h.file_write_gbps = double(size) / best_w / 1e9;
  h.file_read_gbps = double(size) / best_r / 1e9;
  h.memcpy_gbps = double(size) / best_m / 1e9;
  h.threads = n;
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  const uint64_t size = o.mib << 20;
  const uint64_t chunk = std::min(o.chunk_mib << 20, size);
  const uint64_t nchunks = (size + chunk - 1) / chunk;
  const unsigned nstreams = unsigned(std::min<uint64_t>(o.streams, nchunks));
  // Fail early, before the device measurements, when DIR cannot take the files.
  if (!o.file_dir.empty()) check_file_dir(o.file_dir, o.mib);

  CUdevice dev;
  CUcontext ctx;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  char name[256] = "?";
  if (cuDeviceGetName(name, sizeof name, dev) != CUDA_SUCCESS) std::strcpy(name, "?");

  CUdeviceptr dbuf = 0;
  CHECK(cuMemAlloc(&dbuf, size));
  std::vector<void*> host(nstreams, nullptr);
  std::vector<CUstream> streams(nstreams, nullptr);
  for (unsigned s = 0; s < nstreams; ++s) {
    CHECK(cuMemHostAlloc(&host[s], chunk, 0));
    // Touch every page, so no first-touch cost lands in a timed round.
    std::memset(host[s], int(0x11 * (s + 1)), chunk);
    CHECK(cuStreamCreate(&streams[s], CU_STREAM_NON_BLOCKING));
  }

  // One chunk there and back: the copies move the bytes.
  {
    auto* p = static_cast<uint64_t*>(host[0]);
    const uint64_t words = chunk / 8;
    for (uint64_t k = 0; k < words; ++k) p[k] = (k + 1) * 0x9E3779B97F4A7C15ull;
    CHECK(cuMemcpyHtoDAsync(dbuf, host[0], chunk, streams[0]));
    CHECK(cuStreamSynchronize(streams[0]));
    std::memset(host[0], 0, chunk);
    CHECK(cuMemcpyDtoHAsync(host[0], dbuf, chunk, streams[0]));
    CHECK(cuStreamSynchronize(streams[0]));
    for (uint64_t k = 0; k < words; ++k) {
      if (p[k] != (k + 1) * 0x9E3779B97F4A7C15ull) {
        std::fprintf(stderr,
                     "cusnap-copy-bandwidth: the chunk came back changed at byte %llu\n",
                     static_cast<unsigned long long>(k * 8));
        return 2;
      }
    }
  }

  // One direction over all chunks; seconds from the first enqueue to the
  // last stream's completion.
  auto pass = [&](bool d2h) {
    auto t0 = std::chrono::steady_clock::now();
    for (uint64_t i = 0; i < nchunks; ++i) {
      const unsigned s = unsigned(i % nstreams);
      const uint64_t off = i * chunk, len = std::min(chunk, size - off);
      if (d2h)
        CHECK(cuMemcpyDtoHAsync(host[s], dbuf + off, len, streams[s]));
      else
        CHECK(cuMemcpyHtoDAsync(dbuf + off, host[s], len, streams[s]));
    }
    for (CUstream st : streams) CHECK(cuStreamSynchronize(st));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };

  pass(true);  // warm-up
  pass(false);
  double best_d2h = 1e300, best_h2d = 1e300;
  for (unsigned r = 0; r < o.rounds; ++r) {
    best_d2h = std::min(best_d2h, pass(true));
    best_h2d = std::min(best_h2d, pass(false));
  }
  const double d2h = double(size) / best_d2h / 1e9, h2d = double(size) / best_h2d / 1e9;

  for (unsigned s = 0; s < nstreams; ++s) {
    CHECK(cuStreamDestroy(streams[s]));
    CHECK(cuMemFreeHost(host[s]));
  }
  CHECK(cuMemFree(dbuf));
  CHECK(cuDevicePrimaryCtxRelease(dev));

  std::string host_fields;
  if (!o.file_dir.empty()) {
    const HostCeilings h = measure_host(o, size);
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  ",\"file_write_gbps\":%.3f,\"file_read_gbps\":%.3f,\"memcpy_gbps\":%.3f,"
                  "\"file_threads\":%u,\"file_dir\":\"",
                  h.file_write_gbps, h.file_read_gbps, h.memcpy_gbps, h.threads);
    host_fields = buf + json_escape(o.file_dir.c_str()) + "\"";
  }

  std::printf(
      "{\"d2h_gbps\":%.3f,\"h2d_gbps\":%.3f,\"mib\":%llu,\"rounds\":%u,\"streams\":%u,"
      "\"chunk_mib\":%llu,\"device\":\"%s\"%s}\n",
      d2h, h2d, static_cast<unsigned long long>(o.mib), o.rounds, nstreams,
      static_cast<unsigned long long>(chunk >> 20), json_escape(name).c_str(),
      host_fields.c_str());
  return 0;
}
