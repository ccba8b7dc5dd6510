// The echo of a job's output to the supervisor's own stdout and stderr, from
// a thread of its own. A reader that stops reading (a terminal paused with
// Ctrl-S, a pager at a full page, a pipe nobody drains) then stalls only the
// echo: the supervisor's loop goes on forwarding signals, reaping and
// serving, and stops reading the job's pipes once the echo holds `capacity`
// bytes, so the job is held back exactly as if it wrote to that reader
// itself. Internal to src/coord.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace cusnap {

class OutputEcho {
 public:
  /// wake_fd: an eventfd the echo writes to when it has room again (the
  /// loop polls it); -1 for none.
  OutputEcho(int wake_fd, size_t capacity);
  ~OutputEcho();  // finish()
  OutputEcho(const OutputEcho&) = delete;
  OutputEcho& operator=(const OutputEcho&) = delete;

  /// Starts the writer thread. False (with *err) if it cannot be created:
  /// push() then writes in the caller's thread, as a blocking echo.
  bool start(std::string* err);
  /// Queues n bytes for fd, in order with everything queued before. Data for
  /// a descriptor whose reader went away (EPIPE and the like) is dropped.
  void push(int fd, const char* p, size_t n);
  /// True while the queue holds capacity bytes or more: read no more for now.
  bool full() const;
  /// True once writing to fd failed: the echo to fd has ended.
  bool failed(int fd) const;
  /// Writes out everything queued (for as long as its reader takes) and
  /// ends the thread.
  void finish();

 private:
  struct Chunk {
    int fd;
    std::string data;
  };
  void writer();
  void mark_failed(int fd);

  const int wake_fd_;
  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Chunk> queue_;
  size_t queued_ = 0;  // bytes in queue_ and in the chunk being written
  bool closing_ = false;
  std::vector<int> failed_;  // descriptors whose reader went away
  std::thread thread_;
};

}  // namespace cusnap
