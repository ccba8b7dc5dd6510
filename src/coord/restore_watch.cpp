#include "coord/restore_watch.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "coord/supervisor_loop.h"
#include "proto/decimal.h"
#include "proto/proc_stat.h"
#include "proto/unique_fd.h"

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
    char d[proto::kDecimalMax];
    put(d, proto::format_decimal(v, d));
  }
  /// The text so far, terminated (cut short by one byte when full).
  const char* c_str() {
    buf[len < sizeof buf ? len : sizeof buf - 1] = '\0';
    return buf;
  }
};

/// Calls f(entry, number) for each entry of the directory at path whose name
/// is a decimal number (a pid, a thread or a descriptor; "." and ".." are
/// not), entry holding "path/name" (f may add to it): system calls only, no
/// allocation.
template <typename F>
void each_numbered_entry(const char* path, F&& f) {
  Text entry;
  entry.put(path);
  entry.put("/");
  const size_t base = entry.len;
  const UniqueFd dir(::open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir) return;
  alignas(dirent64) char ents[4096];
  for (long got; (got = ::syscall(SYS_getdents64, dir.get(), ents, sizeof ents)) > 0;)
    for (long at = 0; at < got;) {
      const auto* e = reinterpret_cast<const dirent64*>(ents + at);
      at += e->d_reclen;
      unsigned long long v = 0;
      bool number = e->d_name[0] != '\0';
      for (const char* c = e->d_name; number && *c; ++c) {
        number = *c >= '0' && *c <= '9' && v < 100000000;
        v = v * 10 + static_cast<unsigned long long>(*c - '0');
      }
      if (!number) continue;
      entry.len = base;
      entry.put(e->d_name);
      f(entry, v);
    }
}

void sleep_ms(long ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/// Puts each TCP socket of process pid into repair mode, as CRIU's dump
/// leaves them: a connection then closes with its process without a word
/// (no FIN, no reset) and leaves no socket behind. Past CRIU's network
/// unlock the sockets are out of repair mode; closed the ordinary way, the
/// connections would hold their ports in TIME-WAIT for a minute, in which
/// the next restore, which binds them again, is refused. Listening sockets
/// refuse repair mode and close without that. Through pidfd_getfd; system
/// calls only, no allocation.
void repair_tcp_sockets(pid_t pid) {
  Text dir;
  dir.put("/proc/");
  dir.put(static_cast<unsigned long long>(pid));
  dir.put("/fd");
  const UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd) return;
  each_numbered_entry(dir.c_str(), [&](Text& path, unsigned long long target) {
    constexpr char kSocket[] = "socket:[";
    char link[64];
    const ssize_t n = ::readlink(path.c_str(), link, sizeof link);
    if (n < ssize_t(sizeof kSocket - 1) || std::memcmp(link, kSocket, sizeof kSocket - 1) != 0)
      return;
    const UniqueFd sock(
        static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd.get(), static_cast<int>(target), 0)));
    int protocol = 0;
    socklen_t len = sizeof protocol;
    if (!sock || ::getsockopt(sock.get(), SOL_SOCKET, SO_PROTOCOL, &protocol, &len) != 0 ||
        protocol != IPPROTO_TCP)
      return;
    // Refused for a listening socket, which closes without leaving its
    // port taken.
    const int on = 1;
    (void)::setsockopt(sock.get(), IPPROTO_TCP, TCP_REPAIR, &on, sizeof on);
  });
}

/// Stops pid (SIGSTOP) and waits, 200 ms at most, until it has stopped: a
/// running process may be forking, and its children are listed whole only
/// once it has stopped (proc(5), /proc/PID/task/TID/children); one killed
/// before that would leave its newest child to init. System calls only.
void stop_and_wait(pid_t pid) {
  if (::kill(pid, SIGSTOP) != 0) return;
  for (int i = 0; i < 200; ++i) {
    const char state = proto::proc_state(pid);
    if (state == 0 || state == 'T' || state == 't' || state == 'Z' || state == 'X') return;
    sleep_ms(1);
  }
}

/// The processes below pid started at or after since (forked by the
/// restored job once CRIU let it run on, while the driver restore and the
/// shared rebuild went on), each stopped on sight so that it forks no more,
/// its own children looked for then; at most max, into out. A process of
/// restored (n_restored of them) is neither taken nor walked: its own turn
/// ends it and what is below it. Through /proc/P/task/T/children of every
/// thread; system calls only.
size_t stop_descendants(pid_t pid, uint64_t since, const pid_t* restored, size_t n_restored,
                        pid_t* out, size_t max) {
  size_t found = 0;
  static char kids[4096];
  const auto take = [&](unsigned long long c) {
    uint64_t t = 0;
    if (c == 0 || c > 0x3fffffff || found >= max) return;
    for (size_t m = 0; m < n_restored; ++m)
      if (restored[m] == pid_t(c)) return;
    if (!proto::proc_start_time(pid_t(c), &t, true) || t < since) return;
    stop_and_wait(pid_t(c));
    out[found++] = pid_t(c);
  };
  for (size_t next = 0, parent = pid;; parent = out[next++]) {
    Text dir;
    dir.put("/proc/");
    dir.put(static_cast<unsigned long long>(parent));
    dir.put("/task");
    each_numbered_entry(dir.c_str(), [&](Text& path, unsigned long long) {
      path.put("/children");
      const UniqueFd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
      // A page of entries a read at most: read to the end, a number cut
      // at a read's end carried into the next.
      unsigned long long c = 0;
      bool digit = false;
      for (ssize_t n; f && (n = ::read(f.get(), kids, sizeof kids)) > 0;)
        for (ssize_t i = 0; i < n; ++i) {
          if (kids[i] >= '0' && kids[i] <= '9') {
            c = c * 10 + static_cast<unsigned long long>(kids[i] - '0');
            digit = true;
          } else if (digit) {
            take(c);
            c = 0;
            digit = false;
          }
        }
      if (digit) take(c);
    });
    if (next >= found) return found;
  }
}

/// A temporary directory of the restore, for the watch to remove: split
/// and checked before the fork (the watch allocates nothing).
struct TempDirRef {
  std::string parent, name;
  dev_t dev = 0;
  ino_t ino = 0;
};

// What the restoring process sends the watch, a byte each: dismissed, or
// keep temporary directory i (kKeepTemp + i, i < kMaxTemps).
constexpr char kDismiss = 'd';
constexpr char kKeepTemp = 'A';
constexpr size_t kMaxTemps = 16;

/// Whether name is one of a TempDir of the restoring process's: PREFIX PID
/// "-" XXXXXX (mkdtemp's six letters or digits), PREFIX cusnap-restore- or
/// cusnap-noplugins-, PID the restoring process's.
bool restore_temp_name(const char* name, pid_t restorer) {
  for (const char* prefix : {"cusnap-restore-", "cusnap-noplugins-"}) {
    const size_t n = std::strlen(prefix);
    if (std::strncmp(name, prefix, n) != 0) continue;
    const char* c = name + n;
    unsigned long long pid = 0;
    int digits = 0;
    for (; *c >= '0' && *c <= '9' && digits < 12; ++c, ++digits) pid = pid * 10 + (*c - '0');
    if (digits == 0 || pid != static_cast<unsigned long long>(restorer) || *c++ != '-')
      return false;
    for (int i = 0; i < 6; ++i, ++c)
      if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z')))
        return false;
    return *c == '\0';
  }
  return false;
}

bool dot_or_dotdot(const char* n) {
  return n[0] == '.' && (n[1] == '\0' || (n[1] == '.' && n[2] == '\0'));
}

/// Empties the directory open as fd (device dev): files and links are
/// unlinked (a link is never followed), directories of the same device
/// emptied through openat(O_NOFOLLOW | O_DIRECTORY) and removed, depth
/// levels down at most. True once a pass finds it empty. System calls only,
/// no allocation (one buffer per level, on the stack).
bool empty_dir(int fd, dev_t dev, int depth) {
  constexpr int kMaxDepth = 16;
  alignas(dirent64) char ents[2048];
  // Unlinking while reading may skip an entry: pass again until a pass
  // finds nothing (empty) or removes nothing (what is left stays).
  for (int round = 0; round < 64; ++round) {
    if (::lseek(fd, 0, SEEK_SET) != 0) return false;
    size_t seen = 0, removed = 0;
    for (;;) {
      const long got = ::syscall(SYS_getdents64, fd, ents, sizeof ents);
      if (got < 0) return false;
      if (got == 0) break;
      for (long at = 0; at < got;) {
        const auto* e = reinterpret_cast<const dirent64*>(ents + at);
        at += e->d_reclen;
        if (dot_or_dotdot(e->d_name)) continue;
        ++seen;
        struct stat st;
        if (::fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (!S_ISDIR(st.st_mode)) {
          if (::unlinkat(fd, e->d_name, 0) == 0) ++removed;
          continue;
        }
        if (st.st_dev != dev || depth >= kMaxDepth) continue;  // a mount, or too deep: left
        const int sub = ::openat(fd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0) continue;
        struct stat opened;
        const bool same =
            ::fstat(sub, &opened) == 0 && opened.st_dev == st.st_dev && opened.st_ino == st.st_ino;
        const bool emptied = same && empty_dir(sub, dev, depth + 1);
        ::close(sub);
        if (emptied && ::unlinkat(fd, e->d_name, AT_REMOVEDIR) == 0) ++removed;
      }
    }
    if (seen == 0) return true;
    if (removed == 0) return false;
  }
  return false;
}

/// Removes the restore's temporary directory d (made by process restorer),
/// only while it is that very directory: not a link, ours, named as a
/// TempDir of restorer's, the device and inode recorded before the fork.
/// True when it is removed or already gone. CRIU, which writes its log
/// there, dies with the restoring process; a moment may pass before it has:
/// tried again for a second.
bool remove_temp_dir(const TempDirRef& d, pid_t restorer) {
  if (!restore_temp_name(d.name.c_str(), restorer)) return false;
  const int parent = ::open(d.parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (parent < 0) return false;
  bool done = false;
  for (int attempt = 0; attempt < 10 && !done; ++attempt) {
    if (attempt > 0) sleep_ms(100);
    const int fd =
        ::openat(parent, d.name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      done = errno == ENOENT;
      break;
    }
    struct stat st;
    const bool ours = ::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::geteuid() &&
                      st.st_dev == d.dev && st.st_ino == d.ino;
    if (ours) empty_dir(fd, st.st_dev, 0);
    ::close(fd);
    if (!ours) break;
    // Still that directory under its name (not swapped meanwhile): removed.
    struct stat now;
    if (::fstatat(parent, d.name.c_str(), &now, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISDIR(now.st_mode) || now.st_dev != d.dev || now.st_ino != d.ino)
      break;
    done = ::unlinkat(parent, d.name.c_str(), AT_REMOVEDIR) == 0;
  }
  ::close(parent);
  return done;
}

/// The watch process: waits for the restoring process to dismiss it or to
/// die (its pipe's end closes); then ends the checkpoint's processes that
/// were restored since it began. Async-signal-safe calls only.
[[noreturn]] void watch_main(int r, const pid_t* pids, size_t n, const char* dir, int report,
                             const TempDirRef* temps, size_t n_temps, pid_t restorer) {
  SupervisorLoop::reset_signals_in_child();  // none of the supervisor's handlers
  // Out of the terminal's process group: Ctrl-C there must not end the watch.
  ::setsid();
  if (report != 2 && report >= 0 && report != r) ::dup2(report, 2);
  // Nothing of the restoring process's but stderr (the report's) and the
  // socket: not the job's output pipes, the runtime directory's lock or the
  // GPU's files.
  if (r > 3) ::syscall(SYS_close_range, 3U, unsigned(r - 1), 0U);
  ::syscall(SYS_close_range, unsigned(r + 1), ~0U, 0U);
  uint64_t since = 0;
  if (!proto::proc_start_time(::getpid(), &since, true)) ::_exit(0);
  bool keep[kMaxTemps] = {};
  for (;;) {
    char c;
    const ssize_t got = ::read(r, &c, 1);
    if (got == 1 && c >= kKeepTemp && size_t(c - kKeepTemp) < n_temps) {
      keep[c - kKeepTemp] = true;
      continue;
    }
    if (got == 1) ::_exit(0);  // dismissed
    if (got < 0 && errno == EINTR) continue;
    break;  // the restoring process is gone
  }
  // CRIU dies with the restoring process; a restored process may still be
  // forking its children for a moment: look again until none is left. A
  // process is taken for the job's when first seen in the first second and
  // started since the watch began; later passes only end again those seen
  // (one slow to die), never a process of a restore the user started since.
  Text ended;
  size_t count = 0;
  constexpr size_t kTracked = 4096;  // beyond: ended in the first second only, not named
  static uint64_t seen[kTracked];    // start time of pids[i] when first seen; 0: not seen
  constexpr size_t kMaxBelow = 4096;
  static pid_t below[kMaxBelow];  // what one of them started (stop_descendants)
  size_t started = 0;             // of those, below a process first seen
  for (int pass = 0; pass < 50; ++pass) {
    size_t found = 0;
    for (size_t i = 0; i < n; ++i) {
      uint64_t t = 0;
      if (!proto::proc_start_time(pids[i], &t, true) || t < since) continue;
      const uint64_t first = i < kTracked ? seen[i] : 0;
      if (first == 0 && pass >= 10) continue;  // new after the first second: not ours
      if (first != 0 && first != t) continue;  // another process under that id
      // What it forked once CRIU let it run on is not in the checkpoint:
      // ended with it (stopped first, or it would fork on), not left to init.
      stop_and_wait(pids[i]);
      const size_t k = stop_descendants(pids[i], since, pids, n, below, kMaxBelow);
      for (size_t j = 0; j < k; ++j) {
        repair_tcp_sockets(below[j]);
        if (::kill(below[j], SIGKILL) == 0 && first == 0) ++started;
      }
      repair_tcp_sockets(pids[i]);
      if (::kill(pids[i], SIGKILL) != 0) continue;
      ++found;
      if (i < kTracked && first == 0) {
        seen[i] = t;
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
  if (started > 0) {
    msg.put(" (with what they started since CRIU let them run: ");
    msg.put(static_cast<unsigned long long>(started));
    msg.put(started == 1 ? " process)" : " processes)");
  }
  msg.put("; the checkpoint is unchanged and restores again");
  // Its temporary directories: the restoring process's destructors did not
  // run. One left is named; a later restore sweeps it once 10 minutes old.
  // One the restore kept (CRIU's log of a failed run) stays, named.
  for (size_t i = 0; i < n_temps; ++i) {
    if (!keep[i] && remove_temp_dir(temps[i], restorer)) continue;
    msg.put(keep[i] ? "; its files are kept in " : "; its temporary directory ");
    msg.put(temps[i].parent.c_str());
    msg.put("/");
    msg.put(temps[i].name.c_str());
    if (!keep[i]) msg.put(" could not be removed");
  }
  msg.put("\n");
  if (::write(2, msg.buf, msg.len) < 0) {
  }
  ::_exit(0);
}

}  // namespace

bool RestoreWatch::start(const std::vector<pid_t>& pids, const std::string& dir, int report_fd,
                         std::string* err, const std::vector<std::string>& temp_dirs) {
  dismiss();
  const pid_t self = ::getpid();
  // Each temporary directory the watch may remove, checked now: a TempDir of
  // this process's, a directory (not a link) of ours; its device and inode
  // are what the watch removes, nothing else under that name.
  std::vector<TempDirRef> temps;
  temp_paths_.clear();
  for (const std::string& path : temp_dirs) {
    if (temps.size() == kMaxTemps) break;
    const size_t slash = path.find_last_of('/');
    if (slash == std::string::npos || slash + 1 >= path.size()) continue;
    TempDirRef t;
    t.parent = slash == 0 ? "/" : path.substr(0, slash);
    t.name = path.substr(slash + 1);
    struct stat st;
    if (!restore_temp_name(t.name.c_str(), self) || ::lstat(path.c_str(), &st) != 0 ||
        !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid())
      continue;
    t.dev = st.st_dev;
    t.ino = st.st_ino;
    temps.push_back(std::move(t));
    temp_paths_.push_back(path);
  }
  // A socket pair, not a pipe: dismiss sends with MSG_NOSIGNAL, so a watch
  // that is gone cannot raise SIGPIPE in the restoring process.
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    *err = std::string("restore watch: socketpair: ") + std::strerror(errno);
    return false;
  }
  UniqueFd r(sv[0]), w(sv[1]);  // blocking: the watch waits in read
  const pid_t pid = ::fork();
  if (pid < 0) {
    *err = std::string("restore watch: fork: ") + std::strerror(errno);
    return false;
  }
  if (pid == 0)
    watch_main(r.get(), pids.data(), pids.size(), dir.c_str(), report_fd, temps.data(),
               temps.size(), self);
  tell_ = std::move(w);
  pid_ = pid;
  return true;
}

void RestoreWatch::keep_temp_dir(const std::string& path) {
  if (pid_ <= 0) return;
  for (size_t i = 0; i < temp_paths_.size(); ++i) {
    if (temp_paths_[i] != path) continue;
    const char keep = char(kKeepTemp + i);
    if (::send(tell_.get(), &keep, 1, MSG_NOSIGNAL) < 0) {
    }  // the watch is gone: nothing to tell it
  }
}

void RestoreWatch::dismiss() {
  if (pid_ <= 0) return;
  const char done = kDismiss;
  if (::send(tell_.get(), &done, 1, MSG_NOSIGNAL) < 0) {
  }  // the watch is gone: nothing to tell it
  tell_.reset();
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

}  // namespace cusnap
