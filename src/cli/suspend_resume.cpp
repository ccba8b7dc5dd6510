// cusnap suspend JOB / cusnap resume JOB: release a job's GPUs in place and
// give them back.
#include <cstdio>

#include "coord/gpu_memory.h"
#include "job_target.h"

namespace cusnap::cli {
namespace {

/// The settings of proto::kClientSettings that the job's supervisor reads
/// for a suspend (the free-memory margin: suspend_job_coded; ranks sharing a
/// GPU: shared_prepare) and for a resume (the margin: resume_job_coded,
/// recover_job), and so all these commands send: the others count for a
/// checkpoint only, and a value of theirs cannot refuse a suspend or resume.
constexpr const char* kSuspendSettings[] = {"CUSNAP_ALLOW_RANKS_SHARING_GPU",
                                            kRestoreMarginSetting};
constexpr const char* kResumeSettings[] = {kRestoreMarginSetting};

int run(int argc, char** argv, bool suspend) {
  CLI::App app{suspend
                   ? "Release the GPUs of every CUDA process of a job in place (driver lock and "
                     "checkpoint); the processes stay, waiting for cusnap resume."
                   : "Give a suspended job its GPUs back (driver restore and unlock)."};
  init_app(app, suspend ? "suspend" : "resume");
  std::string job;
  bool json = false;
  double timeout_s = 60;
  add_job_argument(app, &job);
  add_timeout_option(app, &timeout_s, "the operation", false);
  app.add_flag("--json", json, "Print the result as JSON");
  int rc = parse(app, argc, argv);
  if (rc >= 0) return rc;

  JobEntry entry;
  if ((rc = resolve_job(job, json, &entry)) >= 0) return rc;
  proto::TimeoutRequest req;
  req.timeout_ms = seconds(timeout_s).count();
  std::string err;
  if (!client_settings(suspend ? std::span<const char* const>(kSuspendSettings)
                               : std::span<const char* const>(kResumeSettings),
                       &req.settings, &err))
    return fail_json(json, kExitUsage, err);
  proto::Result r;
  bool ok;
  const auto wait = seconds(timeout_s) + control_timeout();
  nlohmann::json extra = nlohmann::json::object();  // what an interrupt adds to --json
  if (suspend) {
    // The first interrupt asks the supervisor to cancel the suspend.
    CancelOnInterrupt cancel(entry, proto::kMsgSuspend, json, wait);
    ok = job_request(entry, control_timeout(), wait, proto::kMsgSuspend, req, nullptr, &r, &err,
                     cancel.hook());
    if (rc = cancel.finish(json, ok, r, err, &extra); rc >= 0) return rc;
  } else {
    InterruptNotice notice("the resume of job " + entry.status.name, json,
                           job_failure_object(0, "", entry));
    ok = job_request(entry, control_timeout(), wait, proto::kMsgResume, req, nullptr, &r, &err);
  }
  if (!ok) return fail_job_json(json, kExitFailure, err, entry);
  if (!r.ok) return report_result_failure(json, r, suspend ? "suspend" : "resume", entry);
  if (json) {
    nlohmann::json d = nlohmann::json::parse(r.details, nullptr, false);
    if (d.is_discarded() || !d.is_object()) d = nlohmann::json::object();
    d.update(extra);
    d["ok"] = true;
    // The job's name and root, as ps and restore name them ("job" is the
    // name too, as earlier versions gave it).
    d["name"] = entry.status.name;
    d["pid"] = entry.status.root_pid;
    print_json(d);
  } else {
    nlohmann::json d = nlohmann::json::parse(r.details, nullptr, false);
    const bool obj = !d.is_discarded() && d.is_object();
    // A note says what was done instead (a resume that found the job running).
    if (obj && d.contains("note") && d["note"].is_string())
      std::printf("%s\n", d["note"].get<std::string>().c_str());
    else
      std::printf("job %s %s\n", entry.status.name.c_str(), suspend ? "suspended" : "resumed");
    if (obj) print_cut(d);
  }
  return kExitOk;
}

}  // namespace

int cmd_suspend(int argc, char** argv) {
  return run(argc, argv, true);
}
int cmd_resume(int argc, char** argv) {
  return run(argc, argv, false);
}

}  // namespace cusnap::cli
