// suspend_job / resume_job: the driver's lock + checkpoint in place, and
// back; the processes stay where they are.
#include "coord/engine_internal.h"
#include "coord/procs.h"

namespace cusnap {
using namespace engine_detail;

bool suspend_job_coded(const JobInfo& job, std::chrono::milliseconds timeout, ExitCode* code,
                       std::string* err) {
  ExitCode c = kExitRefused;
  Driver driver;
  JobScan scan;
  bool ok = require_root("suspend", err) &&
            scan_job(job, &driver, CU_PROCESS_STATE_RUNNING, "suspend", &scan, err);
  if (ok && scan.cuda.empty()) {
    *err = "job " + job.name + " has no process using the GPU: nothing to suspend";
    ok = false;
  }
  if (ok) {
    driver.set_call_deadline(driver_deadline(timeout, scan.gpus));
    bool rolled_back = true;
    c = kExitFailure;
    ok = driver_suspend_all(driver, scan.cuda, timeout, &rolled_back, err);
    if (!ok) {
      *err = "job " + job.name + ": " + *err +
             (rolled_back ? "; the job runs on unchanged" : "; the job's GPU state is lost");
      if (!rolled_back) c = kExitJobLost;
    }
  }
  if (code) *code = ok ? kExitOk : c;
  return ok;
}

bool resume_job_coded(const JobInfo& job, std::chrono::milliseconds timeout, ExitCode* code,
                      std::string* err) {
  ExitCode c = kExitRefused;
  bool ok = require_root("resume", err);
  Driver driver;
  std::vector<pid_t> cuda;
  if (ok) ok = driver.load(err);
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
      if (st == CU_PROCESS_STATE_LOCKED || st == CU_PROCESS_STATE_CHECKPOINTED) cuda.push_back(pid);
    }
    if (ok && cuda.empty()) {
      *err = "job " + job.name + " is not suspended: no process has its GPU state released";
      ok = false;
    }
  }
  if (ok) {
    std::vector<GpuDevice> gpus;
    std::string ignored;
    driver.devices(&gpus, &ignored);
    driver.set_call_deadline(driver_deadline(timeout, gpus));
  }
  if (ok) {
    c = kExitFailure;
    // driver_resume_all goes in reverse: the last suspended comes back first.
    ok = driver_resume_all(driver, cuda, {}, err);
    if (!ok) *err = "job " + job.name + ": " + *err;
  }
  if (code) *code = ok ? kExitOk : c;
  return ok;
}

bool suspend_job(const JobInfo& job, std::chrono::milliseconds timeout, std::string* err) {
  return suspend_job_coded(job, timeout, nullptr, err);
}

bool resume_job(const JobInfo& job, std::chrono::milliseconds timeout, std::string* err) {
  return resume_job_coded(job, timeout, nullptr, err);
}

}  // namespace cusnap
