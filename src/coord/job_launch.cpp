// cusnap launch: start the job in a new session and supervise it.
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/close_range.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "coord/abs_path.h"
#include "coord/manifest.h"  // job_record_fits
#include "coord/runtime_dir.h"
#include "coord/seccomp_filter.h"
#include "coord/supervisor.h"
#include "coord/supervisor_loop.h"
#include "proto/unique_fd.h"

extern char** environ;

namespace cusnap {

namespace {

/// Whether the dynamic loader can preload path into the job: a readable
/// file, an ELF shared library of this machine, named without the ':' or
/// space that separate LD_PRELOAD's entries. Nothing of it is run here.
bool preloadable(const std::string& path, std::string* why) {
  if (path.find_first_of(": ") != std::string::npos) {
    *why = "LD_PRELOAD cannot carry a path holding ':' or a space";
    return false;
  }
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  struct stat st;
  if (!fd || ::fstat(fd.get(), &st) != 0) {
    *why = std::strerror(errno);
    return false;
  }
  if (!S_ISREG(st.st_mode)) {
    *why = S_ISDIR(st.st_mode) ? "it is a directory" : "it is not a file";
    return false;
  }
  // e_ident, e_type and e_machine lie where they do in either class's header.
  Elf64_Ehdr h{};
  const ssize_t n = ::pread(fd.get(), &h, sizeof h, 0);
  if (n < EI_NIDENT + 4 || std::memcmp(h.e_ident, ELFMAG, SELFMAG) != 0 || h.e_type != ET_DYN) {
    *why = "it is not a shared library";
    return false;
  }
#if defined(__x86_64__)
  constexpr uint16_t kMachine = EM_X86_64;
#elif defined(__aarch64__)
  constexpr uint16_t kMachine = EM_AARCH64;
#else
  const uint16_t kMachine = h.e_machine;
#endif
  if (h.e_ident[EI_CLASS] != (sizeof(void*) == 8 ? ELFCLASS64 : ELFCLASS32) ||
      h.e_machine != kMachine) {
    *why = "it is a shared library for another machine";
    return false;
  }
  return true;
}

}  // namespace

bool find_shim(std::string* path, std::string* err) {
  path->clear();
  if (const char* s = std::getenv("CUSNAP_SHIM"); s && *s) {
    // Set, it must be preloadable: without the shim the job would run, but
    // what shares device memory would not be checkpointable.
    std::string why;
    if (!preloadable(s, &why)) {
      *err = std::string("CUSNAP_SHIM=\"") + s + "\" cannot be preloaded into the job: " + why +
             "; set it to the path of libcusnap_shim.so, unset it for the one installed beside "
             "cusnap, or launch with --no-shim";
      return false;
    }
    // The job's processes may change directory before they start others.
    std::error_code ec;
    if (!absolute_path(s, path, &ec)) *path = s;
    return true;
  }
  char exe[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return true;
  std::string dir(exe, static_cast<size_t>(n));
  dir.resize(dir.rfind('/'));
  std::string shim = dir + "/../lib/libcusnap_shim.so";
  char real[PATH_MAX];
  if (::realpath(shim.c_str(), real) == nullptr || ::access(real, R_OK) != 0) return true;
  *path = real;
  return true;
}

std::string preload_with(const std::string& shim, const char* existing) {
  if (!existing || !*existing) return shim;
  return shim + ":" + existing;
}

SuperviseOutcome launch_job(const LaunchRequest& req) {
  SuperviseOutcome fail;
  if (req.argv.empty()) {
    fail.exit_code = kExitUsage;
    fail.error = "no command to launch";
    return fail;
  }
  const std::string name = req.cfg.name.empty() ? default_job_name(req.argv) : req.cfg.name;
  char cwd[PATH_MAX];
  if (!::getcwd(cwd, sizeof cwd)) cwd[0] = '\0';
  // A job whose record (job.json) ps could not read, and whose checkpoint a
  // restore would refuse, is refused before anything is made.
  if (std::string why; !job_record_fits(req.argv, cwd, &why)) {
    fail.exit_code = kExitUsage;
    fail.error = "cannot launch this command: " + why +
                 "; pass long data in a file or through the environment";
    return fail;
  }
  // A shim that cannot be preloaded is refused before anything is made.
  std::string shim;
  if (req.use_shim && !find_shim(&shim, &fail.error)) {
    fail.exit_code = kExitUsage;
    return fail;
  }
  std::unique_ptr<SupervisorLoop> sup;
  if (!SupervisorLoop::prepare(req.cfg, name, &sup, &fail)) return fail;
  if (req.on_named) req.on_named(name);

  // Everything the child needs is built before fork: it only calls
  // async-signal-safe functions until exec.
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e)
    if ((shim.empty() || std::strncmp(*e, "LD_PRELOAD=", 11) != 0) &&
        std::strncmp(*e, "CUSNAP_RUNTIME_DIR=", 19) != 0)
      env.emplace_back(*e);
  if (!shim.empty()) env.push_back("LD_PRELOAD=" + preload_with(shim, std::getenv("LD_PRELOAD")));
  // The shim tracks shared memory only when it knows where the job's sockets live.
  env.push_back("CUSNAP_RUNTIME_DIR=" + sup->rundir().path());
  std::vector<char*> envp, argv;
  for (std::string& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = req.argv;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  StrictFilter filter;
  if (req.strict) {
    std::string why;
    if (!filter.build(&why)) {
      sup->discard();
      fail.exit_code = kExitFailure;
      fail.error = "--strict: cannot build the seccomp filter: " + why;
      return fail;
    }
  }

  UniqueFd out_r, out_w, err_r, err_w, report_r, report_w, devnull;
  // Ours closed before the directory is removed: the failure may have been
  // running out of descriptors (SupervisorLoop::discard).
  auto failed = [&](int code, std::string msg) {
    for (UniqueFd* fd : {&out_r, &out_w, &err_r, &err_w, &report_r, &report_w, &devnull})
      fd->reset();
    sup->discard();
    fail.exit_code = code;
    fail.error = std::move(msg);
    return fail;
  };
  std::string perr;
  if (!make_pipe(&out_r, &out_w, 0, "the job's output pipe", &perr) ||
      !make_pipe(&err_r, &err_w, 0, "the job's output pipe", &perr) ||
      !make_pipe(&report_r, &report_w, 0, "the job's start report pipe", &perr))
    return failed(kExitFailure, perr);
  devnull.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!devnull) {
    const int e = errno;
    return failed(kExitFailure, errno_message("/dev/null", e));
  }

  // The child reports a failure before exec as {stage, errno}.
  enum : int { kStageSetup = 0, kStageSeccomp = 1, kStageExec = 2 };
  pid_t pid = ::fork();
  if (pid < 0) return failed(kExitFailure, std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    auto report_failure = [&](int stage, int e) {
      int msg[2] = {stage, e};
      (void)!::write(report_w.get(), msg, sizeof msg);
      ::_exit(127);
    };
    SupervisorLoop::reset_signals_in_child();
    ::setsid();
    if (::dup2(devnull.get(), STDIN_FILENO) < 0 || ::dup2(out_w.get(), STDOUT_FILENO) < 0 ||
        ::dup2(err_w.get(), STDERR_FILENO) < 0)
      report_failure(kStageSetup, errno);
    if (req.strict)
      if (int e = filter.install(); e != 0) report_failure(kStageSeccomp, e);
    // Only 0, 1 and 2: a descriptor inherited from whatever started cusnap
    // would be outside the job's tree, which CRIU cannot dump.
    // Marked close-on-exec rather than closed, so report_w outlives a failed exec.
    if (::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0)
      for (int fd = 3; fd < 65536; ++fd) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    ::execvpe(argv[0], argv.data(), envp.data());
    report_failure(kStageExec, errno);
  }
  out_w.reset();
  err_w.reset();
  report_w.reset();
  int child_failure[2] = {0, 0};
  ssize_t n;
  do n = ::read(report_r.get(), child_failure, sizeof child_failure);
  while (n < 0 && errno == EINTR);
  if (n == sizeof child_failure) {
    int st;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    const char* why = std::strerror(child_failure[1]);
    if (child_failure[0] == kStageSeccomp)
      return failed(kExitFailure,
                    std::string("--strict: cannot install the seccomp filter: ") + why);
    return failed(127, "cannot run '" + req.argv[0] + "': " + why);
  }

  JobInfo info;
  info.name = name;
  info.root_pid = pid;
  info.argv = req.argv;
  info.cwd = cwd;
  info.runtime_dir = sup->rundir().path();
  info.shim_dir = info.runtime_dir;
  info.owner_uid = ::geteuid();
  info.stdout_pipe_id = pipe_id(out_r.get());
  info.stderr_pipe_id = pipe_id(err_r.get());
  return sup->run(std::move(info), std::move(out_r), std::move(err_r), "",
                  default_coordinator_ops());
}

}  // namespace cusnap
