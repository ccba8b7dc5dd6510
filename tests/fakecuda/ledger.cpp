// The system-wide ledger of simulated device memory (see ledger.h).
#include "ledger.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <tuple>
#include <utility>

namespace fc {

namespace {

constexpr char kPrefix[] = "/memfd:fakecuda:";

bool all_digits(const char* s) {
  if (!*s) return false;
  for (; *s; ++s)
    if (*s < '0' || *s > '9') return false;
  return true;
}

/// Parses an unsigned decimal number at *p, advancing it; false if none.
bool parse_number(const char** p, unsigned long long* out) {
  const char* s = *p;
  if (*s < '0' || *s > '9') return false;
  unsigned long long v = 0;
  for (; *s >= '0' && *s <= '9'; ++s) {
    if (v > (~0ULL - 9) / 10) return false;
    v = v * 10 + static_cast<unsigned>(*s - '0');
  }
  *p = s;
  *out = v;
  return true;
}

/// The FAKECUDA_UUID_SEED a process started with (/proc/PID/environ; 0 when
/// unset or unreadable), as read_device_env parses it.
uint64_t seed_of(long pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%ld/environ", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  std::string env;
  char buf[8192];
  for (ssize_t r; (r = read(fd, buf, sizeof buf)) > 0 && env.size() < (1u << 20);)
    env.append(buf, static_cast<size_t>(r));
  close(fd);
  static constexpr char kKey[] = "FAKECUDA_UUID_SEED=";
  for (size_t at = 0; at < env.size();) {
    size_t end = env.find('\0', at);
    if (end == std::string::npos) end = env.size();
    if (env.compare(at, sizeof kKey - 1, kKey) == 0) {
      const std::string v = env.substr(at + sizeof kKey - 1, end - at - (sizeof kKey - 1));
      return strtoull(v.c_str(), nullptr, 0);
    }
    at = end + 1;
  }
  return 0;
}

}  // namespace

bool ledger_parse_name(const char* target, pid_t* creator, uint64_t* id, int* dev) {
  if (strncmp(target, kPrefix, sizeof kPrefix - 1) != 0) return false;
  const char* p = target + sizeof kPrefix - 1;
  unsigned long long pid = 0, aid = 0, d = 0;
  if (!parse_number(&p, &pid) || *p++ != ':' || !parse_number(&p, &aid)) return false;
  if (strncmp(p, ":dev", 4) == 0) {
    p += 4;
    if (!parse_number(&p, &d)) return false;
  }
  if (*p != '\0' && *p != ' ') return false;
  if (pid == 0 || pid > 0x7fffffffULL || d > 0x7fffffffULL) return false;
  *creator = static_cast<pid_t>(pid);
  *id = aid;
  *dev = static_cast<int>(d);
  return true;
}

LedgerScan ledger_scan() {
  LedgerScan out;
  const uint64_t my_seed = read_device_env().seed;
  DIR* proc = opendir("/proc");
  if (!proc) return out;
  std::set<std::pair<dev_t, ino_t>> seen;              // memfds counted for their device
  std::set<std::tuple<pid_t, dev_t, ino_t>> seen_own;  // (holder, memfd) counted as its own
  char path[64], target[256];
  while (dirent* pe = readdir(proc)) {
    if (!all_digits(pe->d_name)) continue;
    const long holder = strtol(pe->d_name, nullptr, 10);
    snprintf(path, sizeof path, "/proc/%ld/fd", holder);
    DIR* fds = opendir(path);
    if (!fds) continue;  // exited, or not ours to read
    const int dir = dirfd(fds);
    int same_machine = -1;  // the holder's seed, read at its first memfd
    while (dirent* fe = readdir(fds)) {
      if (!all_digits(fe->d_name)) continue;
      ssize_t n = readlinkat(dir, fe->d_name, target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = '\0';
      pid_t creator = 0;
      uint64_t aid = 0;
      int dev = 0;
      if (!ledger_parse_name(target, &creator, &aid, &dev)) continue;
      if (dev < 0 || dev >= kMaxDevices) continue;
      if (same_machine < 0) same_machine = seed_of(holder) == my_seed;
      if (!same_machine) break;
      struct stat st {};
      if (fstatat(dir, fe->d_name, &st, 0) != 0 || st.st_size <= 0) continue;  // closed meanwhile
      const uint64_t size = static_cast<uint64_t>(st.st_size);
      if (seen.insert({st.st_dev, st.st_ino}).second) out.device[dev] += size;
      if (creator == holder && seen_own.insert({creator, st.st_dev, st.st_ino}).second)
        out.own[creator].device[dev] += size;
    }
    closedir(fds);
  }
  closedir(proc);
  return out;
}

}  // namespace fc
