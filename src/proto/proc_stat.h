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

/// Field 22 of /proc/PID/stat (clock ticks since boot) into *out; false when
/// the process is gone, or, with live_only, when it has ended (a zombie).
inline bool proc_start_time(pid_t pid, uint64_t* out, bool live_only) noexcept {
  char path[32] = "/proc/";
  size_t at = 6;
  at += format_decimal(static_cast<uint64_t>(pid), path + at);
  std::memcpy(path + at, "/stat", 6);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1024];
  ssize_t got;
  do got = ::read(fd, buf, sizeof buf - 1);
  while (got < 0 && errno == EINTR);
  ::close(fd);
  if (got <= 0) return false;
  buf[got] = 0;
  // "pid (comm) S ppid ...": the fields after the last ')' start at 3
  // (the state); the start time is field 22.
  const char* s = std::strrchr(buf, ')');
  if (!s || s[1] != ' ') return false;
  if (live_only && (s[2] == 'Z' || s[2] == 'X')) return false;
  s += 2;
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
