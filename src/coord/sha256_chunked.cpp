#include "coord/sha256_chunked.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>

#include "proto/env_settings.h"
#include "proto/unique_fd.h"

namespace cusnap {

Sha256Digest chunked_root(const std::vector<Sha256Digest>& chunks) {
  Sha256 h;
  for (const Sha256Digest& d : chunks) h.update(d.data(), d.size());
  return h.digest();
}

bool hash_thread_count(unsigned* n, std::string* err) {
  return hash_thread_count(std::getenv("CUSNAP_HASH_THREADS"), n, err);
}

bool hash_thread_count(const char* env, unsigned* n, std::string* err) {
  if (env && *env) {
    uint64_t v = 0;
    if (!proto::parse_whole(env, 1, kMaxHashThreadsEnv, &v)) {
      *err = "CUSNAP_HASH_THREADS=\"" + std::string(env) +
             "\" is not a number of threads from 1 to " + std::to_string(kMaxHashThreadsEnv) +
             " (unset it to use every core)";
      return false;
    }
    *n = unsigned(v);
    return true;
  }
  *n = std::clamp(std::thread::hardware_concurrency(), 1u, kMaxHashThreads);
  return true;
}

namespace {

// Bytes read per pread: small enough to stay in the core's cache between the
// copy and the hash.
constexpr size_t kReadSize = size_t(1) << 20;

struct Task {
  size_t target;  // index into targets
  uint64_t chunk;
  uint64_t offset, length;
};

// Shared by the workers; every field but the atomics is written before they
// start or under mu.
struct Pool {
  Pool(const std::vector<HashTarget>& t, const std::vector<Task>& k, std::vector<ChunkedDigest>& o)
      : targets(t), tasks(k), out(o) {}

  const std::vector<HashTarget>& targets;
  const std::vector<Task>& tasks;
  std::vector<ChunkedDigest>& out;
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> done{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::condition_variable finished_cv;
  unsigned running = 0;   // guarded by mu
  std::string first_err;  // guarded by mu

  void fail(const std::string& what) {
    std::lock_guard<std::mutex> l(mu);
    if (!failed.exchange(true)) first_err = what;
  }

  // Hashes one chunk into out; false after recording an error.
  bool hash_chunk(const Task& t, uint8_t* buf) {
    const std::string& path = targets[t.target].path;
    const UniqueFd file(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!file) {
      fail(path + ": cannot open: " + std::strerror(errno));
      return false;
    }
    const int fd = file.get();
    posix_fadvise(fd, off_t(t.offset), off_t(t.length), POSIX_FADV_SEQUENTIAL);
    Sha256 h;
    uint64_t pos = t.offset, end = t.offset + t.length;
    while (pos < end && !failed) {
      size_t want = size_t(std::min<uint64_t>(kReadSize, end - pos));
      ssize_t n = pread(fd, buf, want, off_t(pos));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        fail(path + ": cannot read at byte " + std::to_string(pos) + ": " + std::strerror(errno));
        break;
      }
      if (n == 0) {
        fail(path + " ends at byte " + std::to_string(pos) + " while " +
             std::to_string(targets[t.target].size) +
             " were expected: it was truncated while being read");
        break;
      }
      h.update(buf, size_t(n));
      pos += uint64_t(n);
      done += uint64_t(n);
    }
    if (pos < end) return false;
    out[t.target].chunks[t.chunk] = h.digest();
    return true;
  }

  void work() {
    std::unique_ptr<uint8_t[]> buf(new uint8_t[kReadSize]);
    for (size_t i; !failed && (i = next++) < tasks.size();)
      if (!hash_chunk(tasks[i], buf.get())) break;
    std::lock_guard<std::mutex> l(mu);
    if (--running == 0) finished_cv.notify_all();
  }
};

}  // namespace

bool sha256_chunked_files(const std::vector<HashTarget>& targets, const HashOptions& opts,
                          std::vector<ChunkedDigest>* out, std::string* err) {
  unsigned threads = opts.threads;
  if (threads == 0 && !hash_thread_count(&threads, err)) return false;

  out->assign(targets.size(), ChunkedDigest{});
  std::vector<Task> tasks;
  for (size_t i = 0; i < targets.size(); ++i) {
    const HashTarget& t = targets[i];
    if (!valid_chunk_size(t.chunk_size)) {
      *err = t.path + ": chunk size " + std::to_string(t.chunk_size) +
             " is not a power of two from " + std::to_string(kMinHashChunkSize) + " to " +
             std::to_string(kMaxHashChunkSize);
      return false;
    }
    uint64_t n = chunk_count(t.size, t.chunk_size);
    (*out)[i].chunks.resize(n);
    for (uint64_t c = 0; c < n; ++c) {
      uint64_t off = c * t.chunk_size;
      tasks.push_back(Task{i, c, off, std::min(t.chunk_size, t.size - off)});
    }
  }
  // Largest first: the many small files of a checkpoint fill the gaps at the
  // end instead of one big chunk running alone.
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const Task& a, const Task& b) { return a.length > b.length; });

  Pool pool(targets, tasks, *out);
  threads = unsigned(std::min<size_t>(threads, tasks.size()));
  pool.running = threads;
  std::vector<std::thread> workers;
  workers.reserve(threads);
  for (unsigned i = 0; i < threads; ++i) {
    try {
      workers.emplace_back([&pool] { pool.work(); });
    } catch (const std::system_error&) {
      // Out of threads: go on with those there are, or on this one.
      std::lock_guard<std::mutex> l(pool.mu);
      pool.running -= threads - i;
      break;
    }
  }
  if (workers.empty() && threads > 0) {
    pool.running = 1;
    pool.work();
  }
  {
    std::unique_lock<std::mutex> l(pool.mu);
    while (pool.running > 0) {
      if (!opts.progress && !opts.cancelled) {
        pool.finished_cv.wait(l);
        continue;
      }
      if (!pool.finished_cv.wait_for(l, std::chrono::milliseconds(200),
                                     [&] { return pool.running == 0; })) {
        // The sink runs unlocked: it may be slow and need not be thread-safe
        // (only this thread calls it).
        l.unlock();
        if (opts.progress) opts.progress(pool.done.load());
        if (opts.cancelled && opts.cancelled()) pool.fail("cancelled");
        l.lock();
      }
    }
  }
  for (std::thread& t : workers) t.join();
  if (opts.progress) opts.progress(pool.done.load());
  if (pool.failed) {
    *err = pool.first_err;
    return false;
  }
  for (ChunkedDigest& d : *out) d.root = chunked_root(d.chunks);
  return true;
}

}  // namespace cusnap
