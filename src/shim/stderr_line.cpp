// The shim's lines on stderr (stderr_line.h).
#include "shim/stderr_line.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "shim/gate.h"
#include "shim/once.h"

namespace cusnap::shim {

bool debug_enabled() noexcept {
  static OnceNumber on;
  return on.get([] {
    const char* e = std::getenv("CUSNAP_SHIM_DEBUG");
    return e && *e && std::strcmp(e, "0") != 0;
  }) != 0;
}

void write_stderr(const char* text, size_t n) noexcept {
  if (n == 0) return;
  // send, poll and write are cancellation points; callers are noexcept hooks.
  const NoCancel no_cancel;
  const int saved = errno;
  if (::send(STDERR_FILENO, text, n, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno == ENOTSOCK) {
    // A pipe reports room once it has a free page: a write of up to a page
    // then completes at once. A file or /dev/null always has room.
    struct pollfd p {
      STDERR_FILENO, POLLOUT, 0
    };
    if (::poll(&p, 1, 0) == 1 && (p.revents & POLLOUT) &&
        !(p.revents & (POLLERR | POLLHUP | POLLNVAL))) {
      const ssize_t r = ::write(STDERR_FILENO, text, n);
      (void)r;
    }
  }
  errno = saved;
}

void say(const char* fmt, ...) noexcept {
  char line[1024];
  int n = std::snprintf(line, sizeof line, "cusnap-shim[%d]: ", static_cast<int>(::getpid()));
  if (n < 0) return;
  va_list ap;
  va_start(ap, fmt);
  const int m = std::vsnprintf(line + n, sizeof line - static_cast<size_t>(n), fmt, ap);
  va_end(ap);
  if (m < 0) return;
  size_t len = static_cast<size_t>(n) + static_cast<size_t>(m);
  if (len > sizeof line - 2) len = sizeof line - 2;  // cut short, the newline kept
  line[len++] = '\n';
  write_stderr(line, len);
}

}  // namespace cusnap::shim
