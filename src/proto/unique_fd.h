// An owned file descriptor: closed exactly once, when its owner goes away.
#pragma once

#include <unistd.h>

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

}  // namespace cusnap
