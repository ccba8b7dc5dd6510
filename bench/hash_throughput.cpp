// hash_throughput: how fast checkpoint files are hashed. Writes one file of
// pseudo-random bytes (it stays in the page cache, so this measures hashing
// and copying out of the cache, not the disk) and hashes it, in interleaved
// rounds: one SHA-256 stream over the whole file (manifest format 1), the
// chunked SHA-256 of format 2 on one thread, and on N threads. Prints the
// best round of each in GB/s (10^9 bytes per second) and the speed-up of N
// threads over one, with the cores that were busy (CPU time / wall time:
// on a loaded machine it shows how many the threads actually got); exits 1
// when the digests of 1 and N threads differ.
//
//   hash_throughput [--size-mib 1024] [--threads N] [--rounds 3] [--dir DIR]
//
// N defaults to what checkpoints use (CUSNAP_HASH_THREADS, else the
// hardware threads up to 32).
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "coord/sha256.h"
#include "coord/sha256_chunked.h"

using namespace cusnap;

namespace {

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "hash_throughput: %s\nusage: hash_throughput [--size-mib N] [--threads N] "
               "[--rounds N] [--dir DIR]\n",
               why);
  std::exit(2);
}

unsigned long number(int argc, char** argv, int* i) {
  if (*i + 1 >= argc) usage("an option lacks its value");
  char* end = nullptr;
  unsigned long v = std::strtoul(argv[++*i], &end, 10);
  if (*end != '\0' || v == 0) usage("a value is not a positive number");
  return v;
}

bool write_random_file(const std::string& path, uint64_t size) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  std::vector<uint64_t> buf((4u << 20) / sizeof(uint64_t));
  uint64_t x = 0x9e3779b97f4a7c15ULL;
  for (uint64_t done = 0; done < size;) {
    for (uint64_t& w : buf) {  // xorshift64
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      w = x;
    }
    size_t n = size_t(std::min<uint64_t>(buf.size() * sizeof(uint64_t), size - done));
    if (write(fd, buf.data(), n) != ssize_t(n)) {
      close(fd);
      return false;
    }
    done += n;
  }
  return close(fd) == 0;
}

double cpu_seconds() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t size_mib = 1024;
  unsigned threads = 0, rounds = 3;
  std::string dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--size-mib")
      size_mib = number(argc, argv, &i);
    else if (a == "--threads")
      threads = unsigned(number(argc, argv, &i));
    else if (a == "--rounds")
      rounds = unsigned(number(argc, argv, &i));
    else if (a == "--dir" && i + 1 < argc)
      dir = argv[++i];
    else
      usage(("unknown argument " + a).c_str());
  }
  std::string err;
  if (threads == 0 && !hash_thread_count(&threads, &err)) usage(err.c_str());

  const uint64_t size = size_mib << 20;
  std::string path = dir + "/cusnap-hash-throughput-XXXXXX";
  int fd = mkstemp(path.data());
  if (fd < 0) {
    std::fprintf(stderr, "hash_throughput: cannot create a file in %s: %s\n", dir.c_str(),
                 std::strerror(errno));
    return 1;
  }
  close(fd);
  if (!write_random_file(path, size)) {
    std::fprintf(stderr, "hash_throughput: cannot write %s: %s\n", path.c_str(),
                 std::strerror(errno));
    unlink(path.c_str());
    return 1;
  }

  // Other load on the machine takes cores from the N-thread figure: say how
  // much there was.
  double load = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = -1;
    std::fclose(f);
  }
  std::printf(
      "hash_throughput: %llu MiB file in %s (page cache), chunks of %llu MiB, best of %u "
      "rounds; %u hardware threads, SHA extensions: %s, load average %.2f\n",
      (unsigned long long)size_mib, dir.c_str(), (unsigned long long)(kHashChunkSize >> 20), rounds,
      std::thread::hardware_concurrency(), Sha256::hardware_accelerated() ? "yes" : "no", load);

  // Best wall time of each way, and the CPU time of that round: CPU / wall
  // is how many cores were busy hashing.
  struct Best {
    double wall = 1e30, cpu = 0;
  } stream, one, many;
  auto measure = [&](Best* best, auto&& hash) {
    double c0 = cpu_seconds();
    auto t0 = std::chrono::steady_clock::now();
    if (!hash()) {
      std::fprintf(stderr, "hash_throughput: %s\n", err.c_str());
      unlink(path.c_str());
      std::exit(1);
    }
    double wall = seconds_since(t0), cpu = cpu_seconds() - c0;
    if (wall < best->wall) *best = Best{wall, cpu};
  };
  std::string first_root;
  bool same = true;
  for (unsigned r = 0; r < rounds; ++r) {
    measure(&stream, [&] {
      std::string hex;
      uint64_t got = 0;
      return sha256_file(path, &hex, &got, &err);
    });
    for (unsigned n : {1u, threads}) {
      HashOptions o;
      o.threads = n;
      std::vector<ChunkedDigest> out;
      measure(n == 1 ? &one : &many, [&] {
        return sha256_chunked_files({{path, size, kHashChunkSize}}, o, &out, &err);
      });
      std::string root = to_hex(out[0].root);
      if (first_root.empty()) first_root = root;
      same = same && root == first_root;
    }
  }
  unlink(path.c_str());

  auto line = [&](const char* what, const Best& b) {
    std::printf("  %-40s %7.2f GB/s  %5.2f cores busy", what, double(size) / b.wall / 1e9,
                b.cpu / b.wall);
  };
  line("whole file, one SHA-256 stream (format 1)", stream);
  std::printf("\n");
  line("chunked SHA-256, 1 thread", one);
  std::printf("\n");
  line(("chunked SHA-256, " + std::to_string(threads) + " threads").c_str(), many);
  std::printf("  x%.2f over 1 thread\n", one.wall / many.wall);
  std::printf("  digest %s with 1 and %u threads\n", same ? "identical" : "DIFFERS", threads);
  return same ? 0 : 1;
}
