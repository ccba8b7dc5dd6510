// cusnap restore: restore a checkpoint as our child and supervise it, here or
// (--detach) in a background process.
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "coord/engine_internal.h"
#include "coord/manifest.h"
#include "coord/restore_report.h"
#include "coord/runtime_dir.h"
#include "coord/supervisor.h"
#include "coord/supervisor_loop.h"
#include "proto/control.h"

namespace cusnap {
namespace {

/// The path a restored job's shims know as their runtime directory. Their
/// listening sockets are bound there, and CRIU binds them again on restore, so
/// the path must exist: when the job is restored under another name or runtime
/// base, or the original directory is gone, it is made a symbolic link to the
/// new runtime directory for as long as the job is supervised here. Directories
/// created on the way are removed again with the link.
class ShimDirLink {
 public:
  ShimDirLink() = default;
  ShimDirLink(const ShimDirLink&) = delete;
  ShimDirLink& operator=(const ShimDirLink&) = delete;
  ~ShimDirLink() {
    // As RuntimeDir::remove does for its own link: only while it still points here.
    if (!link_.empty() && points_to(link_, target_)) ::unlink(link_.c_str());
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) ::rmdir(it->c_str());
  }

  bool make(const std::string& shim_dir, const std::string& rundir, std::string* err) {
    if (shim_dir.empty() || shim_dir == rundir) return true;
    if (shim_dir[0] != '/' || shim_dir.find("/../") != std::string::npos ||
        shim_dir.ends_with("/..")) {
      *err = "the checkpoint names the shims' runtime directory '" + shim_dir +
             "', which is not a plain absolute path: the manifest was altered";
      return false;
    }
    struct stat st;
    if (::lstat(shim_dir.c_str(), &st) == 0) {
      // CRIU binds the sockets inside it; a live job's would remove them
      // when that job ends (remove_job_dir), cutting this one's shims off.
      if (S_ISDIR(st.st_mode) && runtime_dir_live(shim_dir)) {
        *err = "the checkpointed job's runtime directory " + shim_dir +
               " (where its shims' sockets are bound again) is now that of a running job (the "
               "original, or another with its name): stop that job, or restore this checkpoint "
               "once it has ended";
        return false;
      }
      // Nor one whose job runs on without its supervisor (cusnap ps): the
      // next ps after that job ends removes the directory.
      if (JobEntry other;
          S_ISDIR(st.st_mode) && holds_lock_file(shim_dir) && runs_unsupervised(shim_dir, &other)) {
        *err = "the checkpointed job's runtime directory " + shim_dir +
               " (where its shims' sockets are bound again) is that of job " + other.status.name +
               ", whose process " + std::to_string(other.status.root_pid) +
               " runs on without a supervisor (cusnap ps says more): end it, then restore";
        return false;
      }
      if (S_ISDIR(st.st_mode)) return true;
      if (S_ISLNK(st.st_mode) && points_to(shim_dir, rundir)) return true;
      if (!S_ISLNK(st.st_mode)) {
        *err = "the job's shims had their sockets in " + shim_dir +
               ", which exists and is not a directory; remove it or restore elsewhere";
        return false;
      }
      // A link another restore made: while its job runs, its shims listen
      // through it (the same checkpoint, restored and still running, whose
      // processes also hold the pids this restore needs); a dead one's is
      // replaced.
      char target[4096];
      const ssize_t n = ::readlink(shim_dir.c_str(), target, sizeof target - 1);
      const std::string to = n > 0 ? std::string(target, size_t(n)) : "";
      if (!to.empty() && runtime_dir_live(to)) {
        *err = "the job's shims had their sockets in " + shim_dir +
               ", which links to the runtime directory of a running job (" + to +
               "), likely restored from this checkpoint too: stop that job before restoring "
               "this checkpoint again (removing the link would cut its shims off)";
        return false;
      }
      // Only a link a restore made is replaced: one to a runtime directory
      // (which holds its lock file) of a job no longer running, or to one
      // gone since. Any other is the system's or a user's, which a
      // checkpoint (its manifest can be edited) must not remove.
      struct stat tst;
      const bool absolute = !to.empty() && to[0] == '/';
      const bool gone = absolute && ::stat(to.c_str(), &tst) != 0 && errno == ENOENT;
      const bool dead_rundir = absolute && holds_lock_file(to);
      if (!gone && !dead_rundir) {
        *err = "the job's shims had their sockets in " + shim_dir + ", which is a link to " +
               (to.empty() ? std::string("nothing readable") : to) +
               ", not to a cusnap runtime directory: cusnap replaces only a link a restore made; "
               "if this one is stale, remove it and restore again";
        return false;
      }
      if (::unlink(shim_dir.c_str()) != 0 && errno != ENOENT) {
        *err = "cannot remove the stale link " + shim_dir +
               " for the shims' sockets: " + std::strerror(errno);
        return false;
      }
    }
    for (size_t pos = 1; (pos = shim_dir.find('/', pos)) != std::string::npos; ++pos) {
      std::string parent = shim_dir.substr(0, pos);
      if (::mkdir(parent.c_str(), 0700) == 0) {
        made_.push_back(parent);
      } else if (errno != EEXIST) {
        *err = "cannot create " + parent + " for the shims' sockets: " + std::strerror(errno);
        return false;
      }
    }
    if (::symlink(rundir.c_str(), shim_dir.c_str()) != 0) {
      *err = "cannot link " + shim_dir + " to " + rundir + " for the shims' sockets: " +
             std::strerror(errno);
      return false;
    }
    link_ = shim_dir;
    target_ = rundir;
    return true;
  }

 private:
  static bool points_to(const std::string& link, const std::string& target) {
    char buf[4096];
    ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
    return n >= 0 && std::string(buf, size_t(n)) == target;
  }

  std::string link_, target_;
  std::vector<std::string> made_;
};

/// Restores and supervises in this process.
SuperviseOutcome restore_here(const RestoreRequest& req) {
  SuperviseOutcome fail;
  fail.exit_code = kExitBadCheckpoint;
  Manifest m;
  std::string err;
  if (ExitCode code = kExitBadCheckpoint; !read_manifest_coded(req.engine.dir, &m, &code, &err)) {
    // This reader's failure (out of descriptors, say) is no bad checkpoint.
    fail.exit_code = code;
    fail.error = code == kExitFailure ? "cannot restore " + req.engine.dir + ": " + err
                                      : req.engine.dir + " is not a usable checkpoint: " + err;
    return fail;
  }
  // The name first: a refusal should not wait for restore_job's checksums.
  const std::string name = req.cfg.name.empty() ? m.job.name : req.cfg.name;
  if (std::string why; req.cfg.name.empty() && !valid_job_name(name, &why)) {
    fail.error = req.engine.dir +
                 ": the job name in its manifest is not a valid job name (1 to 64 letters, "
                 "digits, '.', '_' or '-'); restore it with --name NAME";
    return fail;  // kExitBadCheckpoint
  }
  // Before the runtime directory and the shims' link: a user who may not
  // restore is told so, not that a link in root's directory failed.
  if (!engine_detail::require_root("restore", engine_detail::kRootForRestore, &fail.error)) {
    fail.exit_code = kExitRefused;
    return fail;
  }
  // Before the shims' link, which the manifest names: nothing on this
  // machine is changed for a checkpoint another user could have written.
  if (!checkpoint_dir_private(req.engine.dir, &fail.error)) {
    fail.exit_code = kExitRefused;
    return fail;
  }
  std::unique_ptr<SupervisorLoop> sup;
  if (!SupervisorLoop::prepare(req.cfg, name, &sup, &fail)) return fail;
  UniqueFd out_r, out_w, err_r, err_w;
  // Ours closed before the directory is removed: the failure may have been
  // running out of descriptors (SupervisorLoop::discard).
  auto failed = [&](int code, std::string msg) {
    for (UniqueFd* fd : {&out_r, &out_w, &err_r, &err_w}) fd->reset();
    sup->discard();
    fail.exit_code = code;
    fail.error = std::move(msg);
    return fail;
  };
  if (!make_pipe(&out_r, &out_w, 0, "the job's output pipe", &err) ||
      !make_pipe(&err_r, &err_w, 0, "the job's output pipe", &err))
    return failed(kExitFailure, err);

  // Made once the checkpoint is verified: a damaged checkpoint is said to
  // be, before the user is asked to stop a running job for it.
  ShimDirLink shim_link;
  RestoreOptions opts = req.engine;
  opts.before_criu = [&](std::string* why) {
    return shim_link.make(m.job.shim_dir, sup->rundir().path(), why);
  };
  opts.stdout_fd = out_w.get();
  opts.stderr_fd = err_w.get();
  // Ctrl-C (or SIGTERM, SIGHUP) before CRIU starts stops the restore; from
  // then on it reaches the job once it is back.
  opts.interrupted = [&] { return sup->take_signal(); };
  RestoreResult res;
  if (!restore_job(opts, req.progress ? req.progress : ProgressSink([](const Progress&) {}), &res,
                   &err)) {
    if (res.interrupted_by) return failed(128 + res.interrupted_by, err);
    return failed(res.code == kExitOk ? kExitFailure : res.code, err);
  }
  out_w.reset();
  err_w.reset();

  JobInfo info = res.job;
  info.name = name;
  info.root_pid = res.root_pid;
  info.runtime_dir = sup->rundir().path();
  info.shim_dir = m.job.shim_dir.empty() ? info.runtime_dir : m.job.shim_dir;
  info.owner_uid = ::geteuid();
  info.stdout_pipe_id = pipe_id(out_r.get());
  info.stderr_pipe_id = pipe_id(err_r.get());
  RestoreSummary summary{name,         req.engine.dir, sup->rundir().path(),
                         res.root_pid, res.phases,     res.gpu_moves};
  return sup->run(std::move(info), std::move(out_r), std::move(err_r), req.engine.dir,
                  default_coordinator_ops(), [&] {
                    // The guardian runs now: it, no longer the watch, brings
                    // the job through this process's death.
                    if (res.watch) res.watch->dismiss();
                    if (req.on_restored) req.on_restored(summary);
                  });
}

/// /dev/null for the background supervisor's standard streams. Short of
/// descriptors, opened in place of its standard input, which it gives up
/// anyway: with its streams left on the terminal, its own error would be
/// said there besides the waiting command's. -1 when even that fails.
int open_devnull() {
  int fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (fd < 0 && out_of_descriptors(errno)) {
    ::close(STDIN_FILENO);
    fd = ::open("/dev/null", O_RDWR);  // the lowest free number: 0
  }
  return fd;
}

/// Points standard input, output and error at fd (open_devnull's), and
/// closes fd unless it is one of them.
void redirect_stdio_to(int fd) {
  if (fd < 0) return;
  for (int i = 0; i < 3; ++i)
    if (i != fd) ::dup2(fd, i);
  if (fd > 2) ::close(fd);
}

/// The background supervisor's side of --detach: reports progress and the
/// restore's result over ch, then supervises with output only in the log.
SuperviseOutcome detached_child(const RestoreRequest& req, proto::Channel ch) {
  // The waiting command's stderr, for the restore's watch alone (should this
  // process be killed mid-restore, the watch says what it did there); closed
  // once the restore ended, so that the command's stderr does not stay open
  // while the job runs.
  // /dev/null first: short of descriptors, the copy goes without.
  const int devnull = open_devnull();
  UniqueFd caller_err(::fcntl(2, F_DUPFD_CLOEXEC, 3));
  redirect_stdio_to(devnull);
  RestoreRequest r = req;
  r.detach = false;
  r.cfg.echo_output = false;
  if (caller_err) r.engine.report_fd = caller_err.get();
  std::string err;
  r.progress = [&](const Progress& p) {
    // A send that failed (the command gone, or stopped past the control
    // timeout) ends the reports: the next would each wait as long.
    if (ch.valid() && !ch.send(proto::kMsgProgress,
                               proto::ProgressEvent{p.phase, p.bytes_done, p.bytes_total}, &err))
      ch = proto::Channel();
  };
  r.on_restored = [&](const RestoreSummary& s) {
    caller_err.reset();
    ch.send(proto::kMsgResult, proto::Result{true, kExitOk, "", summary_to_json(s)}, &err);
    ch = proto::Channel();  // the command returns now
  };
  SuperviseOutcome out = restore_here(r);
  if (ch.valid())
    ch.send(proto::kMsgResult, proto::Result{false, out.exit_code, out.error, ""}, &err);
  return out;
}

SuperviseOutcome restore_detached(const RestoreRequest& req) {
  SuperviseOutcome out;
  std::string err;
  UniqueFd mine, theirs;
  if (!proto::socket_pair(&mine, &theirs, &err)) {
    out.exit_code = kExitFailure;
    out.error = err;
    return out;
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    out.exit_code = kExitFailure;
    out.error = std::string("fork: ") + std::strerror(errno);
    return out;
  }
  if (pid == 0) {
    SupervisorLoop::reset_signals_in_child();  // not the waiting command's handlers
    mine.reset();
    ::setsid();
    pid_t g = ::fork();
    if (g != 0) ::_exit(g < 0 ? kExitFailure : 0);
    return detached_child(req, proto::Channel(std::move(theirs), req.cfg.control_timeout));
  }
  theirs.reset();
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(st) && WEXITSTATUS(st) != 0) {
    // The background supervisor was never started: nothing was restored.
    out.exit_code = kExitFailure;
    out.error =
        "cannot start the background supervisor of the restore (fork failed): nothing "
        "was restored; try again once this machine has processes and memory to spare";
    return out;
  }
  // The job's name, for the message should no result come.
  std::string name = req.cfg.name;
  if (Manifest m;
      name.empty() && read_manifest(req.engine.dir, &m, &err) && valid_job_name(m.job.name, &err))
    name = m.job.name;
  // The restore reports progress as it goes; no fixed bound fits every size.
  proto::Channel ch(std::move(mine), std::chrono::hours(24));
  return await_detached_restore(ch, req.progress, req.on_restored, name, req.engine.dir);
}

}  // namespace

SuperviseOutcome restore_and_supervise(const RestoreRequest& req) {
  return req.detach ? restore_detached(req) : restore_here(req);
}

}  // namespace cusnap
