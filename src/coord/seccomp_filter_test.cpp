// The --strict filter, installed in a forked child: every listed call fails
// with kStrictErrno, other calls work, children inherit it; without it
// io_uring_setup is not refused with that errno.
#include "coord/seccomp_filter.h"

#include <doctest/doctest.h>
#include <linux/io_uring.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace cusnap {
namespace {

/// errno of io_uring_setup(1, &params) in this process (0 on success; the
/// ring is closed again).
int io_uring_setup_errno() {
  io_uring_params p;
  std::memset(&p, 0, sizeof p);
  long fd = syscall(__NR_io_uring_setup, 1, &p);
  if (fd >= 0) {
    close(int(fd));
    return 0;
  }
  return errno;
}

/// Runs fn in a forked child; its return value is the child's exit status.
template <class Fn>
int in_child(Fn fn) {
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) _exit(fn());
  int st = 0;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  REQUIRE(WIFEXITED(st));
  return WEXITSTATUS(st);
}

}  // namespace

TEST_CASE("seccomp: the --strict filter refuses what CRIU cannot save, with EPERM") {
  StrictFilter f;
  std::string err;
  REQUIRE_MESSAGE(f.build(&err), err);
  CHECK(f.built());
  CHECK(strict_refused_syscalls().size() >= 3);

  // Each exit status names the first check that failed (0: all passed).
  int rc = in_child([&]() -> int {
    if (f.install() != 0) return 10;
    if (io_uring_setup_errno() != kStrictErrno) return 11;
    errno = 0;
    if (syscall(__NR_io_uring_enter, -1, 0, 0, 0, nullptr, 0) != -1 || errno != kStrictErrno)
      return 12;
    errno = 0;
    if (syscall(__NR_io_uring_register, -1, 0, nullptr, 0) != -1 || errno != kStrictErrno)
      return 13;
    errno = 0;
    if (syscall(__NR_userfaultfd, 0) != -1 || errno != kStrictErrno) return 14;
    errno = 0;
    if (syscall(__NR_perf_event_open, nullptr, 0, -1, -1, 0) != -1 || errno != kStrictErrno)
      return 15;
    errno = 0;
    if (syscall(__NR_bpf, 0, nullptr, 0) != -1 || errno != kStrictErrno) return 16;
    errno = 0;
    if (syscall(__NR_memfd_secret, 0) != -1 || errno != kStrictErrno) return 17;
    // Everything else still works, and a grandchild inherits the filter.
    if (getpid() <= 0) return 18;
    int fds[2];
    if (pipe(fds) != 0) return 19;
    pid_t g = fork();
    if (g == 0) _exit(io_uring_setup_errno() == kStrictErrno ? 0 : 1);
    int st = 0;
    if (g < 0 || waitpid(g, &st, 0) != g || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return 20;
    return 0;
  });
  CHECK_MESSAGE(rc == 0, "check " << rc << " failed in the filtered child");
}

TEST_CASE("seccomp: without the filter io_uring_setup is not refused by it") {
  int e = in_child([] { return io_uring_setup_errno(); });
  // EPERM here would mean the machine disables io_uring itself
  // (kernel.io_uring_disabled=2); then this check says nothing.
  if (e == EPERM) {
    MESSAGE("io_uring is disabled on this machine; skipping the unfiltered check");
    return;
  }
  CHECK_MESSAGE((e == 0 || e == ENOSYS || e == ENOMEM), "io_uring_setup: " << std::strerror(e));
}

}  // namespace cusnap
