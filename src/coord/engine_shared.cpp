// The engine's shared-memory phases (engine_internal.h): what checkpoint and
// suspend do before the driver checkpoint, and the rebuild after the driver
// brought a job back in place.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "coord/engine_internal.h"
#include "coord/procs.h"
#include "coord/rank_gpus.h"
#include "coord/settings.h"
#include "proto/wire.h"

namespace cusnap::engine_detail {

std::string shim_dir_of(const JobInfo& job) {
  return job.shim_dir.empty() ? job.runtime_dir : job.shim_dir;
}

SharedTimeouts shared_timeouts(std::chrono::milliseconds phase) {
  SharedTimeouts t;
  t.control = proto::control_timeout_from_env();
  t.phase = phase;
  return t;
}

bool shared_prepare(const JobInfo& job, const JobScan& scan, std::chrono::milliseconds timeout,
                    const proto::Settings& settings, const char* operation,
                    const std::string& state_dir, const ProgressSink& progress, SharedMemory* sm,
                    ExitCode* code, std::string* err) {
  auto report = [&](const char* phase) {
    if (progress) progress(Progress{phase, 0, 0});
  };
  *code = kExitRefused;
  std::string why;
  if (!sm->inspect(shim_dir_of(job), scan.cuda, shared_timeouts(timeout), &why)) {
    sm->disconnect();
    *err = "job " + job.name + ", inspect phase: " + why;
    return false;
  }
  std::vector<pid_t> pids;
  for (const ProcessInfo& p : scan.procs) pids.push_back(p.pid);
  std::string what;
  // NCCL ranks need the cut, which only the shims' tracking can make.
  if (job_uses_nccl_between_processes(scan.cuda, &what)) {
    const std::vector<pid_t> tracked = sm->processes();
    for (pid_t pid : scan.cuda) {
      if (std::find(tracked.begin(), tracked.end(), pid) != tracked.end()) continue;
      sm->disconnect();
      *err = "job " + job.name + ": " + what + ", but process " + std::to_string(pid) +
             " runs without the cusnap shim's tracking (started outside cusnap launch, or with "
             "CUSNAP_SHIM_TRACK=0); without it no consistent cut across the ranks can be made "
             "and the driver's checkpoint hangs on a collective in flight, so " +
             operation + " is refused";
      return false;
    }
  }
  // Ranks that share a GPU do not survive the driver's restore (rank_gpus.h).
  bool allow_shared_gpu = false;
  if (!ranks_sharing_gpu_allowed(setting(settings, "CUSNAP_ALLOW_RANKS_SHARING_GPU"),
                                 &allow_shared_gpu, err)) {
    sm->disconnect();
    return refused_setting(settings, "CUSNAP_ALLOW_RANKS_SHARING_GPU", err);
  }
  if (!allow_shared_gpu) {
    std::map<pid_t, std::vector<std::string>> devices;
    if (!sm->collective_devices(&devices, &why)) {
      sm->disconnect();
      *code = kExitFailure;
      *err = "job " + job.name + ": " + why + "\nthe job runs on unchanged";
      return false;
    }
    if (ranks_share_gpu(devices, &what)) {
      sm->disconnect();
      *err = "job " + job.name + ": " + what +
             "; after the driver's restore such ranks cannot share the GPU (its restored "
             "contexts are not time-sliced while a collective waits: the kernels fail), so " +
             operation +
             " is refused and the job runs on unchanged. Run one rank per GPU "
             "(CUSNAP_ALLOW_RANKS_SHARING_GPU=1 tries anyway)";
      return false;
    }
  }
  // Collective kernels in flight must be lined up before anything closes.
  *code = kExitFailure;
  report("cut");
  if (!sm->cut(&why)) {
    // Unless a process could not be told to let the cut go (its collective
    // launches stay held until its shim drops the cut: the message says so).
    const bool held = sm->cut_left_armed();
    sm->disconnect();
    *err = "job " + job.name + ": " + why + (held ? "" : "\nthe job runs on unchanged");
    return false;
  }
  *code = kExitRefused;
  if (!sm->active()) {
    sm->disconnect();
    if (job_shares_device_memory(pids, &what)) {
      *err = "job " + job.name + " shares device memory between processes (" + what +
             ") without the cusnap shim's tracking in them (started outside cusnap launch, or "
             "with CUSNAP_SHIM_TRACK=0); the driver's process checkpoint cannot restore shared "
             "device memory, so " +
             operation + " would lose the job. Launch the job with cusnap launch and tracking on";
      return false;
    }
    return true;
  }

  // From here the job changes: every failure rolls back. A stream capture
  // under way must end before the device is drained (its synchronization
  // would invalidate the capture): a drain refused for one opens the gates
  // again, keeping the cut, so that the capture goes on and its thread then
  // holds at its next collective launch; the quiesce is tried again until
  // the timeout.
  *code = kExitFailure;
  report("quiesce");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(5);
  for (;;) {
    const int retries = sm->capture_retries();
    if (sm->quiesce(&why)) break;
    const bool capturing = sm->capture_retries() > retries;
    if (!capturing || std::chrono::steady_clock::now() + pause >= deadline) {
      if (capturing) {
        const int tries = sm->capture_retries();
        why += " (tried " + std::to_string(tries) + " time" + (tries == 1 ? "" : "s") +
               " within the timeout of " + std::to_string(timeout.count()) +
               " ms; a longer --timeout gives the capture more time to end)";
        sm->cut_release(&why);  // a process it could not reach is named in why
      }
      // A gate that would not open again holds that process's CUDA calls:
      // the job did not run on unchanged. The caller marks it left
      // suspended, so that cusnap resume opens the gate (recover_job).
      // Nor did it where a process could not be told to let the cut go: its
      // collective launches stay held until its shim drops the cut (why says so).
      const bool gate_closed = !sm->gates_left_closed().empty();
      const bool held = sm->cut_left_armed();
      sm->disconnect();
      if (gate_closed) *code = kExitJobLost;
      *err = "job " + job.name + ": " + why +
             (gate_closed || held ? "" : "\nthe job runs on unchanged");
      return false;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
  auto back = [&](const std::string& failure, bool rebuild) {
    std::string rb;
    bool ok = rebuild ? shared_rebuild_in_place(job, sm, state_dir, timeout, progress, &rb)
                      : sm->open_gates(&rb);
    sm->disconnect();
    *err = "job " + job.name + ": " + failure +
           (ok ? "\nthe job runs on unchanged" : "\nbringing its shared memory back failed: " + rb);
    if (!ok) *code = kExitJobLost;
    return false;
  };
  if (!sm->save(state_dir, progress, &why)) return back(why, false);
  report("release");
  if (!sm->release(&why)) return back(why, true);
  // Whatever still shares memory now does it outside the shims.
  if (job_shares_device_memory(pids, &what))
    return back("after the release, processes still share device memory (" + what +
                    "): a process of the job shares it without the cusnap shim's tracking, so " +
                    operation + " is refused",
                true);
  // CRIU must find no connection to outside the job.
  sm->disconnect();
  return true;
}

bool shared_rebuild_saved(const JobInfo& job, const std::string& state_dir,
                          std::chrono::milliseconds timeout, std::vector<pid_t>* pids,
                          std::string* err) {
  *pids = saved_shim_processes(state_dir);
  if (pids->empty()) return true;
  SharedMemory shared;
  return shared.load_records(state_dir, *pids, err) &&
         shared_rebuild_in_place(job, &shared, state_dir, timeout, {}, err);
}

bool shared_rebuild_in_place(const JobInfo& job, SharedMemory* sm, const std::string& state_dir,
                             std::chrono::milliseconds timeout, const ProgressSink& progress,
                             std::string* err) {
  if (!sm->active()) return true;
  std::string first;
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::string why;
    sm->disconnect();
    if (sm->reconnect(shim_dir_of(job), shared_timeouts(timeout), &why) &&
        sm->rebuild(state_dir, progress, &why)) {
      bool ok = sm->open_gates(&why);
      sm->disconnect();
      if (!ok) *err = "opening the gates: " + why;
      return ok;
    }
    if (attempt == 0)
      first = why;
    else
      *err = first + "; once more: " + why;
  }
  sm->disconnect();
  return false;
}

}  // namespace cusnap::engine_detail
