// cusnap-pattern-job: keeps a pattern in device memory and checks it forever.
//
//   cusnap-pattern-job [--mib N] [--interval-ms M] [--children K]
//                      [--verify-mib V] [--max-count C] [--visible L0/L1/...]
//
// Allocates N MiB (default 16) with cuMemAlloc and fills it with a pattern
// derived from the byte offset. Then, in a loop: verifies the memory through
// cuMemcpyDtoH (all of it, or a rotating V MiB slice plus every rewritten
// window), rewrites one 4 KiB window chosen from the counter with bytes that
// depend on the counter, increments the counter and prints "count N ok"
// (line-buffered), then sleeps M ms (default 100). The expected contents are
// computed, not stored, so large sizes need no host copy.
//
// With --children K it first forks K children (before any driver call), each
// with its own private allocation and pattern, printing "child I count N ok";
// the parent runs the same loop and exits 4 when a child fails. With
// --visible, process I (0 the parent) sets CUDA_VISIBLE_DEVICES to LI before
// its first driver call (a rank given one GPU of the machine).
//
// Exit status: 2 a driver call failed, 3 a byte was wrong (with a message
// naming the offset, the expected and the found byte), 4 a child failed,
// 0 after --max-count iterations.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "workload_util.h"

namespace {

constexpr size_t kWindow = 4096;

struct Options {
  size_t mib = 16;
  long interval_ms = 100;
  int children = 0;
  size_t verify_mib = 0;  // 0 = all
  long max_count = 0;     // 0 = forever
  std::vector<std::string> visible;  // CUDA_VISIBLE_DEVICES of process I
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "cusnap-pattern-job: %s\nusage: cusnap-pattern-job [--mib N] [--interval-ms M] "
               "[--children K] [--verify-mib V] [--max-count C] [--visible L0/L1/...]\n",
               msg);
  std::exit(64);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + a).c_str());
    if (a == "--visible") {
      std::string list = argv[++i];
      for (size_t at = 0;;) {
        size_t end = list.find('/', at);
        o.visible.push_back(list.substr(at, end - at));
        if (end == std::string::npos) break;
        at = end + 1;
      }
      continue;
    }
    long v = std::strtol(argv[++i], nullptr, 10);
    if (v < 0) usage(("negative value for " + a).c_str());
    if (a == "--mib")
      o.mib = size_t(v);
    else if (a == "--interval-ms")
      o.interval_ms = v;
    else if (a == "--children")
      o.children = int(v);
    else if (a == "--verify-mib")
      o.verify_mib = size_t(v);
    else if (a == "--max-count")
      o.max_count = v;
    else
      usage(("unknown option " + a).c_str());
  }
  if (o.mib == 0) usage("--mib must be at least 1");
  return o;
}

// The pattern: 8-byte words from the word index and a per-process seed; a
// rewritten window holds words from the counter that last wrote it.
inline uint64_t base_word(uint64_t k, uint64_t seed) {
  return (k + 1) * 0x9E3779B97F4A7C15ull ^ seed;
}
inline uint64_t window_word(uint64_t k, uint64_t counter, uint64_t seed) {
  return (k * 0xD6E8FEB86659FD93ull) ^ (counter * 0xA0761D6478BD642Full) ^ ~seed;
}

class Pattern {
 public:
  Pattern(size_t bytes, uint64_t seed, const char* who) : bytes_(bytes), seed_(seed), who_(who) {
    WL_CHECK(cuMemAlloc(&dptr_, bytes_), who_);
    chunk_.resize(std::min<size_t>(bytes_, 64u << 20) / 8);
    for (size_t off = 0; off < bytes_; off += chunk_.size() * 8) {
      size_t n = std::min(chunk_.size() * 8, bytes_ - off);
      for (size_t k = 0; k < n / 8; ++k) chunk_[k] = expected(off / 8 + k);
      WL_CHECK(cuMemcpyHtoD(dptr_ + off, chunk_.data(), n), who_);
    }
  }

  /// Checks [off, off+len) (8-aligned); exits 3 on the first wrong byte.
  void verify(size_t off, size_t len, long counter) {
    while (len > 0) {
      size_t n = std::min(len, chunk_.size() * 8);
      WL_CHECK(cuMemcpyDtoH(chunk_.data(), dptr_ + off, n), who_);
      for (size_t k = 0; k < n / 8; ++k) {
        uint64_t want = expected(off / 8 + k);
        if (chunk_[k] == want) continue;
        size_t b = 0;
        while (b < 7 && ((chunk_[k] >> (8 * b)) & 0xff) == ((want >> (8 * b)) & 0xff)) ++b;
        std::fprintf(stderr,
                     "%s: pattern mismatch at byte %zu of %zu: expected 0x%02x, found 0x%02x "
                     "(count %ld)\n",
                     who_, off + 8 * k + b, bytes_, unsigned((want >> (8 * b)) & 0xff),
                     unsigned((chunk_[k] >> (8 * b)) & 0xff), counter);
        std::exit(3);
      }
      off += n;
      len -= n;
    }
  }

  void verify_all(long counter) { verify(0, bytes_ / 8 * 8, counter); }

  /// A rotating slice plus every rewritten window.
  void verify_slice(size_t slice, long counter) {
    size_t start = (cursor_ % bytes_) / 8 * 8;
    size_t len = std::min(slice, bytes_ / 8 * 8 - start);
    verify(start, len, counter);
    cursor_ = start + len >= bytes_ / 8 * 8 ? 0 : start + len;
    for (const auto& [w, c] : windows_) verify(w * kWindow, window_len(w), counter);
  }

  void rewrite(long counter) {
    size_t nwin = (bytes_ + kWindow - 1) / kWindow;
    size_t w = size_t((uint64_t(counter) * 2654435761ull) % nwin);
    windows_[w] = uint64_t(counter);
    size_t len = window_len(w);
    std::vector<uint64_t> buf(len / 8);
    for (size_t k = 0; k < buf.size(); ++k) buf[k] = expected(w * kWindow / 8 + k);
    WL_CHECK(cuMemcpyHtoD(dptr_ + w * kWindow, buf.data(), len), who_);
  }

 private:
  uint64_t expected(uint64_t k) const {
    auto it = windows_.find(k * 8 / kWindow);
    return it == windows_.end() ? base_word(k, seed_) : window_word(k, it->second, seed_);
  }
  size_t window_len(size_t w) const { return std::min(kWindow, bytes_ / 8 * 8 - w * kWindow); }

  size_t bytes_;
  uint64_t seed_;
  const char* who_;
  CUdeviceptr dptr_ = 0;
  std::vector<uint64_t> chunk_;
  std::unordered_map<size_t, uint64_t> windows_;  // window -> counter that wrote it
  size_t cursor_ = 0;
};

void run(const Options& o, int index, const std::vector<pid_t>& children) {
  std::string who =
      index == 0 ? "cusnap-pattern-job" : "cusnap-pattern-job child " + std::to_string(index);
  std::string prefix = index == 0 ? "" : "child " + std::to_string(index) + " ";
  if (size_t(index) < o.visible.size())
    setenv("CUDA_VISIBLE_DEVICES", o.visible[size_t(index)].c_str(), 1);
  workload::init_device(who.c_str());
  Pattern p(o.mib << 20, 0x5eed0000ull + uint64_t(index), who.c_str());
  std::printf("%sready pid %d mib %zu\n", prefix.c_str(), int(getpid()), o.mib);
  for (long count = 1; o.max_count == 0 || count <= o.max_count; ++count) {
    if (o.verify_mib == 0)
      p.verify_all(count);
    else
      p.verify_slice(o.verify_mib << 20, count);
    p.rewrite(count);
    std::printf("%scount %ld ok\n", prefix.c_str(), count);
    for (pid_t c : children) {
      int status;
      if (waitpid(c, &status, WNOHANG) == c) {
        std::fprintf(stderr, "%s: child process %d ended (%s %d)\n", who.c_str(), int(c),
                     WIFEXITED(status) ? "exit status" : "signal",
                     WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        std::exit(4);
      }
    }
    if (o.interval_ms > 0) usleep(useconds_t(o.interval_ms * 1000));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  std::vector<pid_t> children;
  for (int i = 1; i <= o.children; ++i) {
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("cusnap-pattern-job: fork");
      return 2;
    }
    if (pid == 0) {
      run(o, i, {});
      return 0;
    }
    children.push_back(pid);
  }
  run(o, 0, children);
  for (pid_t c : children) waitpid(c, nullptr, 0);
  return 0;
}
