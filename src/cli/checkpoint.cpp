// cusnap checkpoint JOB [-o DIR] [--leave-running] [--timeout S] [--json]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <thread>

#include "coord/abs_path.h"
#include "job_target.h"

namespace cusnap::cli {
namespace {

/// NAME-YYYYmmdd-HHMMSS, or with -2, -3, ... after it when a checkpoint of
/// that second is there already (checkpoints taken one after the other).
std::string default_dir(const std::string& name) {
  char stamp[32];
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::localtime_r(&now, &tm);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  const std::string base = name + "-" + stamp;
  std::string dir = base;
  std::error_code ec;
  for (int n = 2; n < 1000 && std::filesystem::symlink_status(dir, ec).type() !=
                                  std::filesystem::file_type::not_found;
       ++n)
    dir = base + "-" + std::to_string(n);
  return dir;
}

/// p from the current directory, without '.', '..' or a trailing '/'
/// (absolute_path: the directory's parent is then what it names, and --json
/// says it plainly); false with *err when the current directory cannot be
/// found (removed).
bool absolute(const std::string& p, std::string* out, std::string* err) {
  std::error_code ec;
  if (absolute_path(p, out, &ec)) return true;
  *err = "cannot tell where " + p + " is: the current directory cannot be found (" + ec.message() +
         "; removed?): give -o an absolute path, or change directory";
  return false;
}

}  // namespace

int cmd_checkpoint(int argc, char** argv) {
  CLI::App app{
      "Checkpoint a running job into a directory. By default the job is stopped after a "
      "successful checkpoint; with --leave-running it continues."};
  init_app(app, "checkpoint");
  std::string job, dir;
  bool leave_running = false, json = false;
  double timeout_s = 60;
  add_job_argument(app, &job);
  app.add_option("-o,--output", dir,
                 "Checkpoint directory, new or empty (default: ./NAME-YYYYmmdd-HHMMSS, -2, -3... "
                 "added if taken)")
      ->check(not_empty())
      ->type_name("DIR");
  app.add_flag("--leave-running", leave_running, "Keep the job running after the checkpoint");
  add_timeout_option(app, &timeout_s, "each phase", true);
  app.add_flag("--json", json, "Print the result as JSON");
  int rc = parse(app, argc, argv);
  if (rc >= 0) return rc;

  JobEntry entry;
  if ((rc = resolve_job(job, json, &entry)) >= 0) return rc;
  proto::CheckpointRequest req;
  std::string err;
  if (!absolute(dir.empty() ? default_dir(entry.status.name) : dir, &req.dir, &err))
    return fail_json(json, kExitUsage, err);
  // The supervisor takes no longer path (PATH_MAX); said here, of -o.
  if (req.dir.size() > proto::kMaxCheckpointDirBytes)
    return fail_json(json, kExitUsage,
                     "the checkpoint directory's absolute path is " +
                         std::to_string(req.dir.size()) + " bytes long, more than the " +
                         std::to_string(proto::kMaxCheckpointDirBytes) +
                         " a path may be: give -o a shorter one");
  req.leave_running = leave_running;
  req.timeout_ms = seconds(timeout_s).count();
  // The CRIU, hashing and sharing settings of this command's environment
  // count, not only the supervisor's (man cusnap, ENVIRONMENT).
  if (!client_settings(&req.settings, &err)) return fail_json(json, kExitUsage, err);

  ProgressLine progress(!json);
  proto::Result r;
  auto wait = seconds(timeout_s) + control_timeout();
  bool ok;
  nlohmann::json d = nlohmann::json::object();
  {
    // The first interrupt asks the supervisor to cancel; the wait after it
    // is bounded as one message's is.
    CancelOnInterrupt cancel(entry, proto::kMsgCheckpoint, json, wait);
    ok = job_request(
        entry, control_timeout(), wait, proto::kMsgCheckpoint, req,
        [&](const proto::ProgressEvent& ev) {
          progress.update(ev.phase, ev.bytes_done, ev.bytes_total);
        },
        &r, &err, cancel.hook());
    progress.finish();
    if (rc = cancel.finish(json, ok, r, err, &d); rc >= 0) return rc;
  }
  if (!ok) return fail_job_json(json, kExitFailure, err, entry);
  if (!r.ok) return report_result_failure(json, r, "checkpoint", entry);

  // The result's details, with what an interrupt added (a cancel too late).
  if (nlohmann::json parsed = nlohmann::json::parse(r.details, nullptr, false);
      parsed.is_object()) {
    parsed.update(d);
    d = std::move(parsed);
  }
  if (d.value("job_stopped", false)) {
    // The supervisor answers before it exits; wait for it to let go of the
    // runtime directory, so that a restore started next finds it free. The
    // checkpoint is good either way: a supervisor slow to go is a warning.
    const auto until = std::chrono::steady_clock::now() + control_timeout();
    while (runtime_dir_live(entry.dir) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const bool gone = !runtime_dir_live(entry.dir);
    d["supervisor_gone"] = gone;
    if (!gone)
      std::fprintf(stderr,
                   "cusnap: warning: the supervisor of job %s has not exited %lld ms after the "
                   "checkpoint: a restore started now may find the job's name or pids taken; "
                   "wait until cusnap ps no longer lists it, then restore\n",
                   shown(entry.status.name).c_str(),
                   static_cast<long long>(control_timeout().count()));
  }
  if (json) {
    d["ok"] = true;
    // The job's name and root, as ps and restore name them ("job" is the
    // name too, as earlier versions gave it).
    d["name"] = entry.status.name;
    d["pid"] = entry.status.root_pid;
    print_json(d);
    return kExitOk;
  }
  const std::string name = shown(entry.status.name), out = d.value("dir", req.dir);
  std::printf("checkpointed job %s to %s (%s)\n", name.c_str(), shown(out).c_str(),
              human_bytes(d.value("bytes", uint64_t{0})).c_str());
  if (d.contains("phases")) print_phases(d["phases"]);
  print_cut(d);
  if (d.value("job_stopped", false))
    std::printf("job %s stopped; restore it with: cusnap restore %s\n", name.c_str(),
                shell_word(out).c_str());
  else
    std::printf("job %s left running\n", name.c_str());
  return kExitOk;
}

}  // namespace cusnap::cli
