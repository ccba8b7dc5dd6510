// Bulk copies through pinned staging buffers (track_copy.h).
//
// Device to file: chunk i is copied into buffer i % kBuffers on that buffer's
// stream; before a buffer is reused its stream is synchronized and its chunk
// written out, in chunk order, while the copies of the following chunks are
// still running. File to device: chunk i is read into its buffer (after that
// buffer's previous copy finished) and its copy is queued, so reading overlaps
// the copies queued before it.
#include "shim/track_copy.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "shim/real_driver.h"

#define REAL(name) reinterpret_cast<decltype(&::name)>(real_entry(index_of(Entry::name)))

namespace cusnap::shim::track {

namespace {

constexpr int kBuffers = 4;

uint64_t chunk_bytes() {
  static const uint64_t mib = [] {
    const char* e = std::getenv("CUSNAP_SHIM_STAGING_MIB");
    char* end = nullptr;
    unsigned long v = e ? std::strtoul(e, &end, 10) : 0;
    return (e && end && *end == 0 && v >= 1 && v <= 1024) ? v : 64ul;
  }();
  return mib << 20;
}

std::string driver_error(const char* call, CUresult r) {
  const char* name = nullptr;
  if (auto f = REAL(cuGetErrorName)) f(r, &name);
  return std::string(call) + " failed: " + (name ? name : "CUDA error " + std::to_string(r));
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

/// The staging buffers and streams of one copy; freed by the destructor.
class Staging {
 public:
  explicit Staging(uint64_t size) {
    chunk_ = size < chunk_bytes() ? size : chunk_bytes();
    if (chunk_ == 0) chunk_ = 1;
    auto host_alloc = REAL(cuMemHostAlloc);
    auto stream_create = REAL(cuStreamCreate);
    pinned_ = host_alloc && stream_create && REAL(cuStreamSynchronize) &&
              REAL(cuMemcpyDtoHAsync_v2) && REAL(cuMemcpyHtoDAsync_v2);
    for (int i = 0; i < kBuffers && pinned_; ++i) {
      if (host_alloc(&buf_[i], chunk_, 0) != CUDA_SUCCESS) buf_[i] = nullptr, pinned_ = false;
      if (pinned_ && stream_create(&stream_[i], CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
        stream_[i] = nullptr, pinned_ = false;
    }
    if (!pinned_) {
      free_all();
      for (int i = 0; i < kBuffers; ++i) buf_[i] = std::malloc(chunk_);
    }
  }
  ~Staging() { free_all(); }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  bool ok() const {
    for (int i = 0; i < kBuffers; ++i)
      if (!buf_[i]) return false;
    return true;
  }
  bool pinned() const { return pinned_; }
  uint64_t chunk() const { return chunk_; }
  void* buf(int i) const { return buf_[i]; }
  CUstream stream(int i) const { return stream_[i]; }

 private:
  void free_all() {
    auto free_host = REAL(cuMemFreeHost);
    auto destroy = REAL(cuStreamDestroy_v2);
    for (int i = 0; i < kBuffers; ++i) {
      if (stream_[i] && destroy) destroy(stream_[i]);
      stream_[i] = nullptr;
      if (buf_[i]) {
        if (pinned_ && free_host)
          free_host(buf_[i]);
        else if (!pinned_)
          std::free(buf_[i]);
      }
      buf_[i] = nullptr;
    }
  }

  uint64_t chunk_ = 0;
  bool pinned_ = false;
  void* buf_[kBuffers] = {};
  CUstream stream_[kBuffers] = {};
};

}  // namespace

CUresult copy_to_fd(CUdeviceptr src, uint64_t size, int fd, std::string* err) noexcept {
  try {
    Staging st(size);
    if (!st.ok()) {
      *err = "no memory for the staging buffers";
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (::ftruncate(fd, 0) != 0 && errno != EINVAL) {
      *err = std::string("truncating the saved-bytes file: ") + std::strerror(errno);
      return CUDA_ERROR_UNKNOWN;
    }
    const uint64_t chunk = st.chunk();
    const uint64_t n = (size + chunk - 1) / chunk;
    if (!st.pinned()) {
      auto copy = REAL(cuMemcpyDtoH_v2);
      if (!copy) return CUDA_ERROR_NOT_SUPPORTED;
      for (uint64_t i = 0; i < n; ++i) {
        uint64_t off = i * chunk, len = size - off < chunk ? size - off : chunk;
        if (CUresult r = copy(st.buf(0), src + off, len); r != CUDA_SUCCESS) {
          *err = driver_error("cuMemcpyDtoH", r);
          return r;
        }
        if (!write_all(fd, st.buf(0), len, off, err)) return CUDA_ERROR_UNKNOWN;
      }
      return CUDA_SUCCESS;
    }
    auto copy = REAL(cuMemcpyDtoHAsync_v2);
    auto sync = REAL(cuStreamSynchronize);
    // Waits for chunk j's copy and writes it out.
    auto flush = [&](uint64_t j) -> CUresult {
      const int b = static_cast<int>(j % kBuffers);
      uint64_t off = j * chunk, len = size - off < chunk ? size - off : chunk;
      if (CUresult r = sync(st.stream(b)); r != CUDA_SUCCESS) {
        *err = driver_error("cuStreamSynchronize", r);
        return r;
      }
      return write_all(fd, st.buf(b), len, off, err) ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
    };
    uint64_t flushed = 0;
    CUresult result = CUDA_SUCCESS;
    for (uint64_t i = 0; i < n && result == CUDA_SUCCESS; ++i) {
      if (i >= kBuffers) result = flush(flushed++);
      if (result != CUDA_SUCCESS) break;
      const int b = static_cast<int>(i % kBuffers);
      uint64_t off = i * chunk, len = size - off < chunk ? size - off : chunk;
      if (CUresult r = copy(st.buf(b), src + off, len, st.stream(b)); r != CUDA_SUCCESS) {
        *err = driver_error("cuMemcpyDtoHAsync", r);
        result = r;
      } else if (i + 1 == n) {
        while (flushed < n && result == CUDA_SUCCESS) result = flush(flushed++);
      }
    }
    // Never leave a copy running into buffers about to be freed.
    for (int b = 0; b < kBuffers; ++b) sync(st.stream(b));
    return result;
  } catch (...) {
    *err = "out of memory";
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
}

CUresult copy_from_fd(int fd, CUdeviceptr dst, uint64_t size, std::string* err) noexcept {
  try {
    Staging st(size);
    if (!st.ok()) {
      *err = "no memory for the staging buffers";
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    const uint64_t chunk = st.chunk();
    const uint64_t n = (size + chunk - 1) / chunk;
    if (!st.pinned()) {
      auto copy = REAL(cuMemcpyHtoD_v2);
      if (!copy) return CUDA_ERROR_NOT_SUPPORTED;
      for (uint64_t i = 0; i < n; ++i) {
        uint64_t off = i * chunk, len = size - off < chunk ? size - off : chunk;
        if (!read_all(fd, st.buf(0), len, off, err)) return CUDA_ERROR_UNKNOWN;
        if (CUresult r = copy(dst + off, st.buf(0), len); r != CUDA_SUCCESS) {
          *err = driver_error("cuMemcpyHtoD", r);
          return r;
        }
      }
      return CUDA_SUCCESS;
    }
    auto copy = REAL(cuMemcpyHtoDAsync_v2);
    auto sync = REAL(cuStreamSynchronize);
    CUresult result = CUDA_SUCCESS;
    for (uint64_t i = 0; i < n && result == CUDA_SUCCESS; ++i) {
      const int b = static_cast<int>(i % kBuffers);
      uint64_t off = i * chunk, len = size - off < chunk ? size - off : chunk;
      if (i >= kBuffers) {
        if (CUresult r = sync(st.stream(b)); r != CUDA_SUCCESS) {
          *err = driver_error("cuStreamSynchronize", r);
          result = r;
          break;
        }
      }
      if (!read_all(fd, st.buf(b), len, off, err)) {
        result = CUDA_ERROR_UNKNOWN;
        break;
      }
      if (CUresult r = copy(dst + off, st.buf(b), len, st.stream(b)); r != CUDA_SUCCESS) {
        *err = driver_error("cuMemcpyHtoDAsync", r);
        result = r;
      }
    }
    for (int b = 0; b < kBuffers; ++b)
      if (CUresult r = sync(st.stream(b)); r != CUDA_SUCCESS && result == CUDA_SUCCESS) {
        *err = driver_error("cuStreamSynchronize", r);
        result = r;
      }
    return result;
  } catch (...) {
    *err = "out of memory";
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
}

}  // namespace cusnap::shim::track
