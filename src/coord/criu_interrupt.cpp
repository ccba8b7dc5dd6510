#include "coord/criu_interrupt.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>

#include "proto/unique_fd.h"

namespace cusnap {

namespace {

struct Mark {
  std::string_view text;
  bool killable;  ///< after this mark, until the next
};

// compel's and CRIU's log lines (CRIU 4.1, -v4) that begin and end the two
// steps in which a process is driven by ptrace alone (criu_interrupt.h).
constexpr std::array<Mark, 4> kMarks{{
    {"Parasite syscall_ip at", false},           // infection: remote system calls
    {"has been switched to daemon mode", true},  // the parasite runs as a daemon
    {" to trap", false},                         // "Waiting for PID to trap": the cure
    {"Dumping mm (pid:", true},                  // cured: the mappings are dumped
}};

/// The longest mark's length.
constexpr size_t kLongestMark = [] {
  size_t n = 0;
  for (const Mark& m : kMarks) n = std::max(n, m.text.size());
  return n;
}();

/// The last mark in text that ends after its first `seen` bytes (those were
/// looked at before): its index in kMarks, or -1.
int last_mark(std::string_view text, size_t seen = 0) {
  int found = -1;
  size_t at = 0;
  for (size_t i = 0; i < kMarks.size(); ++i) {
    const size_t p = text.rfind(kMarks[i].text);
    if (p == std::string_view::npos || p + kMarks[i].text.size() <= seen) continue;
    if (found < 0 || p > at) {
      found = int(i);
      at = p;
    }
  }
  return found;
}

}  // namespace

bool criu_dump_killable_text(std::string_view log_text) {
  const int m = last_mark(log_text);
  return m < 0 || kMarks[size_t(m)].killable;
}

bool CriuDumpLog::killable() {
  UniqueFd fd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) != 0) return true;
  if (st.st_size < looked_) {  // written anew: look at it from its start
    looked_ = 0;
    mark_ = -1;
    tail_.clear();
  }
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::pread(fd.get(), buf, sizeof buf, looked_);
    if (n < 0) return true;
    if (n == 0) break;
    text.assign(tail_).append(buf, size_t(n));
    if (const int m = last_mark(text, tail_.size()); m >= 0) mark_ = m;
    tail_ = text.substr(text.size() - std::min(text.size(), kLongestMark - 1));
    looked_ += n;
  }
  return mark_ < 0 || kMarks[size_t(mark_)].killable;
}

bool criu_dump_killable(const std::string& log_path) {
  return CriuDumpLog(log_path).killable();
}

}  // namespace cusnap
