// Bulk copies between device memory and files (track_copy.h).
//
// Several workers (the calling thread and temporary threads, which inherit
// its blocked signals) take chunks in turn, across the parts. A chunk is one
// window of one part file. Direct path: the worker maps the window, registers
// it and queues its DMA on the worker's stream; then maps and registers the
// next window it takes, waits for the DMA of the first, unregisters and
// unmaps it, and queues the next: registration (page faults, pinning) of one
// window overlaps the DMA of another, and the streams of several workers keep
// the copy engines busy. Staging path (off, or a window the direct path could
// not map or register): the worker's pinned buffer, reused for every chunk it
// takes: copy, wait, write (or read, copy, wait). The settings, the file I/O
// and the direct path's part files and windows: track_copy_files.cpp.
#include "shim/track_copy.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "shim/real_driver.h"
#include "shim/track_copy_internal.h"
#include "shim/track_state.h"

namespace cusnap::shim::track {

namespace {

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

/// A worker's stream for the direct path.
class Stream {
 public:
  Stream() {
    auto create = REAL(cuStreamCreate);
    if (!create || create(&s_, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) s_ = nullptr;
  }
  ~Stream() {
    if (s_)
      if (auto destroy = REAL(cuStreamDestroy_v2)) destroy(s_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  CUstream get() const { return s_; }

 private:
  CUstream s_ = nullptr;
};

/// A range of one part: [in_part, in_part + len) of file `part`, device
/// offset off.
struct Piece {
  size_t part = 0;
  uint64_t in_part = 0;
  uint64_t off = 0;
  uint64_t len = 0;
};

/// [0, size) split into `parts` parts, each into pieces of at most `chunk`
/// bytes, in the order the workers take them: across the parts in turn, so
/// workers running at the same time use different files.
std::vector<Piece> pieces_of(uint64_t size, size_t parts, uint64_t chunk) {
  std::vector<Piece> out;
  const uint64_t per = part_bytes(size, parts);
  const uint64_t per_chunks = (per + chunk - 1) / chunk;
  for (uint64_t j = 0; j < per_chunks * parts; ++j) {
    Piece p;
    p.part = static_cast<size_t>(j % parts);
    p.in_part = (j / parts) * chunk;
    p.off = p.part * per + p.in_part;
    if (p.in_part >= per || p.off >= size) continue;
    p.len = chunk;
    if (p.len > per - p.in_part) p.len = per - p.in_part;
    if (p.len > size - p.off) p.len = size - p.off;
    out.push_back(p);
  }
  return out;
}

/// The pieces split again into pieces of at most `chunk` bytes.
std::vector<Piece> split(const std::vector<Piece>& in, uint64_t chunk) {
  std::vector<Piece> out;
  for (const Piece& p : in)
    for (uint64_t d = 0; d < p.len; d += chunk)
      out.push_back({p.part, p.in_part + d, p.off + d, p.len - d < chunk ? p.len - d : chunk});
  return out;
}

/// What the copy is: its direction, its parts, and the direct path's state.
struct Job {
  bool save = false;
  CUdeviceptr dev = 0;  ///< the device address of byte 0
  uint64_t size = 0;
  const std::vector<int>* fds = nullptr;
  DirectMode mode = DirectMode::kAuto;
  bool read_only_flag = false;       ///< load: register with CU_MEMHOSTREGISTER_READ_ONLY
  std::vector<PartFile> files;       ///< direct path only
  std::atomic<bool> refused{false};  ///< the direct path was refused: stage the rest
  std::atomic<uint64_t> direct_windows{0};
  std::atomic<uint64_t> staged_chunks{0};
  std::mutex mu;
  std::string refusal;         ///< the first reason
  std::vector<Piece> leftover;  ///< windows for the staging path
};

/// Notes that the direct path was refused (the first reason is kept) and
/// leaves the window to the staging path.
void refuse(Job& job, const Piece& p, const std::string& why) {
  std::lock_guard<std::mutex> l(job.mu);
  if (job.refusal.empty()) job.refusal = why;
  job.refused.store(true);
  job.leftover.push_back(p);
}

/// A direct worker: a stream and the window whose DMA is in flight.
struct DirectWorker {
  Job& job;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<Window> inflight;

  /// Waits for the in-flight window's DMA and drops the window.
  CUresult retire(std::string* why) {
    if (!inflight) return CUDA_SUCCESS;
    CUresult r = inflight->wait();
    inflight.reset();
    if (r != CUDA_SUCCESS) *why = driver_error("cuStreamSynchronize", r);
    return r;
  }

  /// One window: mapped and registered (while the previous window's DMA
  /// runs), then its DMA queued. Where the direct path is refused (auto), the
  /// window and every later one go to job.leftover.
  CUresult one(const Piece& p, std::string* why) {
    std::unique_ptr<Window> w;
    if (!job.refused.load()) {
      std::string no;
      const PartFile& f = job.files[p.part];
      if (!f.refused.empty()) {
        no = f.refused;
      } else {
        if (!stream) stream = std::make_unique<Stream>();
        if (!stream->get()) no = "cuStreamCreate failed";
      }
      if (no.empty() && !job.save && f.size < p.in_part + p.len)
        no = "the file is shorter than its part";  // the staging path names it: truncated
      if (no.empty()) {
        w = std::make_unique<Window>();
        if (!w->open(f, p.in_part, p.len, job.save || !job.read_only_flag, job.read_only_flag,
                     job.save, &no))
          w.reset();
      }
      if (!w) {
        if (job.mode == DirectMode::kOn) {
          std::string ignored;
          retire(&ignored);
          *why = "direct I/O (CUSNAP_SHIM_DIRECT_IO=on): " + no;
          return CUDA_ERROR_NOT_SUPPORTED;
        }
        refuse(job, p, no);
      }
    } else {
      refuse(job, p, std::string());
    }
    // The previous window's DMA ran while this one was mapped and registered.
    if (CUresult r = retire(why); r != CUDA_SUCCESS) return r;
    if (!w) return CUDA_SUCCESS;
    CUresult r = job.save
                     ? REAL(cuMemcpyDtoHAsync_v2)(w->addr(), job.dev + p.off, p.len, stream->get())
                     : REAL(cuMemcpyHtoDAsync_v2)(job.dev + p.off, w->addr(), p.len, stream->get());
    if (r != CUDA_SUCCESS) {
      *why = driver_error(job.save ? "cuMemcpyDtoHAsync" : "cuMemcpyHtoDAsync", r);
      return r;  // w's destructor unregisters and unmaps
    }
    w->queued_on(stream->get());
    inflight = std::move(w);
    job.direct_windows.fetch_add(1);
    return CUDA_SUCCESS;
  }
};

/// Runs fn(worker state, piece, &why) over the pieces on up to
/// worker_count() workers (the calling thread and temporary threads), each
/// with the calling thread's context current and its own state made by
/// make(&state_ok, &why). Pieces are taken in order. The first failure stops
/// the others and is returned.
template <class Make, class Fn>
CUresult run_pieces(const std::vector<Piece>& pieces, std::string* err, Make make, Fn fn) {
  if (pieces.empty()) return CUDA_SUCCESS;
  CUcontext ctx = nullptr;
  if (auto get = REAL(cuCtxGetCurrent)) get(&ctx);
  const unsigned workers = static_cast<unsigned>(
      pieces.size() < worker_count() ? pieces.size() : worker_count());
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  CUresult result = CUDA_SUCCESS;
  // A worker's body lets nothing out (a worker thread's exception would end
  // the process): a failure, allocation included, is the copy's failure.
  auto work = [&]() noexcept {
    std::string why;
    CUresult r = CUDA_SUCCESS;
    if (auto set = REAL(cuCtxSetCurrent)) set(ctx);
    try {
      auto st = make(&r, &why);
      while (r == CUDA_SUCCESS && !stop.load(std::memory_order_relaxed)) {
        size_t j = next.fetch_add(1);
        if (j >= pieces.size()) break;
        r = fn(*st, pieces[j], &why);
      }
      st.reset();  // waits for what it queued
    } catch (...) {
      r = CUDA_ERROR_OUT_OF_MEMORY;
      why = "out of memory";  // within the string's own buffer: no allocation
    }
    if (auto set = REAL(cuCtxSetCurrent)) set(nullptr);
    if (r != CUDA_SUCCESS) {
      stop.store(true);
      std::lock_guard<std::mutex> l(mu);
      if (result == CUDA_SUCCESS) {
        result = r;
        *err = std::move(why);  // a move: no allocation
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

/// The direct pass over every window; what it leaves goes to job.leftover.
CUresult run_direct(Job& job, std::string* err) {
  auto pieces = pieces_of(job.size, job.fds->size(), window_bytes());
  return run_pieces(
      pieces, err,
      [&](CUresult*, std::string*) {
        return std::make_unique<DirectWorker>(DirectWorker{job, nullptr, nullptr});
      },
      [&](DirectWorker& w, const Piece& p, std::string* why) {
        CUresult r = w.one(p, why);
        if (r == CUDA_SUCCESS) return r;
        std::string ignored;
        w.retire(&ignored);
        return r;
      });
}

/// The staging pass over the pieces.
CUresult run_staged(Job& job, const std::vector<Piece>& pieces, std::string* err) {
  const uint64_t chunk = chunk_bytes();
  return run_pieces(
      pieces, err,
      [&](CUresult* r, std::string* why) {
        auto st = std::make_unique<Staging>(job.size < chunk ? job.size : chunk);
        if (!st->ok()) {
          *r = CUDA_ERROR_OUT_OF_MEMORY;
          *why = "no memory for a staging buffer";
        }
        return st;
      },
      [&](Staging& st, const Piece& p, std::string* why) {
        const int fd = (*job.fds)[p.part];
        CUresult r;
        if (job.save) {
          r = st.from_device(job.dev + p.off, p.len, why);
          if (r == CUDA_SUCCESS && !write_all(fd, st.buf(), p.len, p.in_part, why))
            r = CUDA_ERROR_UNKNOWN;
        } else {
          r = read_all(fd, st.buf(), p.len, p.in_part, why) ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
          if (r == CUDA_SUCCESS) r = st.to_device(job.dev + p.off, p.len, why);
        }
        if (r == CUDA_SUCCESS) job.staged_chunks.fetch_add(1);
        return r;
      });
}

/// Whether the current context's device can register memory read-only.
bool read_only_register_supported() {
  auto get_dev = REAL(cuCtxGetDevice);
  auto attr = REAL(cuDeviceGetAttribute);
  CUdevice dev = 0;
  int v = 0;
  return get_dev && attr && get_dev(&dev) == CUDA_SUCCESS &&
         attr(&v, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, dev) == CUDA_SUCCESS &&
         v != 0;
}

/// Prepares the direct path of a copy (files, flags), runs it, and reports.
CUresult run_copy(Job& job, std::string* err) {
  const auto t0 = std::chrono::steady_clock::now();
  if (job.mode != DirectMode::kOff) {
    bool need_write = job.save;
    if (!job.save) {
      job.read_only_flag = read_only_register_supported();
      need_write = !job.read_only_flag;  // a writable mapping, registered read-write
    }
    const bool shmem_only = job.save && job.mode == DirectMode::kAuto;
    job.files.resize(job.fds->size());
    for (size_t k = 0; k < job.fds->size(); ++k)
      prepare_part((*job.fds)[k], need_write, shmem_only, &job.files[k]);
  }
  CUresult r = CUDA_SUCCESS;
  if (job.mode == DirectMode::kOff) {
    r = run_staged(job, pieces_of(job.size, job.fds->size(), chunk_bytes()), err);
  } else {
    r = run_direct(job, err);
    if (r == CUDA_SUCCESS && !job.leftover.empty()) {
      std::vector<Piece> rest;
      {
        std::lock_guard<std::mutex> l(job.mu);
        rest.swap(job.leftover);
      }
      r = run_staged(job, split(rest, chunk_bytes()), err);
    }
  }
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const uint64_t direct = job.direct_windows.load(), staged = job.staged_chunks.load();
  if (job.refused.load())
    debug_log(job.save ? "save: direct I/O refused, copying through the staging buffers"
                       : "load: direct I/O refused, copying through the staging buffers",
              job.refusal.c_str());
  if (const char* path = std::getenv("CUSNAP_SHIM_COPY_LOG"); path && *path) {
    const char* way = direct && staged ? "mixed" : direct ? "direct" : staged ? "staging" : "none";
    char line[768];
    int len = std::snprintf(
        line, sizeof line,
        "%s bytes=%llu parts=%zu mode=%s path=%s direct_windows=%llu staged_chunks=%llu "
        "seconds=%.6f gbps=%.3f result=%d%s%s%s%s\n",
        job.save ? "save" : "load", static_cast<unsigned long long>(job.size), job.fds->size(),
        job.mode == DirectMode::kOn ? "on" : job.mode == DirectMode::kOff ? "off" : "auto", way,
        static_cast<unsigned long long>(direct), static_cast<unsigned long long>(staged), s,
        s > 0 ? static_cast<double>(job.size) / s / 1e9 : 0.0, static_cast<int>(r),
        job.refused.load() ? " fell_back=" : "", job.refused.load() ? job.refusal.c_str() : "",
        r != CUDA_SUCCESS ? " error=" : "", r != CUDA_SUCCESS ? err->c_str() : "");
    if (len > 0) {
      if (static_cast<size_t>(len) >= sizeof line) {
        len = sizeof line - 1;
        line[len - 1] = '\n';
      }
      int fd = ::open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
      if (fd >= 0) {
        ssize_t w = ::write(fd, line, static_cast<size_t>(len));
        (void)w;
        ::close(fd);
      }
    }
  }
  return r;
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
    Job job;
    job.save = true;
    job.dev = src;
    job.size = size;
    job.fds = &fds;
    job.mode = direct_mode();
    return run_copy(job, err);
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
    Job job;
    job.save = false;
    job.dev = dst;
    job.size = size;
    job.fds = &fds;
    job.mode = direct_mode();
    return run_copy(job, err);
  } catch (...) {
    *err = "out of memory";
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
}

}  // namespace cusnap::shim::track
