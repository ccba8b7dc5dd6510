// cusnap ps [--json]: every live job.
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

#include "coord/engine.h"
#include "job_target.h"
#include "proto/utf8.h"

namespace cusnap::cli {

int cmd_ps(int argc, char** argv) {
  CLI::App app{
      "List the running jobs under this user's runtime base: name, job and supervisor pids, "
      "state, uptime and command. Runtime directories of dead supervisors are removed (a job "
      "whose process outlived its supervisor and guardian is named in a warning instead)."};
  init_app(app, "ps");
  bool json = false;
  app.add_flag("--json", json, "Print the jobs as a JSON array");
  int rc = parse(app, argc, argv);
  if (rc >= 0) return rc;

  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  nlohmann::json arr = nlohmann::json::array();
  std::vector<proto::JobStatus> jobs;
  // Left suspended by a failed roll back (its marker), and of those, the
  // ones whose restore the driver refused: no resume brings them back.
  std::vector<bool> left, refused;
  std::string base_err;
  std::vector<JobEntry> unsupervised;
  std::vector<JobEntry> entries = list_jobs(true, &base_err, &unsupervised);
  if (!base_err.empty())
    return fail_json(json, kExitFailure,
                     base_err + ": cusnap cannot list its jobs; " + runtime_base_lookup_remedy());
  // Not jobs cusnap can act on: said on stderr, with --json too.
  for (const JobEntry& e : unsupervised)
    std::fprintf(stderr,
                 "cusnap: warning: job %s has no supervisor (it was killed, with its guardian), "
                 "and its process %lld runs on, unsupervised: cusnap can no longer checkpoint, "
                 "suspend or follow it; end it with its process group (kill -- -%lld) or let it "
                 "finish (its runtime directory %s goes once that process has ended)\n",
                 shown(e.status.name).c_str(), static_cast<long long>(e.status.root_pid),
                 static_cast<long long>(e.status.root_pid), shown(e.dir).c_str());
  for (JobEntry& e : entries) {
    // The supervisor's own word is fresher than job.json; fall back to the file.
    proto::JobStatus live;
    std::string err;
    if (job_hello(e, control_timeout(), &live, &err)) e.status = live;
    jobs.push_back(e.status);
    const proto::JobStatus& s = e.status;
    JobInfo where;
    where.runtime_dir = s.runtime_dir;
    const LeftSuspendedState marked = left_suspended_state(where);
    left.push_back(marked != LeftSuspendedState::kNo);
    refused.push_back(marked == LeftSuspendedState::kRestoreRefused);
    arr.push_back({{"name", s.name},
                   {"pid", s.root_pid},
                   {"supervisor_pid", s.supervisor_pid},
                   {"state", s.state},
                   {"started", s.started},
                   {"uptime_seconds", now - s.started},
                   {"argv", s.argv},
                   {"cwd", s.cwd},
                   {"owner_uid", s.owner_uid},
                   {"runtime_dir", s.runtime_dir},
                   {"restored_from", s.restored_from},
                   {"left_suspended", bool(left.back())},
                   {"restore_refused", bool(refused.back())}});
  }
  if (json) {
    print_json(arr);
    return kExitOk;
  }
  // The NAME column as wide as the longest name shown (names are shown
  // escaped, and counted in characters as a terminal shows them).
  std::vector<std::string> shown_names;
  size_t width = utf8_length("NAME");
  for (const proto::JobStatus& s : jobs) {
    shown_names.push_back(shown(s.name));
    width = std::max(width, utf8_length(shown_names.back()));
  }
  auto padded = [width](const std::string& name) {
    return name + std::string(width - std::min(width, utf8_length(name)), ' ');
  };
  std::printf("%s %8s %8s %-13s %8s  %s\n", padded("NAME").c_str(), "PID", "SUPERV", "STATE",
              "UPTIME", "COMMAND");
  std::string starred, lost;  // the jobs marked * and !
  for (size_t i = 0; i < jobs.size(); ++i) {
    const proto::JobStatus& s = jobs[i];
    const std::string state = refused[i] ? s.state + "!" : left[i] ? s.state + "*" : s.state;
    std::string& names = refused[i] ? lost : starred;
    if (left[i]) names += (names.empty() ? "" : ", ") + s.name;
    std::string cmd = shown_args(s.argv);
    // Cut at a character, never inside one (a terminal would show U+FFFD).
    if (utf8_length(cmd) > 60) cmd = std::string(utf8_prefix(cmd, 57)) + "...";
    std::printf("%s %8lld %8lld %-13s %8s  %s\n", padded(shown_names[i]).c_str(),
                static_cast<long long>(s.root_pid), static_cast<long long>(s.supervisor_pid),
                state.c_str(), human_duration(now - s.started).c_str(), cmd.c_str());
  }
  if (!starred.empty())
    std::printf(
        "* left suspended by a failed roll back (%s): cusnap inspect JOB says why, cusnap "
        "resume JOB brings it back\n",
        starred.c_str());
  if (!lost.empty())
    std::printf(
        "! left suspended, the driver refusing to restore its GPU state (%s): cusnap inspect "
        "JOB says why; stop the job and restore an earlier checkpoint\n",
        lost.c_str());
  return kExitOk;
}

}  // namespace cusnap::cli
