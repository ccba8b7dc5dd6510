// A descriptor the shim holds for long (the export cache's) with the
// identity of the file it opened: device and inode. An application may close
// every descriptor it did not open itself (close_range(3, ~0), a daemon's
// close-all loop) and reuse the numbers; the shim must then neither use nor
// close what has become the application's file, so it checks the identity
// first, and keeps its descriptors at high numbers (high_number), which the
// lowest-free rule gives out last. The identity tells the application's
// files and sockets apart, not every file: on the real driver an export is
// an open of /dev/nvidiactl (measured on the H200, 580.159.04), the same
// inode as the driver's own control descriptor, which a driver whose
// descriptors the application closed would open again.
// Async-signal-safe: fstat, fcntl and close only.
#pragma once

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

namespace cusnap::shim {

/// fd moved to a number from the middle of the descriptor limit up (at most
/// 1000), where an application's own opens, lowest number first, seldom
/// reach; fd itself when that fails (closed then, never both kept).
inline int high_number(int fd) noexcept {
  struct rlimit rl;
  if (fd < 0 || ::getrlimit(RLIMIT_NOFILE, &rl) != 0) return fd;
  const rlim_t half = rl.rlim_cur / 2;
  const int base = half > 1000 ? 1000 : static_cast<int>(half);
  if (base <= fd) return fd;
  const int high = ::fcntl(fd, F_DUPFD_CLOEXEC, base);
  if (high < 0) return fd;
  ::close(fd);
  return high;
}

struct HeldFd {
  int fd = -1;
  dev_t dev = 0;
  ino_t ino = 0;

  /// fd as it is now: the file it names is the shim's.
  static HeldFd of(int fd) noexcept {
    HeldFd h;
    struct stat st;
    if (fd >= 0 && ::fstat(fd, &st) == 0) {
      h.fd = fd;
      h.dev = st.st_dev;
      h.ino = st.st_ino;
    }
    return h;
  }
  /// Whether the number still names the file the shim opened.
  bool ours() const noexcept {
    struct stat st;
    return fd >= 0 && ::fstat(fd, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
  }
  /// Closes the descriptor if it is still the shim's; forgets it either way.
  void close_if_ours() noexcept {
    if (ours()) ::close(fd);
    fd = -1;
  }
};

}  // namespace cusnap::shim
