#include "coord/criu_interrupt.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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

/// The last mark in text: its index in kMarks, or -1.
int last_mark(std::string_view text) {
  int found = -1;
  size_t at = 0;
  for (size_t i = 0; i < kMarks.size(); ++i) {
    const size_t p = text.rfind(kMarks[i].text);
    if (p != std::string_view::npos && (found < 0 || p > at)) {
      found = int(i);
      at = p;
    }
  }
  return found;
}

/// Reads [from, end) of fd into *out; false on a read error.
bool read_from(int fd, off_t from, std::string* out) {
  out->clear();
  char buf[1 << 16];
  for (off_t off = from;;) {
    const ssize_t n = ::pread(fd, buf, sizeof buf, off);
    if (n < 0) return false;
    if (n == 0) return true;
    out->append(buf, size_t(n));
    off += n;
  }
}

}  // namespace

bool criu_dump_killable_text(std::string_view log_text) {
  const int m = last_mark(log_text);
  return m < 0 || kMarks[size_t(m)].killable;
}

bool criu_dump_killable(const std::string& log_path) {
  UniqueFd fd(::open(log_path.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) != 0) return true;
  constexpr off_t kTail = 1 << 20;
  std::string text;
  if (!read_from(fd.get(), st.st_size > kTail ? st.st_size - kTail : 0, &text)) return true;
  if (last_mark(text) < 0 && st.st_size > kTail && !read_from(fd.get(), 0, &text)) return true;
  return criu_dump_killable_text(text);
}

}  // namespace cusnap
