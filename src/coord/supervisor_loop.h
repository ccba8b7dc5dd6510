// The part of supervision that launch and restore share: a prepared runtime
// directory, control socket, log and signal handling, then the main loop.
// Internal to src/coord (supervisor.h is the interface).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "coord/control_server.h"
#include "coord/runtime_dir.h"
#include "coord/supervisor.h"
#include "proto/unique_fd.h"

namespace cusnap {

class SupervisorLoop {
 public:
  /// Reserves the runtime directory for name, binds control.sock (0600),
  /// creates output.log, becomes child subreaper and catches SIGCHLD, SIGINT,
  /// SIGTERM, SIGHUP and SIGPIPE (handlers, not blocked signals, so that
  /// children start with a clean mask). On failure fills *fail.
  static bool prepare(const SupervisorConfig& cfg, const std::string& name,
                      std::unique_ptr<SupervisorLoop>* out, SuperviseOutcome* fail);
  /// The same for a job whose supervisor died (guardian.h): takes over its
  /// runtime directory, whose lock lock_fd already holds (it stays the
  /// caller's: the loop holds a duplicate), binds a new
  /// control.sock and appends to output.log. run() then watches the job's
  /// root through a pidfd (it is not our child) and cannot know its status.
  static bool adopt(const SupervisorConfig& cfg, const std::string& path, int lock_fd,
                    std::unique_ptr<SupervisorLoop>* out, SuperviseOutcome* fail);
  ~SupervisorLoop();

  RuntimeDir& rundir() { return *rundir_; }

  /// Before run(), on a failure: closes the control socket, output.log and
  /// the signal descriptors, then removes the runtime directory. In that
  /// order, so that the removal (which opens the directory) has descriptors
  /// to work with when what failed was running out of them.
  void discard();

  /// Supervises the job whose root is info.root_pid (our child) and whose
  /// stdout/stderr arrive on out_r/err_r, until it ends. Removes the runtime
  /// directory at the end. on_started runs once job.json is written and the
  /// control socket is served (so ps and the other commands find the job).
  SuperviseOutcome run(JobInfo info, UniqueFd out_r, UniqueFd err_r,
                       const std::string& restored_from, CoordinatorOps ops,
                       const std::function<void()>& on_started = {});

  /// Before run: the first SIGINT, SIGTERM or SIGHUP that arrived since
  /// prepare (or the last call), or 0; what it reads is not forwarded to the
  /// job (a restore stopped before it started anything).
  int take_signal();

  /// Resets the dispositions prepare() changed; for a child before exec.
  static void reset_signals_in_child();

 private:
  SupervisorLoop() = default;
  void reap(pid_t root, bool* root_done, int* root_status);

  /// Sets the handlers prepare() and adopt() install.
  bool install_handlers(SuperviseOutcome* fail);
  /// Appends the job's output to output.log; past the cap
  /// ($CUSNAP_OUTPUT_LOG_MIB) it becomes output.log.1 and a new one starts,
  /// so that a chatty job does not fill the runtime base (a tmpfs in RAM).
  void log_output(const char* data, size_t n);

  SupervisorConfig cfg_;
  bool adopted_ = false;
  std::unique_ptr<RuntimeDir> rundir_;
  UniqueFd listen_fd_, log_fd_, sig_r_, sig_w_, wake_fd_;
  uint64_t log_size_ = 0;  ///< bytes in output.log
  uint64_t log_cap_ = 0;   ///< 0: no cap
  JobContext ctx_;
};

/// "pipe:[N]" for the pipe fd belongs to, as CRIU names it; empty on error.
std::string pipe_id(int fd);

}  // namespace cusnap
