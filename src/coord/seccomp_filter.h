// The seccomp filter of `cusnap launch --strict`: refuses, in the job and
// every process it starts, the system calls that create kernel state CRIU
// cannot save, so a job cannot make itself uncheckpointable unnoticed. A
// refused call fails with kStrictErrno (EPERM) and nothing else changes: the
// job sees what it sees where the administrator disabled the feature
// (kernel.io_uring_disabled=2, the default profiles of Docker and
// containerd), and libraries fall back (io_uring -> epoll/threads).
//
// The filter is built before fork (libseccomp allocates) and installed in
// the child with two async-signal-safe system calls. CRIU dumps and restores
// seccomp filters, so a restored job keeps it.
#pragma once

#include <linux/filter.h>

#include <cerrno>
#include <string>
#include <vector>

namespace cusnap {

inline constexpr int kStrictErrno = EPERM;

/// One system call the filter refuses, with the reason CRIU cannot save what
/// it creates.
struct StrictSyscall {
  const char* name;
  const char* why;
};
/// Every refused call, in the order the man page lists them.
const std::vector<StrictSyscall>& strict_refused_syscalls();

/// A compiled filter, ready to install.
class StrictFilter {
 public:
  /// Compiles the filter for this machine's system call ABIs (on x86_64:
  /// x86_64, i386 and x32, so no ABI is a way around it). false + *err.
  bool build(std::string* err);
  /// Installs the filter in the calling thread (inherited by children and
  /// kept across exec). Sets no_new_privs only when the caller lacks
  /// CAP_SYS_ADMIN (the kernel requires one of the two), so set-user-ID
  /// programs still work in a root job. Async-signal-safe: for the child
  /// between fork and exec. Returns 0, or the errno of the failing call.
  int install() const noexcept;
  bool built() const { return !prog_.empty(); }

 private:
  std::vector<sock_filter> prog_;
};

}  // namespace cusnap
