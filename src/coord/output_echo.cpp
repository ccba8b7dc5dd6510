// Output echo (output_echo.h).
#include "coord/output_echo.h"

#include "proto/unique_fd.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <system_error>

namespace cusnap {

OutputEcho::OutputEcho(int wake_fd, size_t capacity) : wake_fd_(wake_fd), capacity_(capacity) {}

OutputEcho::~OutputEcho() {
  finish();
}

bool OutputEcho::start(std::string* err) {
  try {
    thread_ = std::thread([this] { writer(); });
    return true;
  } catch (const std::system_error& e) {
    *err = std::string("no thread for the output echo: ") + e.what();
    return false;
  }
}

void OutputEcho::mark_failed(int fd) {
  if (std::find(failed_.begin(), failed_.end(), fd) == failed_.end()) failed_.push_back(fd);
}

void OutputEcho::push(int fd, const char* p, size_t n) {
  if (n == 0) return;
  std::unique_lock lk(mu_);
  if (std::find(failed_.begin(), failed_.end(), fd) != failed_.end()) return;
  if (!thread_.joinable()) {
    // No writer thread: the echo blocks the caller, as it must somewhere.
    lk.unlock();
    if (!write_all(fd, p, n)) {
      lk.lock();
      mark_failed(fd);
    }
    return;
  }
  // Consecutive output for the same descriptor joins the last chunk.
  if (!queue_.empty() && queue_.back().fd == fd && queue_.back().data.size() < (1u << 20))
    queue_.back().data.append(p, n);
  else
    queue_.push_back({fd, std::string(p, n)});
  queued_ += n;
  cv_.notify_one();
}

bool OutputEcho::full() const {
  std::lock_guard lk(mu_);
  return queued_ >= capacity_;
}

bool OutputEcho::failed(int fd) const {
  std::lock_guard lk(mu_);
  return std::find(failed_.begin(), failed_.end(), fd) != failed_.end();
}

void OutputEcho::writer() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return closing_ || !queue_.empty(); });
    if (queue_.empty()) return;  // closing, and everything written
    Chunk c = std::move(queue_.front());
    queue_.pop_front();
    lk.unlock();
    const bool ok = write_all(c.fd, c.data.data(), c.data.size());
    lk.lock();
    const bool was_full = queued_ >= capacity_;
    queued_ -= c.data.size();
    if (!ok) {
      // The reader went away: what was queued for it is dropped too.
      mark_failed(c.fd);
      for (auto it = queue_.begin(); it != queue_.end();) {
        if (it->fd != c.fd) {
          ++it;
          continue;
        }
        queued_ -= it->data.size();
        it = queue_.erase(it);
      }
    }
    if (was_full && queued_ < capacity_ && wake_fd_ >= 0) {
      const uint64_t one = 1;
      if (::write(wake_fd_, &one, sizeof one) < 0) {
      }  // a full counter already wakes the loop
    }
  }
}

void OutputEcho::finish() {
  {
    std::lock_guard lk(mu_);
    closing_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

}  // namespace cusnap
