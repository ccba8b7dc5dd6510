// The supervisor: the `cusnap` process that owns a job (launch, or restore
// after a restore). It is the job's child subreaper, forwards SIGINT, SIGTERM
// and SIGHUP to the job's process group, copies the job's stdout and stderr
// into output.log in the runtime directory and onto its own, reaps every
// child, serves the control socket from the coordinator thread
// (control_server.h) and ends with the job.
//
// Reaping: while an engine call runs, the engine may have children of its
// own (CRIU) that it waits for, so the main loop then reaps only the job's
// root; everything else is reaped as soon as the call ends. Nothing that
// exited is left a zombie once the supervisor is idle, so no stale pid blocks
// a later CRIU restore.
//
// Only src/cli prints: these functions return what happened.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "coord/coordinator_ops.h"
#include "coord/engine.h"
#include "proto/wire.h"

namespace cusnap {

struct SupervisorConfig {
  std::string name;         ///< job name; empty: derived from the command (launch) or the manifest
  std::string runtime_dir;  ///< explicit runtime directory; empty: BASE/NAME (runtime_dir.h)
  std::chrono::milliseconds control_timeout = proto::kDefaultTimeout;
  bool echo_output = true;  ///< copy the job's output to our stdout/stderr (besides the log)
  /// After the job's root exited: how long to keep copying output while other
  /// processes still hold its pipes, and how long each process of the job
  /// still running has between SIGTERM and SIGKILL. The supervisor sets it
  /// from $CUSNAP_EXIT_GRACE_MS (proto::kExitGraceMs).
  std::chrono::milliseconds drain_grace{2000};
};

/// How supervision ended.
struct SuperviseOutcome {
  int exit_code = 0;    ///< what cusnap exits with: the job's status, 128+signal, or an ExitCode
  std::string error;    ///< non-empty: cusnap itself failed (the job may not have run)
  std::string warning;  ///< non-empty: the job ran, but something of cusnap's did not work
  std::string name;     ///< the job's name
  std::string
      stopped_dir;        ///< non-empty: a checkpoint into this directory stopped the job (exit 0)
  bool detached = false;  ///< restore --detach, in the command's process: the job runs on
  /// The job's output echoed last ended mid-line on stderr, or on a stdout
  /// that is the same file: cusnap's own closing line starts a new one.
  bool output_mid_line = false;
};

struct LaunchRequest {
  SupervisorConfig cfg;
  std::vector<std::string> argv;
  bool use_shim = true;
  /// Install the seccomp filter of seccomp_filter.h in the job before exec.
  bool strict = false;
  /// Called with the job's name once it is reserved, before the job starts
  /// (the name cusnap chose when cfg.name is empty).
  std::function<void(const std::string& name)> on_named;
};

/// cusnap launch: starts the job and supervises it until it ends.
SuperviseOutcome launch_job(const LaunchRequest& req);

/// The shim the job preloads, in *path: $CUSNAP_SHIM (made absolute), else
/// ../lib/libcusnap_shim.so beside the cusnap executable, empty when that
/// file does not exist. false and *err (naming the variable) when
/// CUSNAP_SHIM is set to something the dynamic loader cannot preload.
bool find_shim(std::string* path, std::string* err);
/// LD_PRELOAD for the job: shim first, then what was there.
std::string preload_with(const std::string& shim, const char* existing);

/// What a successful restore reports before supervision starts.
struct RestoreSummary {
  std::string name, dir, runtime_dir;
  pid_t root_pid = 0;
  PhaseTimes phases;
  std::vector<std::pair<std::string, std::string>> gpu_moves;  ///< RestoreResult's
  bool gpu_moves_known = true;  ///< false: a summary the command made up (no result came)
};

struct RestoreRequest {
  SupervisorConfig cfg;
  RestoreOptions engine;  ///< dir, device_map, timeout (stdout_fd/stderr_fd filled in here)
  bool detach = false;
  ProgressSink progress;
  std::function<void(const RestoreSummary&)> on_restored;  ///< in the command's process
};

/// cusnap restore: restores DIR as a child of this process and supervises it
/// until it ends; with detach, a background process does so and this returns
/// once the restore succeeded or failed (outcome.detached on success).
SuperviseOutcome restore_and_supervise(const RestoreRequest& req);

}  // namespace cusnap
