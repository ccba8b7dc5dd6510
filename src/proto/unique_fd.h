// An owned file descriptor: closed exactly once, when its owner goes away.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

namespace cusnap {

/// Owns one descriptor (or none: -1). Move-only; closes on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  /// Gives up ownership without closing.
  int release() { return std::exchange(fd_, -1); }
  /// Closes the current descriptor (if any) and takes fd.
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);  // close is not retried on EINTR on Linux
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

/// What to do about errno e when it says descriptors ran out (EMFILE: this
/// process's limit; ENFILE: the system's), with a leading space; empty for
/// any other error.
inline std::string descriptor_remedy(int e) {
  if (e == EMFILE) {
    rlimit lim{};
    const std::string n = ::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY
                              ? std::to_string(lim.rlim_cur) + " "
                              : "";
    return " (this process reached its limit of " + n +
           "open files: raise \"ulimit -n\" for the cusnap command)";
  }
  if (e == ENFILE) return " (the system's limit of open files is reached: see fs.file-max)";
  return "";
}

/// Whether errno e says descriptors ran out (EMFILE or ENFILE): a remedy
/// descriptor_remedy gives, where another cause's advice would mislead.
inline bool out_of_descriptors(int e) {
  return e == EMFILE || e == ENFILE;
}

/// "WHAT: strerror(e)", with what to do when descriptors ran out
/// (descriptor_remedy).
inline std::string errno_message(const std::string& what, int e) {
  return what + ": " + std::strerror(e) + descriptor_remedy(e);
}

/// A pipe whose ends are owned from the start (pipe2 with flags, O_CLOEXEC
/// always); false and *err ("WHAT: strerror", and what to do when
/// descriptors ran out) when the kernel refuses one.
inline bool make_pipe(UniqueFd* read_end, UniqueFd* write_end, int flags, const char* what,
                      std::string* err) {
  int p[2];
  if (::pipe2(p, flags | O_CLOEXEC) != 0) {
    const int e = errno;
    *err = errno_message(what, e);
    return false;
  }
  read_end->reset(p[0]);
  write_end->reset(p[1]);
  return true;
}

/// Writes all n bytes to fd, through EINTR, short writes and EAGAIN (a
/// descriptor someone made non-blocking: waits until it takes more). False
/// when the write fails (errno says why, EIO for a write that took nothing),
/// a reader that went away included.
inline bool write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pf{fd, POLLOUT, 0};
      ::poll(&pf, 1, 1000);
      continue;
    }
    if (w == 0) errno = EIO;  // no error of its own: errno is stale
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace cusnap
