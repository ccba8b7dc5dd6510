#include "coord/seccomp_filter.h"

#include <linux/seccomp.h>
#include <seccomp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <memory>

#include "proto/unique_fd.h"

namespace cusnap {

const std::vector<StrictSyscall>& strict_refused_syscalls() {
  static const std::vector<StrictSyscall> calls = {
      {"io_uring_setup",
       "an io_uring instance (its rings, registered files and buffers, requests in flight) is "
       "kernel state CRIU cannot dump"},
      {"io_uring_enter", "acts on an io_uring instance (one inherited or passed in)"},
      {"io_uring_register", "acts on an io_uring instance (one inherited or passed in)"},
      {"userfaultfd",
       "a userfaultfd and the faults it owns cannot be dumped (CRIU uses userfaultfd itself for "
       "lazy restore)"},
      {"perf_event_open", "perf event descriptors (counters, sampling buffers) cannot be dumped"},
      {"bpf",
       "BPF programs, links and BTF objects live in the kernel, outside the process; CRIU "
       "cannot dump them"},
      {"memfd_secret",
       "secret memory is removed from the kernel's mappings, so CRIU cannot read its pages"},
  };
  return calls;
}

namespace {

struct CtxDeleter {
  void operator()(void* c) const { seccomp_release(c); }
};

}  // namespace

bool StrictFilter::build(std::string* err) {
  prog_.clear();
  std::unique_ptr<void, CtxDeleter> ctx(seccomp_init(SCMP_ACT_ALLOW));
  if (!ctx) {
    *err = "seccomp_init failed";
    return false;
  }
  if (seccomp_arch_native() == SCMP_ARCH_X86_64) {
    for (uint32_t arch : {SCMP_ARCH_X86, SCMP_ARCH_X32}) {
      int r = seccomp_arch_add(ctx.get(), arch);
      if (r != 0 && r != -EEXIST) {
        *err = std::string("seccomp_arch_add: ") + std::strerror(-r);
        return false;
      }
    }
  }
  for (const StrictSyscall& s : strict_refused_syscalls()) {
    int nr = seccomp_syscall_resolve_name(s.name);
    if (nr == __NR_SCMP_ERROR) {
      *err = std::string("libseccomp does not know the system call ") + s.name +
             ": update libseccomp (>= 2.5.2)";
      return false;
    }
    int r = seccomp_rule_add(ctx.get(), SCMP_ACT_ERRNO(kStrictErrno), nr, 0);
    // Calls that an added ABI lacks (x32 has no memfd_secret, ...) are skipped
    // there by libseccomp; only a real failure stops us.
    if (r != 0) {
      *err = std::string("seccomp_rule_add(") + s.name + "): " + std::strerror(-r);
      return false;
    }
  }
  UniqueFd mem(memfd_create("cusnap-seccomp", MFD_CLOEXEC));
  if (!mem) {
    *err = std::string("memfd_create: ") + std::strerror(errno);
    return false;
  }
  int r = seccomp_export_bpf(ctx.get(), mem.get());
  if (r != 0) {
    *err = std::string("seccomp_export_bpf: ") + std::strerror(-r);
    return false;
  }
  off_t size = lseek(mem.get(), 0, SEEK_END);
  if (size <= 0 || size % sizeof(sock_filter) != 0 || lseek(mem.get(), 0, SEEK_SET) != 0) {
    *err = "seccomp_export_bpf wrote no valid program";
    return false;
  }
  prog_.resize(size_t(size) / sizeof(sock_filter));
  char* p = reinterpret_cast<char*>(prog_.data());
  size_t got = 0;
  while (got < size_t(size)) {
    ssize_t n = read(mem.get(), p + got, size_t(size) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *err = std::string("reading the exported filter: ") + std::strerror(n < 0 ? errno : EIO);
      prog_.clear();
      return false;
    }
    got += size_t(n);
  }
  return true;
}

int StrictFilter::install() const noexcept {
  if (prog_.empty()) return EINVAL;
  sock_fprog fprog{};
  fprog.len = static_cast<unsigned short>(prog_.size());
  fprog.filter = const_cast<sock_filter*>(prog_.data());
  if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fprog) == 0) return 0;
  if (errno != EACCES) return errno;
  // Without CAP_SYS_ADMIN the kernel wants no_new_privs first.
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return errno;
  if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fprog) != 0) return errno;
  return 0;
}

}  // namespace cusnap
