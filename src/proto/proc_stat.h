// A process's start time from /proc/PID/stat, without allocation
// (async-signal-safe): the shim names its process by pid and start time, and
// a restore's watch (src/coord/restore_watch.h) tells the processes it
// restored from those that were there before.
#pragma once

#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "proto/decimal.h"

namespace cusnap::proto {

/// /proc/PID/stat into buf (size n); the fields after the command's name,
/// from field 3 (the state) on, or null when the process is gone.
inline const char* proc_stat_fields(pid_t pid, char* buf, size_t n) noexcept {
  char path[32] = "/proc/";
  size_t at = 6;
  at += format_decimal(static_cast<uint64_t>(pid), path + at);
  std::memcpy(path + at, "/stat", 6);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  ssize_t got;
  do got = ::read(fd, buf, n - 1);
  while (got < 0 && errno == EINTR);
  ::close(fd);
  if (got <= 0) return nullptr;
  buf[got] = 0;
  // "pid (comm) S ppid ...": the fields after the last ')'.
  const char* s = std::strrchr(buf, ')');
  if (!s || s[1] != ' ' || s[2] == 0) return nullptr;
  return s + 2;
}

/// The state letter of /proc/PID/stat ('R', 'S', 'T', 'Z'...); 0 when the
/// process is gone.
inline char proc_state(pid_t pid) noexcept {
  char buf[1024];
  const char* s = proc_stat_fields(pid, buf, sizeof buf);
  return s ? *s : 0;
}

/// Field 22 of /proc/PID/stat (clock ticks since boot) into *out; false when
/// the process is gone, or, with live_only, when it has ended (a zombie).
inline bool proc_start_time(pid_t pid, uint64_t* out, bool live_only) noexcept {
  char buf[1024];
  const char* s = proc_stat_fields(pid, buf, sizeof buf);
  if (!s) return false;
  if (live_only && (s[0] == 'Z' || s[0] == 'X')) return false;
  for (int field = 3; field < 22; ++field) {
    s = std::strchr(s, ' ');
    if (!s) return false;
    ++s;
  }
  if (*s < '0' || *s > '9') return false;
  uint64_t v = 0;
  for (; *s >= '0' && *s <= '9'; ++s) v = v * 10 + uint64_t(*s - '0');
  *out = v;
  return true;
}

}  // namespace cusnap::proto
