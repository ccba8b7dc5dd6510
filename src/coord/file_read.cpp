#include "coord/file_read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "proto/unique_fd.h"

namespace cusnap {

bool read_file_bounded(const std::string& path, const FileReadLimits& limits, std::string* out,
                       std::string* err, int* error_number) {
  auto fail = [&](int e, const std::string& why) {
    if (err) *err = why;
    if (error_number) *error_number = e;
    return false;
  };
  const int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | (limits.no_follow ? O_NOFOLLOW : 0);
  const UniqueFd fd(::open(path.c_str(), flags));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) != 0) {
    const int e = errno;
    return fail(e, errno_message("cannot read " + path, e));
  }
  if (!S_ISREG(st.st_mode)) return fail(0, path + " is not a regular file");
  const std::string limit =
      std::string(limits.kind) + " can be (" + std::to_string(limits.max_bytes) + " bytes)";
  if (!limits.prefix && st.st_size > 0 && size_t(st.st_size) > limits.max_bytes)
    return fail(0, path + " is " + std::to_string(st.st_size) + " bytes, more than " + limit);
  out->clear();
  char buf[65536];
  for (;;) {
    const ssize_t r = ::read(fd.get(), buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int e = errno;
      return fail(e, errno_message("cannot read " + path, e));
    }
    if (r == 0) break;
    out->append(buf, size_t(r));
    if (out->size() > limits.max_bytes && limits.prefix) {
      out->resize(limits.max_bytes);
      break;
    }
    if (out->size() > limits.max_bytes)
      return fail(0, path + " grows past what " + limit + " while it is read");
  }
  if (error_number) *error_number = 0;
  return true;
}

}  // namespace cusnap
