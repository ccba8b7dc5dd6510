#include "coord/restore_watch.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "coord/supervisor_loop.h"

namespace cusnap {
namespace {

/// A fixed buffer the watch's message is put together in (no allocation).
struct Text {
  char buf[4096];
  size_t len = 0;
  void put(const char* s, size_t n) {
    for (size_t i = 0; i < n && len < sizeof buf; ++i) buf[len++] = s[i];
  }
  void put(const char* s) { put(s, std::strlen(s)); }
  void put(unsigned long long v) {
    char d[24];
    size_t n = 0;
    do d[n++] = char('0' + v % 10);
    while ((v /= 10) != 0);
    while (n > 0) put(&d[--n], 1);
  }
};

void sleep_ms(long ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/// The watch process: waits for the restoring process to dismiss it or to
/// die (its pipe's end closes); then ends the checkpoint's processes that
/// were restored since it began. Async-signal-safe calls only.
[[noreturn]] void watch_main(int r, const pid_t* pids, size_t n, const char* dir) {
  SupervisorLoop::reset_signals_in_child();  // none of the supervisor's handlers
  // Out of the terminal's process group: Ctrl-C there must not end the watch.
  ::setsid();
  // Nothing of the restoring process's but stderr and the pipe: not the
  // job's output pipes, the runtime directory's lock or the GPU's files.
  if (r > 3) ::syscall(SYS_close_range, 3U, unsigned(r - 1), 0U);
  ::syscall(SYS_close_range, unsigned(r + 1), ~0U, 0U);
  unsigned long long since = 0;
  if (!live_start_time(::getpid(), &since)) ::_exit(0);
  for (;;) {
    char c;
    const ssize_t got = ::read(r, &c, 1);
    if (got == 1) ::_exit(0);  // dismissed
    if (got < 0 && errno == EINTR) continue;
    break;  // the restoring process is gone
  }
  // CRIU dies with the restoring process; a restored process may still be
  // forking its children for a moment: look again until none is left.
  Text ended;
  size_t count = 0;
  static bool listed[4096];  // which of pids the message names already
  for (int pass = 0; pass < 50; ++pass) {
    size_t found = 0;
    for (size_t i = 0; i < n; ++i) {
      unsigned long long t = 0;
      if (!live_start_time(pids[i], &t) || t < since) continue;
      if (::kill(pids[i], SIGKILL) != 0) continue;
      ++found;
      if (i < sizeof listed && !listed[i]) {
        listed[i] = true;
        ended.put(count++ == 0 ? " " : ", ");
        ended.put(static_cast<unsigned long long>(pids[i]));
      }
    }
    if (found == 0 && pass >= 2) break;
    sleep_ms(100);
  }
  Text msg;
  msg.put("cusnap: the restore of ");
  msg.put(dir);
  msg.put(" ended before the job was back (the restoring process was killed): ");
  if (count > 0) {
    msg.put(count == 1 ? "its restored process" : "its restored processes");
    msg.put(ended.buf, ended.len);
    msg.put(count == 1 ? " was ended" : " were ended");
  } else {
    msg.put("none of its processes was running");
  }
  msg.put("; the checkpoint is unchanged and restores again\n");
  if (::write(2, msg.buf, msg.len) < 0) {
  }
  ::_exit(0);
}

}  // namespace

bool live_start_time(pid_t pid, unsigned long long* out) noexcept {
  char path[48] = "/proc/";
  Text p;
  p.put(path);
  p.put(static_cast<unsigned long long>(pid));
  p.put("/stat");
  if (p.len >= sizeof path) return false;
  std::memcpy(path, p.buf, p.len);
  path[p.len] = 0;
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1024];
  ssize_t n;
  do n = ::read(fd, buf, sizeof buf - 1);
  while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = 0;
  // "pid (comm) S ppid ...": the fields after the last ')' start at 3
  // (state); the start time is field 22.
  const char* s = std::strrchr(buf, ')');
  if (!s || s[1] != ' ' || s[2] == 'Z' || s[2] == 'X') return false;
  s += 2;
  for (int field = 3; field < 22; ++field) {
    s = std::strchr(s, ' ');
    if (!s) return false;
    ++s;
  }
  unsigned long long v = 0;
  if (*s < '0' || *s > '9') return false;
  for (; *s >= '0' && *s <= '9'; ++s) v = v * 10 + unsigned(*s - '0');
  *out = v;
  return true;
}

bool RestoreWatch::start(const std::vector<pid_t>& pids, const std::string& dir, std::string* err) {
  dismiss();
  UniqueFd r, w;
  if (!make_pipe(&r, &w, 0, "restore watch pipe", err)) return false;
  const pid_t pid = ::fork();
  if (pid < 0) {
    *err = std::string("restore watch: fork: ") + std::strerror(errno);
    return false;
  }
  if (pid == 0) watch_main(r.get(), pids.data(), pids.size(), dir.c_str());
  pipe_w_ = std::move(w);
  pid_ = pid;
  return true;
}

void RestoreWatch::dismiss() {
  if (pid_ <= 0) return;
  const char done = 'd';
  if (::write(pipe_w_.get(), &done, 1) < 0) {
  }  // the watch is gone: nothing to tell it
  pipe_w_.reset();
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

}  // namespace cusnap
