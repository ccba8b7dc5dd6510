// cusnap restore DIR [--name N] [--detach] [--device-map OLD=NEW,...] [--json]
#include <limits.h>
#include <unistd.h>

#include <cstdio>

#include "coord/supervisor.h"
#include "job_target.h"

namespace cusnap::cli {
namespace {

bool parse_device_map(const std::string& text, std::map<std::string, std::string>* out,
                      std::string* err) {
  size_t pos = 0;
  while (pos <= text.size() && !text.empty()) {
    size_t comma = text.find(',', pos);
    std::string item =
        text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size()) {
      *err = "--device-map: '" + item + "' is not OLD=NEW";
      return false;
    }
    (*out)[item.substr(0, eq)] = item.substr(eq + 1);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return true;
}

}  // namespace

int cmd_restore(int argc, char** argv) {
  CLI::App app{
      "Restore a job from a checkpoint directory. This process becomes the job's supervisor, as "
      "cusnap launch is, and exits with the job's status; with --detach the supervisor continues "
      "in the background and this prints the job's name."};
  init_app(app, "restore");
  std::string dir, device_map;
  bool json = false;
  double timeout_s = 60;
  double control_s = 0;
  RestoreRequest req;
  app.add_option("DIR", dir, "Checkpoint directory")->required()->type_name("");
  app.add_option("-n,--name", req.cfg.name,
                 "Job name (default: the name recorded in the checkpoint)")
      ->type_name("NAME");
  app.add_flag("--detach", req.detach,
               "Supervise the restored job in the background; output goes only to its log");
  app.add_option("--device-map", device_map,
                 "Restore onto other GPUs: OLD=NEW pairs (index or UUID), comma-separated")
      ->type_name("OLD=NEW,...");
  add_runtime_dir_option(app, &req.cfg.runtime_dir);
  add_timeout_option(app, &timeout_s, "each phase");
  add_control_timeout_option(app, &control_s);
  app.add_flag("--json", json, "Print the restore's result as JSON");
  int rc = parse(app, argc, argv);
  if (rc >= 0) return rc;

  std::string err;
  if (!parse_device_map(device_map, &req.engine.device_map, &err))
    return fail_json(json, kExitUsage, err);
  char abs[PATH_MAX];
  if (::realpath(dir.c_str(), abs) == nullptr)
    return fail_json(json, kExitNotFound, "no checkpoint directory " + dir);
  req.engine.dir = abs;
  req.engine.timeout = seconds(timeout_s);
  req.cfg.control_timeout = seconds(control_s);
  ProgressLine progress(!json);
  req.progress = [&](const Progress& p) { progress.update(p.phase, p.bytes_done, p.bytes_total); };
  req.on_restored = [&](const RestoreSummary& s) {
    progress.finish();
    if (json) {
      nlohmann::json phases = nlohmann::json::array();
      for (const auto& [n, secs] : s.phases) phases.push_back({{"name", n}, {"seconds", secs}});
      print_json({{"ok", true},
                  {"name", s.name},
                  {"dir", s.dir},
                  {"pid", s.root_pid},
                  {"runtime_dir", s.runtime_dir},
                  {"phases", phases},
                  {"detached", req.detach}});
    } else if (req.detach) {
      std::printf("%s\n", s.name.c_str());
      std::fflush(stdout);
    } else {
      std::fprintf(stderr, "cusnap: restored job %s (pid %d) from %s\n", s.name.c_str(), s.root_pid,
                   s.dir.c_str());
    }
  };
  SuperviseOutcome out = restore_and_supervise(req);
  progress.finish();
  if (!out.error.empty()) return fail_json(json && !out.detached, out.exit_code, out.error);
  if (out.detached) return kExitOk;
  return finish_supervised(out);
}

}  // namespace cusnap::cli
