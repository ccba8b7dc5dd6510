// A descriptor the shim holds for long (the export cache's) with the
// identity of the file it opened: device and inode. An
// application may close every descriptor it did not open itself
// (close_range(3, ~0), a daemon's close-all loop, a forked child tidying up)
// and reuse the numbers; the shim must then neither use nor close what has
// become the application's file, so it checks the identity first. (Files of
// one anonymous inode share it: such a file of the application in a number
// the shim's held would pass. The listening sockets, which CRIU restores as
// new files, are checked by their address instead: listener_is_ours.)
// Async-signal-safe: fstat and close only.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

namespace cusnap::shim {

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
