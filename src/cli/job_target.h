// Finding the job a command names (by name, pid or runtime
// directory) and asking its supervisor for something.
#pragma once

#include <chrono>
#include <string>

#include "common.h"
#include "coord/job_client.h"
#include "coord/runtime_dir.h"

namespace cusnap::cli {

/// The JOB argument of the commands that act on a running job.
void add_job_argument(CLI::App& app, std::string* job);

/// Finds job spec; on failure prints the error (and JSON when asked) and
/// returns the exit code, else -1. not_found_also is added to the message
/// when no job has that name (what else was looked for).
int resolve_job(const std::string& spec, bool json, JobEntry* out,
                const std::string& not_found_also = "");

/// failure_object with the job named: job, name (both the job's name) and
/// pid (its root process).
nlohmann::json job_failure_object(int code, const std::string& msg, const JobEntry& job);
/// fail_json for a command whose job was found (resolved by its name, pid or
/// runtime directory): the JSON object is job_failure_object's.
int fail_job_json(bool json, int code, const std::string& msg, const JobEntry& job);

/// Prints the failure the job's supervisor answered (op: "checkpoint" and
/// the like, said when it gave no message); returns its exit code. The JSON
/// object names the job (job, name, pid, as a cancel's does) and, where the
/// supervisor said it, the job's state after the failure.
int report_result_failure(bool json, const proto::Result& r, const std::string& op,
                          const JobEntry& job);

/// PhaseTimes-like JSON array [{"name","seconds"}] as text lines.
void print_phases(const nlohmann::json& phases);

/// A checkpoint's or suspend's details "collective_cut" and
/// "capture_retries" as text lines (nothing when absent).
void print_cut(const nlohmann::json& details);

/// While it lives, the first SIGINT, SIGTERM or SIGHUP asks the job's
/// supervisor to cancel the running op ("checkpoint" or "suspend") this
/// command asked for (hook(), for job_request: job_cancel, then the rest of
/// the wait bounded by bound); it says so on stderr. A second one ends the
/// command at once, as InterruptNotice does, saying that the operation's
/// outcome is not known (with json, the failure object on stdout); the exit
/// status is 128 + the signal's number.
class CancelOnInterrupt {
 public:
  CancelOnInterrupt(const JobEntry& job, const char* op, bool json,
                    std::chrono::milliseconds bound);
  ~CancelOnInterrupt();
  CancelOnInterrupt(const CancelOnInterrupt&) = delete;
  CancelOnInterrupt& operator=(const CancelOnInterrupt&) = delete;

  InterruptHook hook();
  /// The first interrupt's signal number, 0 when none came.
  int signal() const;

  /// What the command does with the request's end (ok: the exchange went
  /// through, r its result, err its failure) when an interrupt came (else -1,
  /// and the command goes on as without one): a cancelled operation is said
  /// ("cancelled: job J runs on unchanged"; json: the failure object with
  /// "cancelled": true) and ends with 128 + the signal; a failed exchange
  /// likewise, its outcome not known; a failure is reported as such. An
  /// operation that completed is said to be too late to cancel and returns
  /// -1 (the command reports its success; with json it adds
  /// "cancel": "too late" to *details).
  int finish(bool json, bool ok, const proto::Result& r, const std::string& err,
             nlohmann::json* details);

 private:
  JobEntry job_;
  std::string op_;
  std::chrono::milliseconds bound_;
  int pipe_[2] = {-1, -1};
};

}  // namespace cusnap::cli
