#include "coord/supervisor_loop.h"

#include "coord/engine_internal.h"
#include "coord/file_read.h"
#include "coord/gpu_memory.h"
#include "coord/guardian.h"
#include "coord/output_echo.h"
#include "coord/procs.h"
#include "coord/settings.h"
#include "proto/env_settings.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>

namespace cusnap {
namespace {

/// Whether descriptors a and b name the same file (a terminal both go to).
bool same_file(int a, int b) {
  struct stat sa {
  }, sb{};
  return ::fstat(a, &sa) == 0 && ::fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

/// What the guardian needs of an operation: where it keeps what it saves,
/// its timeout and the free-memory margin its client set.
GuardedOperation guarded_operation(const char* op, const std::string& state_dir,
                                   bool remove_partial, std::chrono::milliseconds timeout,
                                   const proto::Settings& settings) {
  GuardedOperation g;
  g.op = op;
  g.state_dir = state_dir;
  g.remove_partial = remove_partial;
  g.timeout = timeout;
  if (const char* margin = setting(settings, kRestoreMarginSetting)) g.margin = margin;
  return g;
}

// The write end of the self-pipe, set by prepare() and cleared before it is
// closed; atomic, so that a handler on another thread reads a whole value.
std::atomic<int> g_signal_pipe{-1};

/// Whether sig is one the supervisor forwards to the job (and that stops a
/// restore before CRIU starts).
bool forwarded(int sig) {
  return sig == SIGINT || sig == SIGTERM || sig == SIGHUP;
}

void on_signal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  if (const int fd = g_signal_pipe.load(std::memory_order_relaxed);
      fd >= 0 && ::write(fd, &b, 1) < 0) {
  }  // a full pipe already holds a wake-up
  errno = saved;
}

void on_sigpipe(int) {}  // writes report EPIPE instead

/// The most job output the echo to our stdout and stderr holds while their
/// reader does not read; beyond it the job's pipes are not read either.
constexpr size_t kEchoCapacity = 1u << 20;

/// A job taken over from a dead supervisor keeps when it started and the
/// checkpoint it was restored from, as that supervisor's job.json says
/// (when it names the same root process).
void keep_history(const std::string& job_json, pid_t root, proto::JobStatus* s) {
  std::string text, err;
  proto::JobStatus before;
  if (!read_file_bounded(job_json, {.max_bytes = kMaxJobJsonBytes, .no_follow = true}, &text) ||
      !job_status_from_json(text, &before, &err) || before.root_pid != root)
    return;
  s->started = before.started;
  s->restored_from = before.restored_from;
}

/// The job ended with its first process (root, its session's leader): what
/// else of it still runs (job_leftovers) would be left unsupervised, holding
/// GPU memory and ids a restore needs. Each gets SIGTERM, and SIGKILL when
/// still there after grace; reaped. Says what it did ("" when none ran).
std::string end_leftovers(pid_t root, pid_t guardian, std::chrono::milliseconds grace) {
  const std::vector<pid_t> rest = job_leftovers(root, ::getpid(), guardian);
  if (rest.empty()) return "";
  std::vector<UniqueFd> pidfds;
  std::string pids;
  for (pid_t p : rest) {
    pidfds.push_back(open_pidfd(p));
    signal_pidfd(pidfds.back(), SIGTERM);
    pids += (pids.empty() ? "" : ", ") + std::to_string(p);
  }
  const bool all = wait_pidfds_exited(pidfds, grace);
  if (!all)
    for (const UniqueFd& fd : pidfds) signal_pidfd(fd, SIGKILL);
  wait_pidfds_exited(pidfds, std::chrono::seconds(5));
  for (pid_t p : rest) ::waitpid(p, nullptr, WNOHANG);  // ours when orphaned
  const bool one = rest.size() == 1;
  return std::string("the job's first process ended; ") +
         (one ? "its process " : "its processes ") + pids +
         (one ? ", still running, was ended" : ", still running, were ended") +
         (all ? " (SIGTERM)" : " (SIGTERM, then SIGKILL)");
}

}  // namespace

std::string pipe_id(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) return "";
  return "pipe:[" + std::to_string(st.st_ino) + "]";
}

int SupervisorLoop::take_signal() {
  unsigned char sigs[64];
  ssize_t n;
  int first = 0;
  while ((n = ::read(sig_r_.get(), sigs, sizeof sigs)) > 0)
    for (ssize_t i = 0; i < n && !first; ++i)
      if (forwarded(sigs[i])) first = sigs[i];
  return first;
}

void SupervisorLoop::reset_signals_in_child() {
  struct sigaction sa {};
  sa.sa_handler = SIG_DFL;
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::sigaction(s, &sa, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
}

/// $CUSNAP_OUTPUT_LOG_MIB: output.log's cap in bytes (0: none).
static bool output_log_cap(uint64_t* cap, std::string* err) {
  uint64_t mib = 0;
  if (!proto::env_number_checked(proto::kOutputLogMib, &mib, err)) return false;
  *cap = mib << 20;
  return true;
}

void SupervisorLoop::log_output(const char* data, size_t n) {
  write_all(log_fd_.get(), data, n);
  log_size_ += n;
  if (log_cap_ == 0 || log_size_ < log_cap_) return;
  // The older half goes to output.log.1 (replacing the one before); when the
  // new file cannot be made, the output goes on into the old one.
  const std::string path = rundir_->log_path(), old = path + ".1";
  if (::rename(path.c_str(), old.c_str()) != 0) return;
  UniqueFd fresh(
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fresh) {
    ::rename(old.c_str(), path.c_str());
    return;
  }
  log_fd_ = std::move(fresh);
  log_size_ = 0;
}

bool SupervisorLoop::prepare(const SupervisorConfig& cfg, const std::string& name,
                             std::unique_ptr<SupervisorLoop>* out, SuperviseOutcome* fail) {
  std::unique_ptr<SupervisorLoop> s(new SupervisorLoop());
  s->cfg_ = cfg;
  fail->name = name;
  auto failed = [&](int code, std::string msg) {
    fail->exit_code = code;
    fail->error = std::move(msg);
    s->discard();
    return false;
  };
  std::string err;
  if (!output_log_cap(&s->log_cap_, &err)) return failed(kExitUsage, err);
  uint64_t grace_ms = 0;
  if (!proto::env_number_checked(proto::kExitGraceMs, &grace_ms, &err))
    return failed(kExitUsage, err);
  s->cfg_.drain_grace = std::chrono::milliseconds(grace_ms);
  if (bool refused = false;
      !RuntimeDir::reserve(name, cfg.runtime_dir, &s->rundir_, &err, &refused))
    return failed(refused ? kExitRefused : kExitFailure, err);
  if (!proto::listen_unix(s->rundir_->socket_path(), 0600, &s->listen_fd_, &err))
    return failed(kExitFailure, err);
  if (int e = 0; !s->rundir_->can_write(&err, &e))
    // Out of descriptors, the remedy is said already (not space, nor another place).
    return failed(kExitFailure, out_of_descriptors(e)
                                    ? err
                                    : err +
                                          ": the job could not be found by cusnap ps, checkpoint "
                                          "or inspect; free space there or choose another "
                                          "CUSNAP_RUNTIME_BASE or --runtime-dir");
  s->log_fd_.reset(::open(s->rundir_->log_path().c_str(),
                          O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!s->log_fd_)
    return failed(kExitFailure, "creating " + s->rundir_->log_path() + ": " + std::strerror(errno));
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
    return failed(kExitFailure,
                  std::string("prctl(PR_SET_CHILD_SUBREAPER): ") + std::strerror(errno));
  if (!s->install_handlers(fail)) {
    s->discard();
    return false;
  }
  *out = std::move(s);
  return true;
}

bool SupervisorLoop::adopt(const SupervisorConfig& cfg, const std::string& path, int lock_fd,
                           std::unique_ptr<SupervisorLoop>* out, SuperviseOutcome* fail) {
  std::unique_ptr<SupervisorLoop> s(new SupervisorLoop());
  s->cfg_ = cfg;
  s->adopted_ = true;
  fail->name = cfg.name;
  // A duplicate: lock_fd stays the caller's, so that an adoption that fails
  // does not let the lock go (the runtime directory of a live job would
  // then look stale to ps, which removes it, output.log included).
  UniqueFd lock(::fcntl(lock_fd, F_DUPFD_CLOEXEC, 3));
  if (!lock) {
    fail->exit_code = kExitFailure;
    fail->error = std::string("duplicating the runtime directory's lock: ") + std::strerror(errno);
    return false;
  }
  s->rundir_ = RuntimeDir::adopt(path, std::move(lock));
  std::string err;
  ::unlink(s->rundir_->socket_path().c_str());  // the dead supervisor's
  if (!proto::listen_unix(s->rundir_->socket_path(), 0600, &s->listen_fd_, &err)) {
    fail->exit_code = kExitFailure;
    fail->error = err;
    return false;
  }
  s->log_fd_.reset(::open(s->rundir_->log_path().c_str(),
                          O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!s->log_fd_) {
    fail->exit_code = kExitFailure;
    fail->error = "opening " + s->rundir_->log_path() + ": " + std::strerror(errno);
    return false;
  }
  // The dead supervisor's cap, from the environment it left the guardian.
  s->log_cap_ = proto::env_number(proto::kOutputLogMib) << 20;
  s->cfg_.drain_grace = std::chrono::milliseconds(proto::env_number(proto::kExitGraceMs));
  if (struct stat st; ::fstat(s->log_fd_.get(), &st) == 0) s->log_size_ = uint64_t(st.st_size);
  if (!s->install_handlers(fail)) return false;
  *out = std::move(s);
  return true;
}

bool SupervisorLoop::install_handlers(SuperviseOutcome* fail) {
  if (!make_pipe(&sig_r_, &sig_w_, O_NONBLOCK, "the supervisor's signal pipe", &fail->error)) {
    fail->exit_code = kExitFailure;
    return false;
  }
  wake_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_) {
    fail->exit_code = kExitFailure;
    const int e = errno;
    fail->error = errno_message("the supervisor's wake-up eventfd", e);
    return false;
  }
  g_signal_pipe.store(sig_w_.get());
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  sa.sa_handler = on_sigpipe;
  ::sigaction(SIGPIPE, &sa, nullptr);
  return true;
}

void SupervisorLoop::discard() {
  if (g_signal_pipe.load() == sig_w_.get()) g_signal_pipe.store(-1);
  listen_fd_.reset();
  log_fd_.reset();
  sig_r_.reset();
  sig_w_.reset();
  wake_fd_.reset();
  if (rundir_) rundir_->remove();
}

SupervisorLoop::~SupervisorLoop() {
  if (g_signal_pipe.load() == sig_w_.get()) g_signal_pipe.store(-1);
}

void SupervisorLoop::reap(pid_t root, bool* root_done, int* root_status) {
  // Held across the waits so that no engine call (and so no CRIU child of
  // the engine) starts while we reap whatever exited.
  std::lock_guard lk(ctx_.mu);
  const bool busy = !ctx_.engine_op.empty();
  for (;;) {
    int st = 0;
    pid_t p = busy ? (*root_done ? 0 : ::waitpid(root, &st, WNOHANG)) : ::waitpid(-1, &st, WNOHANG);
    if (p < 0 && errno == EINTR) continue;
    if (p <= 0) return;
    if (p == root && !*root_done) {
      *root_done = true;
      *root_status = st;
      if (ctx_.status.state != "stopped") ctx_.set_state_locked("exited");
    }
    if (busy) return;
  }
}

SuperviseOutcome SupervisorLoop::run(JobInfo info, UniqueFd out_r, UniqueFd err_r,
                                     const std::string& restored_from, CoordinatorOps ops,
                                     const std::function<void()>& on_started) {
  using Clock = std::chrono::steady_clock;
  SuperviseOutcome outcome;
  outcome.name = info.name;
  const pid_t root = info.root_pid;
  for (int fd : {out_r.get(), err_r.get()})
    if (fd >= 0) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  {
    std::lock_guard lk(ctx_.mu);
    ctx_.info = info;
    ctx_.rundir = rundir_.get();
    ctx_.wake_fd = wake_fd_.get();
    proto::JobStatus& s = ctx_.status;
    s.name = info.name;
    s.root_pid = root;
    s.supervisor_pid = ::getpid();
    s.argv = info.argv;
    s.cwd = info.cwd;
    s.owner_uid = info.owner_uid;
    s.started = static_cast<int64_t>(::time(nullptr));
    s.runtime_dir = rundir_->path();
    s.restored_from = restored_from;
    if (adopted_) keep_history(rundir_->job_json_path(), root, &s);
    // A job taken over from a dead supervisor may be suspended: cusnap
    // resume must be let through then.
    std::string err;
    // Checked writable before the job started (prepare); filled since.
    if (!ctx_.set_state_locked(adopted_ && job_suspended_now(info) ? "suspended" : "running", &err))
      std::fprintf(stderr,
                   "cusnap: warning: %s: cusnap ps, checkpoint and inspect cannot find job %s "
                   "until its state is written again\n",
                   err.c_str(), info.name.c_str());
  }
  // The guardian brings the job back if we die during an operation
  // (guardian.h); forked before any thread of ours starts. A guardian that
  // took the job over has one of its own too: killed during a later
  // operation, it would leave the job locked with nobody to bring it back.
  Guardian guardian;
  {
    std::string gerr;
    if (!guardian.start(info, out_r.get(), err_r.get(), rundir_->log_path(), rundir_->lock_fd(),
                        &gerr))
      outcome.warning = "no guardian for the job: " + gerr;
  }
  {
    Guardian* g = &guardian;
    auto checkpoint = ops.checkpoint;
    ops.checkpoint = [g, checkpoint](const JobInfo& j, const CheckpointOptions& o,
                                     const ProgressSink& p, CheckpointResult* r, std::string* e) {
      // What a guardian may remove if this supervisor dies before the
      // manifest: what is in the directory once this checkpoint claimed it
      // (made or found empty, and no other checkpoint's), never before: the
      // entries of a user's directory, or those of another checkpoint given
      // the same directory meanwhile, are not this run's.
      g->begin(guarded_operation("checkpoint", o.dir, false, o.timeout, o.settings));
      CheckpointOptions claimed = o;
      const GuardedOperation mine =
          guarded_operation("checkpoint", o.dir, true, o.timeout, o.settings);
      // Shared with on_dump: what it announces keeps dir_made.
      auto claimed_op = std::make_shared<GuardedOperation>(mine);
      claimed.on_claimed = [g, claimed_op](bool made) {
        claimed_op->dir_made = made;
        g->begin(*claimed_op);
      };
      claimed.on_dump = [g, claimed_op](const std::string& log_path,
                                        const std::string& network_lock) {
        GuardedOperation op = *claimed_op;
        op.dump_log = log_path;
        op.network_lock = network_lock;
        g->begin(op);
      };
      bool ok = checkpoint(j, claimed, p, r, e);
      g->end();
      return ok;
    };
    // Suspend and resume keep their state in the runtime directory.
    auto guarded = [g](const char* op, auto inner) {
      return [g, op, inner](const JobInfo& j, std::chrono::milliseconds timeout,
                            const proto::Settings& settings, auto... a) {
        // A job left suspended keeps its saved memory where the marker
        // says, which the guardian reads from the file; a marker that could
        // not be written is known to this process alone (left_suspended.cpp),
        // so its place is passed on here.
        engine_detail::LeftSuspended left;
        const std::string state_dir = engine_detail::read_left_suspended(j, &left)
                                          ? left.state_dir
                                          : engine_detail::suspend_state_dir(j);
        g->begin(guarded_operation(op, state_dir, false, timeout, settings));
        bool ok = inner(j, timeout, settings, a...);
        g->end();
        return ok;
      };
    };
    ops.suspend = guarded("suspend", ops.suspend);
    ops.resume = guarded("resume", ops.resume);
  }
  ControlServer server(&ctx_, std::move(ops), std::move(listen_fd_), cfg_.control_timeout);
  std::string err;
  if (!server.start(&err)) {
    // The job runs on without a control socket rather than being abandoned.
    outcome.warning = "the control socket was not served: " + err;
  }
  if (on_started) on_started();

  // The echo writes from a thread of its own (output_echo.h): a reader that
  // stops reading holds the job back but never this loop.
  OutputEcho echo(wake_fd_.get(), kEchoCapacity);
  if (cfg_.echo_output && !echo.start(&err) && outcome.warning.empty())
    outcome.warning = "the job's output is echoed in the supervisor's loop: " + err;
  bool root_done = false;
  int root_status = 0;
  Clock::time_point drain_deadline{};
  std::vector<char> buf(1 << 16);
  int last_echo_fd = -1;       // the stream the job's output went to last
  char last_echo_byte = '\n';  // and its last byte
  for (;;) {
    reap(root, &root_done, &root_status);
    // An adopted job's root is not our child: it is gone when it no longer
    // exists (its status went to whoever reaped it).
    if (adopted_ && !root_done && ::kill(root, 0) != 0 && errno == ESRCH) {
      root_done = true;
      std::lock_guard lk(ctx_.mu);
      if (ctx_.status.state != "stopped") ctx_.set_state_locked("exited");
    }
    bool idle;
    {
      std::lock_guard lk(ctx_.mu);
      idle = ctx_.engine_op.empty() && ctx_.replies_pending == 0;
    }
    const bool echo_full = echo.full();  // never, when nothing is echoed
    if (root_done && (drain_deadline == Clock::time_point{} || echo_full))
      drain_deadline = Clock::now() + cfg_.drain_grace;  // the grace runs while we can read
    if (root_done && idle && ((!out_r && !err_r) || Clock::now() >= drain_deadline)) break;

    pollfd p[4] = {{sig_r_.get(), POLLIN, 0},
                   {wake_fd_.get(), POLLIN, 0},
                   {echo_full ? -1 : out_r.get(), POLLIN, 0},
                   {echo_full ? -1 : err_r.get(), POLLIN, 0}};
    int timeout_ms = adopted_ ? 200 : 1000;
    if (root_done) {
      auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(drain_deadline - Clock::now());
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1000));
      if (timeout_ms == 0) timeout_ms = 200;  // waiting for the engine call to end
    }
    if (::poll(p, 4, timeout_ms) < 0 && errno != EINTR) break;
    if (p[0].revents & POLLIN) {
      unsigned char sigs[64];
      ssize_t n;
      while ((n = ::read(sig_r_.get(), sigs, sizeof sigs)) > 0) {
        for (ssize_t i = 0; i < n; ++i) {
          int sig = sigs[i];
          if (!forwarded(sig)) continue;
          // The job is a session (and process group) leader; after its root
          // is gone, the rest of the group still gets the signal.
          if (::kill(-root, sig) != 0 && !root_done) ::kill(root, sig);
        }
      }
    }
    if (p[1].revents & POLLIN) {
      uint64_t v;
      while (::read(wake_fd_.get(), &v, sizeof v) > 0) {
      }
    }
    for (int i = 0; i < 2; ++i) {
      UniqueFd& src = i == 0 ? out_r : err_r;
      const int echo_fd = i == 0 ? STDOUT_FILENO : STDERR_FILENO;
      if (!src || !(p[2 + i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      for (int rounds = 0; rounds < 16; ++rounds) {
        if (echo.full()) break;  // its reader is behind: so is the job
        ssize_t n = ::read(src.get(), buf.data(), buf.size());
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) break;  // EAGAIN: drained for now
        if (n == 0) {
          src.reset();
          break;
        }
        log_output(buf.data(), static_cast<size_t>(n));
        // A reader that went away ends only its echo; the log keeps the rest.
        if (cfg_.echo_output) echo.push(echo_fd, buf.data(), static_cast<size_t>(n));
        last_echo_fd = echo_fd;
        last_echo_byte = buf[static_cast<size_t>(n) - 1];
      }
    }
  }
  bool stopped;
  {
    std::lock_guard lk(ctx_.mu);
    stopped = !ctx_.stopped_dir.empty();
  }
  if (!stopped) {
    const std::string ended = end_leftovers(root, guardian.pid(), cfg_.drain_grace);
    if (!ended.empty()) {
      const std::string line = "cusnap: " + ended + "\n";
      log_output(line.data(), line.size());
      if (outcome.warning.empty()) outcome.warning = ended;
    }
  }
  // What the echo still holds goes out while the job stays listed (exited).
  echo.finish();
  outcome.output_mid_line =
      cfg_.echo_output && last_echo_byte != '\n' &&
      (last_echo_fd == STDERR_FILENO || same_file(STDOUT_FILENO, STDERR_FILENO));
  server.stop();
  guardian.dismiss();
  reap(root, &root_done, &root_status);
  {
    std::lock_guard lk(ctx_.mu);
    if (!ctx_.stopped_dir.empty()) outcome.stopped_dir = ctx_.stopped_dir;
  }
  if (!outcome.stopped_dir.empty())
    outcome.exit_code = kExitOk;
  else if (WIFEXITED(root_status))
    outcome.exit_code = WEXITSTATUS(root_status);
  else if (WIFSIGNALED(root_status))
    outcome.exit_code = 128 + WTERMSIG(root_status);
  else
    outcome.exit_code = kExitFailure;
  rundir_->remove();
  return outcome;
}

}  // namespace cusnap
