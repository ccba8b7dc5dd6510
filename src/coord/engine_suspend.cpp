// suspend_job / resume_job: the driver's lock + checkpoint in place, and
// back; the processes stay where they are. Shared device memory is saved
// into the job's runtime directory (suspended/) and released before the
// driver checkpoint, and rebuilt after the driver restore.
#include <cstdlib>
#include <filesystem>

#include "coord/engine_internal.h"
#include "coord/procs.h"
#include "coord/settings.h"

namespace cusnap {
using namespace engine_detail;

bool suspend_job_coded(const JobInfo& job, std::chrono::milliseconds timeout,
                       const proto::Settings& settings, SuspendResult* out, std::string* err) {
  ExitCode c = kExitRefused;
  // A cancel asked of this suspend (SuspendResult::cancel).
  CancelToken* cancel = out != nullptr ? out->cancel : nullptr;
  auto cancelled = [&] { return cancel != nullptr && cancel->requested(); };
  Driver driver;
  JobScan scan;
  bool ok = require_root("suspend", kRootForSupervisor, err) &&
            refuse_when_left_suspended(job, "suspend", err) &&
            scan_job(job, &driver, CU_PROCESS_STATE_RUNNING, "suspend", &scan, err) &&
            (note_gpu_use(job, scan.cuda, setting(settings, kRestoreMarginSetting), &driver, err) ||
             refused_setting(settings, kRestoreMarginSetting, err));
  driver.restore_memory().policy.origin = setting_origin(settings, kRestoreMarginSetting);
  if (ok && scan.cuda.empty()) {
    *err = "job " + job.name + " has no process using the GPU: nothing to suspend";
    ok = false;
  }
  if (ok && cancelled()) {
    *err = "job " + job.name + ": " + kCancelledReason + " after the check; nothing was changed";
    c = kExitFailure;
    ok = false;
  }
  // Shared memory is saved in the runtime directory while suspended.
  const std::string state = suspend_state_dir(job);
  SharedMemory shared;
  if (ok) {
    std::error_code ec;
    std::filesystem::remove_all(state, ec);
    ok = shared_prepare(job, scan, timeout, settings, "suspend", state, {}, &shared, &c, err);
    if (!ok && c == kExitJobLost) *err += leave_suspended(job, state, false, "suspend", *err);
    if (!ok && c != kExitJobLost) std::filesystem::remove_all(state, ec);
    if (out) {
      out->collective_cut = shared.cut_counts();
      out->capture_retries = shared.capture_retries();
    }
  }
  if (ok) {
    set_driver_deadlines(driver, timeout, scan.gpus);
    bool rolled_back = true;
    c = kExitFailure;
    // No process began to use the GPU or to share device memory since the
    // scan, once all are locked; none began to use the GPU, once all are
    // checkpointed (engine_checkpoint.cpp).
    // A cancel is looked at once every process is locked, and once each is
    // checkpointed, where the suspend commits: a cancel after that is too
    // late. driver_suspend_all rolls back.
    auto not_cancelled = [&](const char* when, std::string* why) {
      if (!cancelled()) return true;
      *why = std::string(kCancelledReason) + " " + when;
      return false;
    };
    ok = driver_suspend_all(
        driver, scan.cuda, timeout, &rolled_back, err,
        [&](std::string* why) {
          return job_unchanged_since_scan(job, driver, scan, &shared, "suspend", why) &&
                 not_cancelled("once the job was locked", why);
        },
        [&](std::string* why) {
          if (!no_new_cuda_processes(job, driver, scan, "suspend", why)) return false;
          if (cancel != nullptr && !cancel->commit()) {
            *why = std::string(kCancelledReason) + " after the driver checkpoint";
            return false;
          }
          return true;
        });
    if (ok) complete_gpu_use(job, &driver);
    if (!ok) {
      std::string rb;
      if (rolled_back && !shared_rebuild_in_place(job, &shared, state, timeout, {}, &rb)) {
        rolled_back = false;
        *err += "; bringing its shared memory back failed: " + rb;
      }
      *err = "job " + job.name + ": " + *err +
             (rolled_back
                  ? "; " + after_roll_back(job, scan.cuda)
                  : leave_suspended(job, state, false, "suspend", *err, driver.restore_refused()));
      if (!rolled_back) c = kExitJobLost;
      std::error_code ec;
      if (rolled_back) std::filesystem::remove_all(state, ec);
    }
  }
  if (out) out->code = ok ? kExitOk : c;
  return ok;
}

bool job_suspended_now(const JobInfo& job) {
  LeftSuspended left;
  if (read_left_suspended(job, &left)) return true;
  for (const ProcessInfo& p : list_job_processes(job.root_pid))
    if (p.cuda_state == "locked" || p.cuda_state == "checkpointed") return true;
  return false;
}

bool resume_job_coded(const JobInfo& job, std::chrono::milliseconds timeout,
                      const proto::Settings& settings, ExitCode* code, std::string* err) {
  ExitCode c = kExitRefused;
  bool ok = require_root("resume", kRootForSupervisor, err);
  // Left suspended by a failed roll back: the recovery takes every process
  // on from whatever state it is in, and the shared memory from where the
  // failed operation saved it.
  LeftSuspended left;
  if (ok && read_left_suspended(job, &left)) {
    // A bad margin is refused before anything is tried, as for a plain
    // resume (the guardian's own recovery takes the default instead: it must
    // not stop on a setting).
    if (RestoreMemoryPolicy policy;
        !restore_memory_policy(setting(settings, kRestoreMarginSetting), &policy, err)) {
      refused_setting(settings, kRestoreMarginSetting, err);
      if (code) *code = kExitRefused;
      return false;
    }
    std::string report;
    RecoverBlock blocked = RecoverBlock::kNone;
    ok = recover_job(job, left.state_dir, false, &report, timeout, &blocked,
                     setting(settings, kRestoreMarginSetting));
    if (!ok) {
      while (!report.empty() && report.back() == '\n') report.pop_back();
      *err = "job " + job.name + ", left suspended by a failed " +
             (left.operation.empty() ? "operation" : left.operation) +
             ": bringing it back failed:\n" + report +
             (blocked == RecoverBlock::kSavedMemoryGone
                  ? "\nthe job cannot be brought back without its saved shared memory" +
                        cannot_come_back(job)
              : blocked == RecoverBlock::kRestoreRefused
                  ? "\nthe driver will not restore its GPU state" + cannot_come_back(job)
              : blocked == RecoverBlock::kMemoryShort
                  ? "\nthe job stays suspended: run cusnap resume " + job.name +
                        " again once the memory is free"
                  : "\nthe job stays suspended: run cusnap resume " + job.name + " again");
    }
    // Memory found short before any restore: refused, as a resume of a job
    // suspended by cusnap suspend is (below); a restore the driver refused
    // now leaves the job one that cannot come back: lost, as below.
    if (code)
      *code = ok                                                                  ? kExitOk
              : blocked == RecoverBlock::kMemoryShort                             ? kExitRefused
              : blocked == RecoverBlock::kRestoreRefused && !left.restore_refused ? kExitJobLost
                                                                                  : kExitFailure;
    return ok;
  }
  Driver driver;
  std::vector<pid_t> cuda;
  std::vector<pid_t> failed;  // FAILED: the driver brings these back no more
  if (ok) ok = driver.load(err);
  if (ok)
    ok = load_gpu_use(job, setting(settings, kRestoreMarginSetting), &driver, err) ||
         refused_setting(settings, kRestoreMarginSetting, err);
  driver.restore_memory().policy.origin = setting_origin(settings, kRestoreMarginSetting);
  if (ok) {
    // A state that cannot be read is an error naming the call, not "not
    // suspended": the job may well be suspended.
    for (pid_t pid : process_tree(job.root_pid)) {
      ProcessInfo p;
      if (!read_process(pid, &p) || !p.uses_cuda) continue;
      CUprocessState st;
      std::string why;
      if (!driver.get_state(pid, &st, &why)) {
        if (driver.last_result() == CUDA_ERROR_NOT_INITIALIZED) continue;
        *err = "job " + job.name + ", process " + std::to_string(pid) + " (" + p.exe +
               "), inspect phase: " + why;
        ok = false;
        break;
      }
      // A failed one is handed on with the others: driver_resume_all says
      // it cannot come back (the resume fails), rather than the resume
      // succeeding with a process stopped for good.
      if (st == CU_PROCESS_STATE_LOCKED || st == CU_PROCESS_STATE_CHECKPOINTED ||
          st == CU_PROCESS_STATE_FAILED)
        cuda.push_back(pid);
      if (st == CU_PROCESS_STATE_FAILED) failed.push_back(pid);
    }
    if (ok && cuda.size() == failed.size() && !failed.empty()) {
      *err = "job " + job.name + ": the driver holds no process of it suspended, and process " +
             std::to_string(failed.front()) +
             " has its GPU state failed: the driver cannot bring it back; nothing was changed";
      ok = false;
    }
  }
  // The job is recorded suspended (the control server runs a resume only
  // then, or when the driver holds a process), but the driver runs every
  // process of it: its GPU state came back some other way (a resume whose
  // reply was lost, a tool calling the driver itself). Nothing to do in the
  // driver; shared memory saved by the suspend is still rebuilt below, and
  // the resume succeeds with a note, so that the job is recorded running
  // and can be suspended again.
  const bool driver_runs_all = ok && cuda.empty();
  if (ok && !driver_runs_all) {
    std::vector<GpuDevice> gpus;
    std::string ignored;
    driver.devices(&gpus, &ignored);
    set_driver_deadlines(driver, timeout, gpus);
  }
  if (ok && !driver_runs_all) {
    c = kExitFailure;
    // driver_resume_all goes in reverse: the last suspended comes back first.
    ok = driver_resume_all(driver, cuda, {}, err);
    if (!ok && driver.restore_memory().fell_short) {
      c = kExitRefused;  // nothing was restored
      *err = "job " + job.name + ": " + *err + "\nthe job stays suspended; run cusnap resume " +
             job.name + " again once the memory is free";
    } else if (!ok && driver.restore_refused()) {
      // The driver never restores the process again: marked like a job a
      // failed roll back left suspended, so that ps and inspect say it
      // cannot come back, and checkpoint and suspend say why they refuse.
      c = kExitJobLost;
      const std::string why = *err;
      *err = "job " + job.name + ": " + why +
             leave_suspended(job, suspend_state_dir(job), false, "resume", why, true);
    } else if (!ok) {
      *err = "job " + job.name + ": " + *err;
    }
  }
  // Shared memory saved by suspend comes back once the driver state did.
  if (ok) {
    const std::string state = suspend_state_dir(job);
    std::vector<pid_t> shim_pids;
    std::string why;
    if (!shared_rebuild_saved(job, state, timeout, &shim_pids, &why)) {
      // The driver state is back, the shared memory not: marked left
      // suspended, so that the next resume takes the job on from here
      // (recover_job rebuilds from the saved bytes and opens the gates)
      // instead of finding nothing suspended.
      *err = "job " + job.name + ", shared memory: " + why +
             leave_suspended(job, state, false, "resume", why);
      c = kExitJobLost;
      ok = false;
    } else if (!shim_pids.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(state, ec);
    }
    if (ok && driver_runs_all)
      *err = "job " + job.name +
             " was recorded suspended, but the driver already runs every process of it (its GPU "
             "state was brought back outside this resume): nothing to restore" +
             (shim_pids.empty() ? std::string() : "; its shared memory was brought back") +
             "; recorded running";
  }
  if (code) *code = ok ? kExitOk : c;
  return ok;
}

bool suspend_job(const JobInfo& job, std::chrono::milliseconds timeout, std::string* err) {
  return suspend_job_coded(job, timeout, {}, nullptr, err);
}

bool resume_job(const JobInfo& job, std::chrono::milliseconds timeout, std::string* err) {
  return resume_job_coded(job, timeout, {}, nullptr, err);
}

}  // namespace cusnap
