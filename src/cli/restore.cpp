// cusnap restore DIR [--name N] [--detach] [--device-map OLD=NEW,...] [--json]
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

#include "coord/driver.h"
#include "coord/manifest.h"
#include "coord/restore_report.h"
#include "coord/supervisor.h"
#include "job_target.h"
#include "proto/env_settings.h"

namespace cusnap::cli {
namespace {

/// One side of an OLD=NEW pair in canonical form: an index without leading
/// zeros, or a UUID as the driver writes it; false when it is neither.
bool device_key(const std::string& text, std::string* out) {
  if (!text.empty() && text.size() <= 4 &&
      std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    *out = std::to_string(std::stoi(text));
    return true;
  }
  CUuuid uuid;
  if (!parse_gpu_uuid(text, &uuid)) return false;
  *out = format_gpu_uuid(uuid);
  return true;
}

/// --device-map OLD=NEW,...: each OLD once, each NEW once, each side a GPU
/// index or UUID. Whether an index and a UUID name the same GPU only the
/// restore knows (plan_device_pairs checks that too). *err names the entry
/// at fault; CLI11 puts the option's name before it.
bool parse_device_map(const std::string& text, std::map<std::string, std::string>* out,
                      std::string* err) {
  const std::string expected =
      ": expected OLD=NEW pairs separated by commas, each side a GPU index (such as 0) or a GPU "
      "UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, as nvidia-smi -L shows)";
  if (text.empty()) {
    *err = "must not be empty" + expected;
    return false;
  }
  std::map<std::string, std::string> item_of_old, item_of_new;  // key -> the entry naming it
  size_t pos = 0;
  for (int n = 1;; ++n) {
    size_t comma = text.find(',', pos);
    std::string item =
        text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (item.empty()) {
      *err = "entry " + std::to_string(n) + " of '" + text + "' is empty" + expected;
      return false;
    }
    size_t eq = item.find('=');
    std::string from, to;
    if (eq == std::string::npos || item.find('=', eq + 1) != std::string::npos) {
      *err = "'" + item + "' is not OLD=NEW" + expected;
      return false;
    }
    const std::string old_text = item.substr(0, eq), new_text = item.substr(eq + 1);
    const bool old_ok = device_key(old_text, &from);
    if (!old_ok || !device_key(new_text, &to)) {
      *err = "'" + (old_ok ? new_text : old_text) + "' in '" + item +
             "' is neither a GPU index nor a GPU UUID" + expected;
      return false;
    }
    if (auto it = item_of_old.find(from); it != item_of_old.end()) {
      *err = "'" + it->second + "' and '" + item + "' both map GPU " + from +
             ": map each OLD GPU once";
      return false;
    }
    if (auto it = item_of_new.find(to); it != item_of_new.end()) {
      *err = "'" + it->second + "' and '" + item + "' both map to GPU " + to +
             ": map each OLD GPU to a different NEW GPU";
      return false;
    }
    item_of_old[from] = item;
    item_of_new[to] = item;
    (*out)[from] = to;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return true;
}

/// A bad --device-map is a bad command line, said as CLI11 says one; a good
/// one is parsed into *map as it is read.
CLI::Validator device_map_check(std::map<std::string, std::string>* map) {
  return CLI::Validator(
      [map](std::string& text) -> std::string {
        map->clear();
        std::string err;
        return parse_device_map(text, map, &err) ? "" : err;
      },
      "", "device map");
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
  app.add_option("DIR", dir, "Checkpoint directory")->required()->check(not_empty())->type_name("");
  add_name_option(app, &req.cfg.name, "Job name (default: the name recorded in the checkpoint)");
  app.add_flag("--detach", req.detach,
               "Supervise the restored job in the background; output goes only to its log");
  app.add_option("--device-map", device_map,
                 "Restore onto other GPUs: OLD=NEW pairs (index or UUID), comma-separated; "
                 "each OLD and each NEW at most once")
      ->check(device_map_check(&req.engine.device_map))
      ->type_name("OLD=NEW,...");
  add_runtime_dir_option(app, &req.cfg.runtime_dir);
  add_timeout_option(app, &timeout_s, "each phase", true);
  add_control_timeout_option(app, &control_s, true);
  app.add_flag("--json", json, "Print the restore's result as JSON");
  int rc = parse(app, argc, argv);
  if (rc >= 0) return rc;

  std::string err;  // req.engine.device_map: read as it was parsed (device_map_check)
  if (!proto::check_env_settings(false, true, &err)) return fail_json(json, kExitUsage, err);
  char abs[PATH_MAX];
  if (::realpath(dir.c_str(), abs) == nullptr) {
    // Only a path that is not there is "no such checkpoint" (4); one that
    // cannot be searched (EACCES: a private parent, root squashed on NFS)
    // or resolved (ELOOP) is there, and a failure (1), with its reason.
    const int e = errno;
    const bool missing = e == ENOENT || e == ENOTDIR;
    return fail_json(
        json, missing ? kExitNotFound : kExitFailure,
        "cannot restore " + dir + ": " + std::strerror(e) +
            (missing       ? " (a checkpoint directory, as cusnap checkpoint -o DIR wrote it, was "
                             "expected)"
             : e == EACCES ? ": run the restore as a user who can read it (root)"
                           : ""));
  }
  // A manifest this user cannot read (root's, mode 0600) is no bad
  // checkpoint (5) but an error reading it (1), with what to do. What is
  // wrong with the checkpoint itself the restore says, as it reads it again.
  Manifest manifest;
  ExitCode read_code = kExitOk;
  int read_errno = 0;
  if (!read_manifest_coded(abs, &manifest, &read_code, &err, &read_errno) &&
      read_code == kExitFailure)
    return fail_json(
        json, kExitFailure,
        "cannot restore " + dir + ": " + err + unreadable_hint(read_errno, "run the restore"));
  req.engine.dir = abs;
  req.engine.timeout = seconds(timeout_s);
  req.cfg.control_timeout = seconds(control_s);
  ProgressLine progress(!json);
  req.progress = [&](const Progress& p) { progress.update(p.phase, p.bytes_done, p.bytes_total); };
  bool reported = false;
  auto report = [&](const RestoreSummary& s) {
    progress.finish();
    reported = true;
    if (json) {
      print_json(restored_json(s, req.detach));
    } else if (req.detach) {
      std::fputs(shown(gpu_moves_text(s), Breaks::keep).c_str(), stderr);
      std::printf("%s\n", shown(s.name).c_str());
      std::fflush(stdout);
    } else {
      std::fprintf(stderr, "cusnap: restored job %s (pid %d) from %s\n%s", shown(s.name).c_str(),
                   s.root_pid, shown(s.dir).c_str(),
                   shown(gpu_moves_text(s), Breaks::keep).c_str());
    }
  };
  req.on_restored = report;
  // With --detach the restore runs in a background supervisor from the
  // start; this command only waits for its result.
  std::optional<InterruptNotice> notice;
  if (req.detach) notice.emplace("the restore of " + dir, json);
  SuperviseOutcome out = restore_and_supervise(req);
  notice.reset();
  progress.finish();
  if (!out.error.empty()) return fail_json(json && !reported, out.exit_code, out.error);
  // Restored in the background, but the summary that came with the success
  // could not be decoded: the job runs, and is reported with what this
  // command knows (its pid and runtime directory from its supervisor's
  // record, when found), not left unsaid.
  RestoreSummary known{
      req.cfg.name.empty() ? manifest.job.name : req.cfg.name, abs, req.cfg.runtime_dir, 0, {}, {}};
  if (!out.name.empty()) known.name = out.name;
  known.gpu_moves_known = false;
  if (summary_left_to_report(out, reported, known)) {
    if (JobEntry entry; find_job(known.name, &entry, &err)) {
      known.root_pid = entry.status.root_pid;
      known.runtime_dir = entry.status.runtime_dir;
    }
    std::fprintf(stderr,
                 "cusnap: warning: the background restore succeeded, but its summary could not "
                 "be read: cusnap ps shows job %s\n",
                 shown(known.name).c_str());
    report(known);
  }
  if (out.detached) return kExitOk;
  return finish_supervised(out);
}

}  // namespace cusnap::cli
