// The files of the bulk copies (track_copy.h): the tuning settings, the
// reads and writes of the staging path, and the direct path's part files
// (readied for mapping) and windows (mapped and registered). Shared with
// track_copy.cpp through track_copy_internal.h.
#include "shim/track_copy_internal.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "proto/env_settings.h"
#include "shim/fork_table.h"
#include "shim/once.h"
#include "shim/real_driver.h"
#include "shim/track_state.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef CU_MEMHOSTREGISTER_READ_ONLY
#define CU_MEMHOSTREGISTER_READ_ONLY 0x08
#endif

namespace cusnap::shim::track {

uint64_t chunk_bytes() {
  static OnceNumber mib;
  return mib.get([] { return proto::env_number(proto::kShimStagingMib); }) << 20;
}

uint64_t window_bytes() {
  static OnceNumber mib;
  return mib.get([] { return proto::env_number(proto::kShimDirectMib); }) << 20;
}

DirectMode direct_mode() {
  static OnceNumber m;
  return static_cast<DirectMode>(m.get([] {
    const char* e = std::getenv("CUSNAP_SHIM_DIRECT_IO");
    if (e && (std::strcmp(e, "on") == 0 || std::strcmp(e, "1") == 0)) return DirectMode::kOn;
    if (e && std::strcmp(e, "auto") == 0) return DirectMode::kAuto;
    // Unset, "off" or anything else: staging. On an H200 (driver 580) the
    // direct path lost to it: cuMemHostRegister is the bound (track_copy.h).
    return DirectMode::kOff;
  }));
}

bool write_all(int fd, const void* p, uint64_t n, uint64_t off, std::string* err) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::pwrite(fd, c, n, static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      *err =
          std::string("writing the saved bytes: ") + (w < 0 ? std::strerror(errno) : "no progress");
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

unsigned worker_count() {
  static OnceNumber n;
  return static_cast<unsigned>(n.get([] {
    if (const uint64_t v = proto::env_number(proto::kShimCopyThreads)) return unsigned(v);
    long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
    return static_cast<unsigned>(cpus >= 16 ? 8 : cpus >= 4 ? cpus / 2 : 1);
  }));
}

// --- the direct path ---------------------------------------------------------

namespace {

bool shmem_magic(unsigned long t) {
  return t == TMPFS_MAGIC || t == HUGETLBFS_MAGIC || t == RAMFS_MAGIC;
}

}  // namespace

void prepare_part(int fd, bool save, bool shmem_only, PartFile* p) {
  p->fd = fd;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    p->refused = std::string("fstat: ") + std::strerror(errno);
    return;
  }
  if (!S_ISREG(st.st_mode)) {
    p->refused = "not a regular file";
    return;
  }
  p->size = static_cast<uint64_t>(st.st_size);
  struct statfs fs {};
  p->shmem = ::fstatfs(fd, &fs) == 0 && shmem_magic(static_cast<unsigned long>(fs.f_type));
  if (shmem_only && !p->shmem) {
    p->refused = "not on tmpfs/shmem (a writable file mapping cannot be pinned safely there)";
    return;
  }
  int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0) {
    p->refused = std::string("fcntl: ") + std::strerror(errno);
    return;
  }
  const int acc = fl & O_ACCMODE;
  const bool enough = save ? acc == O_RDWR : (acc == O_RDONLY || acc == O_RDWR);
  if (enough) return;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  // On tmpfs and the like the open cannot wait: it is made in one step with
  // its entry in the fork table. Elsewhere (a network file system may wait
  // on its server) it holds no lock, and a fork right after it copies it.
  if (!open_listed(path, save ? O_RDWR : O_RDONLY, p->shmem, &p->reopened)) {
    p->refused = std::string("reopening the file with read access: ") + std::strerror(errno);
    return;
  }
  const int again = p->reopened.get();
  struct stat st2 {};
  if (::fstat(again, &st2) != 0 || st2.st_dev != st.st_dev || st2.st_ino != st.st_ino) {
    p->refused = "reopening the file gave another file";
    return;
  }
  p->fd = again;
}

bool Window::open(const PartFile& f, uint64_t off, uint64_t len, bool writable, bool read_only_flag,
                  bool populate, std::string* why) {
  static OnceNumber page_size;
  const uint64_t page = page_size.get([] {
    long p = ::sysconf(_SC_PAGESIZE);
    return static_cast<uint64_t>(p > 0 ? p : 4096);
  });
  len_ = (len + page - 1) / page * page;
  const int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
  void* p = map_unforked(len_, prot, f.fd, static_cast<off_t>(off), f.shmem);
  if (p == MAP_FAILED) {
    *why = std::string("mmap of the file: ") + std::strerror(errno);
    return false;
  }
  addr_ = p;
  // Fault the pages in here, several workers at once, rather than one page
  // at a time inside the driver's registration (three times faster on an
  // H200); no space left is an error here, never a SIGBUS. Kernels before
  // 5.14 lack it (EINVAL): the registration faults them in then.
  if (populate && ::madvise(addr_, len_, MADV_POPULATE_WRITE) != 0 && errno != EINVAL) {
    *why = std::string("faulting in the file's pages: ") + std::strerror(errno);
    close();
    return false;
  }
  auto reg = REAL(cuMemHostRegister_v2);
  if (!reg) reg = REAL(cuMemHostRegister);
  if (!reg || !REAL(cuMemHostUnregister)) {
    *why = "the driver has no cuMemHostRegister";
    close();
    return false;
  }
  CUresult r = reg(addr_, len_, read_only_flag ? CU_MEMHOSTREGISTER_READ_ONLY : 0u);
  if (r != CUDA_SUCCESS) {
    *why = driver_error("cuMemHostRegister", r) + " (a file mapping)";
    close();
    return false;
  }
  registered_ = true;
  return true;
}

CUresult Window::wait() {
  if (!pending_) return CUDA_SUCCESS;
  CUstream s = pending_;
  pending_ = nullptr;
  auto sync = REAL(cuStreamSynchronize);
  return sync ? sync(s) : CUDA_ERROR_NOT_SUPPORTED;
}

void Window::close() {
  // A registration or mapping is never dropped under a running DMA.
  if (pending_) wait();
  if (registered_) {
    if (auto unreg = REAL(cuMemHostUnregister)) unreg(addr_);
    registered_ = false;
  }
  if (addr_) {
    ::munmap(addr_, len_);
    addr_ = nullptr;
  }
}

}  // namespace cusnap::shim::track
