#include "coord/write_probe.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>

#include "proto/unique_fd.h"

namespace cusnap {

bool probe_write(const std::string& path, const std::string& what, std::string* err,
                 int* error_number) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  const std::string page(4096, '\n');
  ssize_t w = fd ? ::write(fd.get(), page.data(), page.size()) : -1;
  if (w >= 0 && w < ssize_t(page.size())) errno = ENOSPC;  // a short write: full
  const bool ok = w == ssize_t(page.size()) && ::fsync(fd.get()) == 0;
  if (!ok) {
    const int e = errno;
    *err = errno_message("cannot write " + what, e);
    if (error_number) *error_number = e;
  }
  if (fd) ::unlink(path.c_str());
  return ok;
}

}  // namespace cusnap
