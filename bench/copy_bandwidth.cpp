// cusnap-copy-bandwidth: the machine's ceiling for copies between device
// memory and pinned host memory, through the driver API, to compare the
// save and load of shared memory at checkpoint and restore with
// (bench/shared_checkpoint.sh).
//
//   cusnap-copy-bandwidth [--mib N] [--rounds R] [--streams S] [--chunk-mib C]
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
// Prints one line of JSON on stdout:
//   {"d2h_gbps":..,"h2d_gbps":..,"mib":N,"rounds":R,"streams":S,"chunk_mib":C,"device":".."}
// GB/s are 10^9 bytes per second. Exit status 2 when a driver call fails or
// the chunk came back changed, 64 on a bad option.
//
// It links the driver by its soname (libcuda.so.1) and carries no run path:
// the loader path decides between the real and the simulated driver.
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "cusnap-copy-bandwidth: %s\nusage: cusnap-copy-bandwidth [--mib N] [--rounds R] "
               "[--streams S] [--chunk-mib C]\n",
               why);
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
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::printf(
          "usage: cusnap-copy-bandwidth [--mib N] [--rounds R] [--streams S] [--chunk-mib C]\n"
          "Pinned device<->host copy bandwidth (driver API), best of R rounds, as one line of "
          "JSON.\n");
      std::exit(0);
    }
    if (i + 1 >= argc) usage(("missing value after " + a).c_str());
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
    else
      usage(("unknown option " + a).c_str());
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

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  const uint64_t size = o.mib << 20;
  const uint64_t chunk = std::min(o.chunk_mib << 20, size);
  const uint64_t nchunks = (size + chunk - 1) / chunk;
  const unsigned nstreams = unsigned(std::min<uint64_t>(o.streams, nchunks));

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

  std::printf(
      "{\"d2h_gbps\":%.3f,\"h2d_gbps\":%.3f,\"mib\":%llu,\"rounds\":%u,\"streams\":%u,"
      "\"chunk_mib\":%llu,\"device\":\"%s\"}\n",
      d2h, h2d, static_cast<unsigned long long>(o.mib), o.rounds, nstreams,
      static_cast<unsigned long long>(chunk >> 20), json_escape(name).c_str());
  return 0;
}
