// Bulk copies through pinned staging buffers (track_copy.h).
//
// Several workers (the calling thread and temporary threads, which inherit
// its blocked signals) take chunks in turn, across the parts; each has its own pinned buffer
// and stream, reused for every chunk it takes: copy, wait, write (or read,
// copy, wait). While one worker writes its chunk the others' copies run, so
// copying overlaps writing and several streams keep the copy engines busy.
#include "shim/track_copy.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "shim/track_state.h"


namespace cusnap::shim::track {

namespace {

uint64_t chunk_bytes() {
  static const uint64_t mib = [] {
    const char* e = std::getenv("CUSNAP_SHIM_STAGING_MIB");
    char* end = nullptr;
    unsigned long v = e ? std::strtoul(e, &end, 10) : 0;
    return (e && end && *end == 0 && v >= 1 && v <= 1024) ? v : 32ul;
  }();
  return mib << 20;
}


bool write_all(int fd, const void* p, uint64_t n, uint64_t off, std::string* err) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::pwrite(fd, c, n, static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      *err = std::string("writing the saved bytes: ") + (w < 0 ? std::strerror(errno) : "no progress");
      return false;
    }
    c += w;
    n -= static_cast<uint64_t>(w);
    off += static_cast<uint64_t>(w);
  }
  return true;
}

bool read_all(int fd, void* p, uint64_t n, uint64_t off, std::string* err) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::pread(fd, c, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      *err = r < 0 ? std::string("reading the saved bytes: ") + std::strerror(errno)
                   : "the saved bytes end early (file truncated)";
      return false;
    }
    c += r;
    n -= static_cast<uint64_t>(r);
    off += static_cast<uint64_t>(r);
  }
  return true;
}

/// One worker's staging: a pinned buffer and a stream (or, where pinned
/// memory cannot be had, a pageable buffer and synchronous copies).
class Staging {
 public:
  explicit Staging(uint64_t chunk) {
    auto host_alloc = REAL(cuMemHostAlloc);
    auto stream_create = REAL(cuStreamCreate);
    pinned_ = host_alloc && stream_create && REAL(cuStreamSynchronize) &&
              REAL(cuMemcpyDtoHAsync_v2) && REAL(cuMemcpyHtoDAsync_v2) &&
              host_alloc(&buf_, chunk, 0) == CUDA_SUCCESS;
    if (pinned_ && stream_create(&stream_, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
      stream_ = nullptr;
      REAL(cuMemFreeHost)(buf_);
      pinned_ = false;
    }
    if (!pinned_) buf_ = std::malloc(chunk);
  }
  ~Staging() {
    if (stream_)
      if (auto destroy = REAL(cuStreamDestroy_v2)) destroy(stream_);
    if (pinned_) {
      if (auto free_host = REAL(cuMemFreeHost)) free_host(buf_);
    } else {
      std::free(buf_);
    }
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  bool ok() const { return buf_ != nullptr; }
  void* buf() const { return buf_; }

  /// Device -> buf_ (len bytes from src), finished when it returns.
  CUresult from_device(CUdeviceptr src, uint64_t len, std::string* err) {
    CUresult r = pinned_ ? REAL(cuMemcpyDtoHAsync_v2)(buf_, src, len, stream_)
                         : REAL(cuMemcpyDtoH_v2)(buf_, src, len);
    if (r == CUDA_SUCCESS && pinned_) r = REAL(cuStreamSynchronize)(stream_);
    if (r != CUDA_SUCCESS) *err = driver_error("cuMemcpyDtoHAsync", r);
    return r;
  }
  /// buf_ -> device, finished when it returns.
  CUresult to_device(CUdeviceptr dst, uint64_t len, std::string* err) {
    CUresult r = pinned_ ? REAL(cuMemcpyHtoDAsync_v2)(dst, buf_, len, stream_)
                         : REAL(cuMemcpyHtoD_v2)(dst, buf_, len);
    if (r == CUDA_SUCCESS && pinned_) r = REAL(cuStreamSynchronize)(stream_);
    if (r != CUDA_SUCCESS) *err = driver_error("cuMemcpyHtoDAsync", r);
    return r;
  }

 private:
  bool pinned_ = false;
  void* buf_ = nullptr;
  CUstream stream_ = nullptr;
};

unsigned worker_count() {
  static const unsigned n = [] {
    const char* e = std::getenv("CUSNAP_SHIM_COPY_THREADS");
    char* end = nullptr;
    unsigned long v = e ? std::strtoul(e, &end, 10) : 0;
    if (e && end && *end == 0 && v >= 1 && v <= 64) return static_cast<unsigned>(v);
    long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
    return static_cast<unsigned>(cpus >= 16 ? 8 : cpus >= 4 ? cpus / 2 : 1);
  }();
  return n;
}

/// Runs one(staging, part, offset in the part, device offset, length) over
/// every chunk of [0, size) split into `parts` parts, on the workers, each
/// with the calling thread's context current. Chunks are handed out across
/// parts in turn, so workers running at the same time use different files.
/// The first failure stops the others and is returned.
template <class Fn>
CUresult run_chunks(uint64_t size, size_t parts, std::string* err, Fn one) {
  CUcontext ctx = nullptr;
  if (auto get = REAL(cuCtxGetCurrent)) get(&ctx);
  const uint64_t chunk = chunk_bytes();
  const uint64_t per = part_bytes(size, parts);
  const uint64_t per_chunks = (per + chunk - 1) / chunk;
  const uint64_t n = per_chunks * parts;
  uint64_t real_chunks = (size + chunk - 1) / chunk;
  const unsigned workers =
      static_cast<unsigned>(real_chunks < worker_count() ? real_chunks : worker_count());
  std::atomic<uint64_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  CUresult result = CUDA_SUCCESS;
  auto work = [&] {
    std::string why;
    CUresult r = CUDA_SUCCESS;
    if (auto set = REAL(cuCtxSetCurrent)) set(ctx);
    {
      Staging st(size < chunk ? size : chunk);
      if (!st.ok()) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        why = "no memory for a staging buffer";
      }
      while (r == CUDA_SUCCESS && !stop.load(std::memory_order_relaxed)) {
        uint64_t j = next.fetch_add(1);
        if (j >= n) break;
        const size_t part = static_cast<size_t>(j % parts);
        const uint64_t in_part = (j / parts) * chunk;
        const uint64_t off = part * per + in_part;
        if (in_part >= per || off >= size) continue;
        uint64_t len = chunk;
        if (len > per - in_part) len = per - in_part;
        if (len > size - off) len = size - off;
        r = one(st, part, in_part, off, len, &why);
      }
    }
    if (auto set = REAL(cuCtxSetCurrent)) set(nullptr);
    if (r != CUDA_SUCCESS) {
      stop.store(true);
      std::lock_guard<std::mutex> l(mu);
      if (result == CUDA_SUCCESS) {
        result = r;
        *err = why;
      }
    }
  };
  std::vector<std::thread> threads;
  for (unsigned w = 1; w < workers; ++w) {
    try {
      threads.emplace_back(work);
    } catch (...) {
      break;  // fewer workers: slower, same result
    }
  }
  work();
  for (auto& t : threads) t.join();
  if (auto set = REAL(cuCtxSetCurrent)) set(ctx);
  return result;
}

}  // namespace

uint64_t part_bytes(uint64_t size, size_t parts) noexcept {
  if (parts <= 1) return size;
  // Whole 2 MiB granules, whatever the staging size: the layout of saved
  // files never depends on a tuning variable.
  constexpr uint64_t kGranule = 2ull << 20;
  uint64_t per = (size + parts - 1) / parts;
  return (per + kGranule - 1) / kGranule * kGranule;
}

CUresult copy_to_fds(CUdeviceptr src, uint64_t size, const std::vector<int>& fds,
                     std::string* err) noexcept {
  try {
    if (fds.empty()) {
      *err = "no file to write";
      return CUDA_ERROR_INVALID_VALUE;
    }
    const uint64_t per = part_bytes(size, fds.size());
    for (size_t k = 0; k < fds.size(); ++k) {
      uint64_t start = k * per, len = start >= size ? 0 : (size - start < per ? size - start : per);
      if (::ftruncate(fds[k], static_cast<off_t>(len)) != 0 && errno != EINVAL) {
        *err = std::string("sizing the saved-bytes file: ") + std::strerror(errno);
        return CUDA_ERROR_UNKNOWN;
      }
    }
    return run_chunks(size, fds.size(), err,
                      [&](Staging& st, size_t part, uint64_t in_part, uint64_t off, uint64_t len,
                          std::string* why) {
                        CUresult r = st.from_device(src + off, len, why);
                        if (r == CUDA_SUCCESS && !write_all(fds[part], st.buf(), len, in_part, why))
                          r = CUDA_ERROR_UNKNOWN;
                        return r;
                      });
  } catch (...) {
    *err = "out of memory";
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
}

CUresult copy_from_fds(const std::vector<int>& fds, CUdeviceptr dst, uint64_t size,
                       std::string* err) noexcept {
  try {
    if (fds.empty()) {
      *err = "no file to read";
      return CUDA_ERROR_INVALID_VALUE;
    }
    return run_chunks(size, fds.size(), err,
                      [&](Staging& st, size_t part, uint64_t in_part, uint64_t off, uint64_t len,
                          std::string* why) {
                        if (!read_all(fds[part], st.buf(), len, in_part, why))
                          return CUDA_ERROR_UNKNOWN;
                        return st.to_device(dst + off, len, why);
                      });
  } catch (...) {
    *err = "out of memory";
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
}

}  // namespace cusnap::shim::track
