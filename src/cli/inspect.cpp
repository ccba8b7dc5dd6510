// cusnap inspect DIR|JOB [--json]: a checkpoint directory's manifest and
// verdict, or a running job's processes and state.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <string>

#include "coord/abs_path.h"
#include "coord/criu_leftovers.h"
#include "coord/engine.h"
#include "coord/manifest.h"
#include "coord/ports.h"
#include "job_target.h"

namespace cusnap::cli {
namespace {

/// A path (with a slash) to a checkpoint directory: one holding the
/// manifest, or any directory that is not a job's runtime directory.
bool is_checkpoint_dir(const std::string& path) {
  struct stat st;
  return ::stat((path + "/" + kManifestName).c_str(), &st) == 0 ||
         (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) &&
          ::stat((path + "/control.sock").c_str(), &st) != 0);
}

/// dir without the slashes that may end it ("/" stays), so that the paths
/// made from it read as checkpoint and restore write them.
std::string without_trailing_slashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

std::string absolute_dir(const std::string& dir) {
  std::error_code ec;
  std::string abs;
  return absolute_path(dir, &abs, &ec) ? abs : dir;
}

int inspect_checkpoint(const std::string& given, bool json) {
  const std::string dir = without_trailing_slashes(given);
  Manifest m;
  std::string err;
  ExitCode read_code = kExitOk;
  int read_errno = 0;
  if (!read_manifest_coded(dir, &m, &read_code, &err, &read_errno)) {
    // One this user cannot read (a private manifest of root's) is no bad
    // checkpoint: an error reading it (1), with what to do.
    err = read_code == kExitFailure
              ? "cannot inspect " + dir + ": " + err + unreadable_hint(read_errno, "inspect it")
              : dir + " is not a usable checkpoint: " + err;
    if (!json) return fail(read_code, err);
    // The shape of any checkpoint's object, as the man page gives it.
    print_json({{"ok", false},
                {"kind", "checkpoint"},
                {"dir", absolute_dir(dir)},
                {"name", ""},
                {"valid", false},
                {"files_intact", false},
                {"needs_name", false},
                {"error", err},
                {"bytes", 0},
                {"exit_code", int(read_code)}});
    return fail(read_code, err);  // on stderr too, as without --json
  }
  std::string verr;
  ExitCode code = kExitOk;
  bool files_intact = false;
  bool valid = verify_checkpoint_coded(dir, {}, &code, &verr, &files_intact);
  if (!valid && code == kExitOk) code = kExitBadCheckpoint;
  // The checkpoint's size as `cusnap checkpoint` gives it: its files and
  // the manifest.
  uint64_t bytes = 0;
  for (const ManifestFile& f : m.files) bytes += f.size;
  if (struct stat st{}; ::stat((dir + "/manifest.json").c_str(), &st) == 0) bytes += st.st_size;
  // A job name cusnap does not accept: a restore needs --name.
  std::string name_err;
  const bool needs_name = !valid_job_name(m.job.name, &name_err);
  if (json) {
    nlohmann::json j = {{"ok", valid},
                        {"kind", "checkpoint"},
                        {"dir", absolute_dir(dir)},
                        {"name", m.job.name},
                        {"valid", valid},
                        {"files_intact", files_intact},
                        {"needs_name", needs_name},
                        {"error", valid ? "" : verr},
                        {"bytes", bytes},
                        {"manifest", nlohmann::json::parse(manifest_to_json(m))}};
    if (!valid) j["exit_code"] = int(code);  // as every failed command's JSON has it
    print_json(j);
    return valid ? kExitOk : code;  // the verdict, on stdout as without --json
  }
  std::printf("checkpoint %s\n", shown(dir).c_str());
  std::printf("  job:      %s\n", shown(m.job.name).c_str());
  std::printf("  command:  %s\n", shown_args(m.job.argv).c_str());
  std::printf("  cwd:      %s\n", shown(m.job.cwd).c_str());
  std::printf("  created:  %s by cusnap %s, CRIU %s, driver %d\n", shown(m.created).c_str(),
              shown(m.cusnap_version).c_str(), shown(m.criu_version).c_str(), m.driver_version);
  std::printf("  size:     %s in %zu files\n", human_bytes(bytes).c_str(), m.files.size());
  // Each GPU the supervisor saw; one the job's processes did not use is
  // said so (a --device-map may not name it, and need not).
  const std::vector<std::string> used = used_gpus(m);
  for (const GpuDevice& g : m.gpus)
    std::printf("  gpu %d:    %s %s (%s)%s\n", g.index, shown(g.name).c_str(),
                shown(g.uuid).c_str(), human_bytes(g.total_mem).c_str(),
                std::find(used.begin(), used.end(), g.uuid) == used.end()
                    ? ", not used by its processes"
                    : "");
  // What a restore needs free on each GPU (NVML's count at the checkpoint).
  std::map<std::string, uint64_t> need;
  for (const ManifestProcess& p : m.processes)
    for (const auto& [uuid, b] : p.gpu_memory) need[uuid] += b;
  for (const auto& [uuid, b] : need) {
    std::string gpu = shown(uuid);
    for (const GpuDevice& g : m.gpus)
      if (g.uuid == uuid) gpu = "gpu " + std::to_string(g.index);
    std::printf("  needs:    %s of device memory on %s\n", human_bytes(b).c_str(), gpu.c_str());
  }
  std::printf("  processes:\n    %8s %8s %-5s %s\n", "PID", "PPID", "CUDA", "COMMAND");
  for (const ManifestProcess& p : m.processes)
    std::printf(
        "    %8d %8d %-5s %s\n", p.pid, p.ppid, p.uses_cuda ? "yes" : "no",
        shown_args(p.cmdline.empty() ? std::vector<std::string>{p.exe} : p.cmdline).c_str());
  if (m.tcp_established || !m.tcp_listeners.empty()) {
    std::string ports;
    for (const TcpListener& l : m.tcp_listeners)
      ports += (ports.empty() ? "" : ", ") + tcp_endpoint(l.family, l.addr, l.port);
    std::printf("  tcp:      %s%s%s\n",
                m.tcp_established ? "established connections saved" : "no established connections",
                ports.empty() ? "" : "; listening on ", ports.c_str());
    // The lock CRIU left on the machine it ran on (criu_leftovers.h). The
    // manifest's run id is a UUID (manifest.cpp); the command is quoted all
    // the same, as one to paste.
    if (m.criu_network_lock == "nftables" && !m.criu_run_id.empty()) {
      const std::string table = criu_nft_tables(m.criu_run_id).front();
      std::printf(
          "  lock:     on the machine it was taken on, nftables table inet %s drops those "
          "connections until a restore removes it; if the checkpoint will never be restored "
          "there: nft delete table inet %s\n",
          shown(table).c_str(), shell_word(table).c_str());
    } else if (m.criu_network_lock == "iptables")
      std::printf(
          "  lock:     on the machine it was taken on, CRIU's iptables rules (mark 0xC114) drop "
          "those connections until a restore removes them\n");
  }
  std::printf("  phases:\n");
  for (const auto& [name, secs] : m.phases)
    std::printf("    %-22s %8.2f s\n", shown(name).c_str(), secs);
  if (valid && needs_name)
    std::printf(
        "  verdict:  valid, restorable with --name NAME only: its job name is not one cusnap "
        "accepts\n");
  else if (valid)
    std::printf(
        "  verdict:  valid, restorable: files intact, the GPU model present (a restore checks "
        "the rest as it begins: root, the job's pids, name and TCP ports free, and the GPUs' "
        "free memory)\n");
  else if (files_intact)
    std::printf(
        "  verdict:  files intact (every file's size and SHA-256 checked), NOT restorable here: "
        "%s\n",
        shown(verr).c_str());
  else
    std::printf("  verdict:  NOT restorable: %s\n", shown(verr).c_str());
  return valid ? kExitOk : code;
}

/// Why the job is suspended when a failed roll back left it so, and what to do.
void print_left_suspended(const std::string& name, const nlohmann::json& left) {
  const std::string op = left.value("operation", std::string());
  const std::string since = left.value("since", std::string());
  std::printf("  left suspended by a failed %s%s%s\n", op.empty() ? "operation" : shown(op).c_str(),
              since.empty() ? "" : " at ", shown(since).c_str());
  // Its lines kept, each after the first indented under the first.
  std::string reason = shown(left.value("reason", std::string()), Breaks::keep);
  for (size_t at = 0; (at = reason.find('\n', at)) != std::string::npos; at += 1)
    reason.insert(++at, "               ");
  if (!reason.empty()) std::printf("    because:   %s\n", reason.c_str());
  const std::string dir = left.value("state_dir", std::string());
  if (left.value("saved", false) && !dir.empty())
    std::printf("    kept:      its shared memory, in %s\n", shown(dir).c_str());
  if (left.value("restore_refused", false))
    std::printf(
        "    next:      the driver will not restore its GPU state: stop the job and restore "
        "an earlier checkpoint of it\n");
  else
    std::printf("    next:      cusnap resume %s brings it back\n", shell_word(name).c_str());
}

/// The inspect result d (an object; with "job" an object, for the text).
int print_job(const JobEntry& entry, nlohmann::json& d, bool json) {
  if (json) {
    d["ok"] = true;
    d["kind"] = "job";
    // The job's root as ps --json names it (job.json calls it root_pid),
    // and the rest of ps --json's object, as the man page says "job" is.
    if (d.contains("job") && d["job"].is_object()) {
      nlohmann::json& job = d["job"];
      if (job.contains("root_pid")) job["pid"] = job["root_pid"];
      if (job.contains("started") && job["started"].is_number_integer())
        job["uptime_seconds"] =
            static_cast<int64_t>(std::time(nullptr)) - job["started"].get<int64_t>();
      JobInfo where;
      where.runtime_dir = job.value("runtime_dir", entry.dir);
      const LeftSuspendedState marked = left_suspended_state(where);
      job["left_suspended"] = marked != LeftSuspendedState::kNo;
      job["restore_refused"] = marked == LeftSuspendedState::kRestoreRefused;
    }
    // Its name and root, as every command's JSON about a job has them.
    d["name"] = entry.status.name;
    d["pid"] = entry.status.root_pid;
    print_json(d);
    return kExitOk;
  }
  const auto& job = d["job"];
  std::printf("job %s\n", shown(job.value("name", std::string())).c_str());
  std::printf("  state:       %s\n", shown(job.value("state", std::string())).c_str());
  if (d.contains("left_suspended") && d["left_suspended"].is_object())
    print_left_suspended(job.value("name", std::string()), d["left_suspended"]);
  std::printf("  pid:         %lld (supervisor %lld)\n", job.value("root_pid", 0LL),
              job.value("supervisor_pid", 0LL));
  std::printf("  command:     %s\n",
              shown_args(job.value("argv", std::vector<std::string>{})).c_str());
  std::printf("  runtime dir: %s\n", shown(job.value("runtime_dir", std::string())).c_str());
  if (!job.value("restored_from", std::string()).empty())
    std::printf("  restored from: %s\n", shown(job.value("restored_from", std::string())).c_str());
  std::printf("  processes:\n    %8s %-5s %-13s %s\n", "PID", "CUDA", "CUDA STATE", "COMMAND");
  for (const auto& p : d.contains("processes") && d["processes"].is_array()
                           ? d["processes"]
                           : nlohmann::json::array()) {
    if (!p.is_object()) continue;
    std::vector<std::string> cmd = p.value("cmdline", std::vector<std::string>{});
    if (cmd.empty()) cmd = {p.value("exe", std::string())};
    std::printf("    %8lld %-5s %-13s %s\n", p.value("pid", 0LL),
                p.value("uses_cuda", false) ? "yes" : "no",
                p.value("cuda_state", std::string()).empty()
                    ? "-"
                    : shown(p.value("cuda_state", std::string())).c_str(),
                shown_args(cmd).c_str());
  }
  return kExitOk;
}

/// What a job's details this cusnap cannot read say, and what to do.
constexpr const char* kUnreadableDetails =
    "the job's supervisor sent details this cusnap cannot read: it was likely started by another "
    "version of cusnap; use that version to inspect it";

int inspect_job(const JobEntry& entry, bool json) {
  proto::Result r;
  std::string err;
  if (!job_request(entry, control_timeout(), control_timeout(), proto::kMsgInspect, proto::Empty{},
                   nullptr, &r, &err))
    return fail_job_json(json, kExitFailure, err, entry);
  if (!r.ok) return report_result_failure(json, r, "inspect", entry);
  // Not an object (or, for the text, without a "job" object): nothing here
  // could be read from it.
  nlohmann::json d = nlohmann::json::parse(r.details, nullptr, false);
  if (d.is_discarded() || !d.is_object() || (!json && !(d.contains("job") && d["job"].is_object())))
    return fail_json(json, kExitFailure, kUnreadableDetails);
  // A field of another type than the one read throws.
  try {
    return print_job(entry, d, json);
  } catch (const nlohmann::json::exception&) {
    return fail_json(json, kExitFailure, kUnreadableDetails);
  }
}

}  // namespace

int cmd_inspect(int argc, char** argv) {
  CLI::App app{
      "Describe a checkpoint directory (its manifest and whether it can be restored) or a running "
      "job (its state and processes)."};
  init_app(app, "inspect");
  std::string target;
  bool json = false;
  app.add_option("TARGET", target,
                 "Checkpoint directory, or job name, pid (PID or SUPERV of cusnap ps) or runtime "
                 "directory; a name without a slash is the running job of that name if there "
                 "is one, else the directory of that name here")
      ->required()
      ->check(not_empty())
      ->type_name("");
  app.add_flag("--json", json, "Print the description as JSON");
  int rc = parse(app, argc, argv);
  if (rc >= 0) return rc;
  // A path that is not there: neither a checkpoint nor a job's runtime
  // directory, said as such (a name without a slash is looked up as a job).
  struct stat st;
  if (target.find('/') != std::string::npos && ::stat(target.c_str(), &st) != 0) {
    // Not there (4); there but not to be searched by this user, or not
    // resolved (ELOOP): a failure (1), as restore says.
    const int e = errno;
    const bool missing = e == ENOENT || e == ENOTDIR;
    return fail_json(json, missing ? kExitNotFound : kExitFailure,
                     "cannot inspect " + target + ": " + std::strerror(e) +
                         (missing ? " (a checkpoint directory, or a job's runtime directory, was "
                                    "expected)"
                          : e == EACCES ? ": inspect it as a user who can read it"
                                        : ""));
  }
  // A path to something else (a file): not a checkpoint, as restore says.
  if (target.find('/') != std::string::npos && !S_ISDIR(st.st_mode))
    return fail_json(json, kExitBadCheckpoint,
                     "cannot inspect " + target +
                         ": it is not a directory (a checkpoint directory, or a job's runtime "
                         "directory, was expected)");
  JobEntry entry;
  JobMiss miss = JobMiss::kNone;
  if (target.find('/') != std::string::npos) {
    if (is_checkpoint_dir(target)) return inspect_checkpoint(target, json);
  } else if (std::string err; find_job(target, &entry, &err, &miss)) {
    // A name (or pid) without a slash is the running job's first.
    return inspect_job(entry, json);
  } else if (::stat(target.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    // No running job has it, a directory here does: that directory, as
    // ./NAME would be.
    return inspect_checkpoint(target, json);
  }
  // A name without a slash was looked for as a directory here too: the
  // message says so.
  std::string also;
  if (target.find('/') == std::string::npos) {
    const int e = ::stat(target.c_str(), &st) == 0 ? 0 : errno;
    // No job, and ./NAME a file: as ./NAME is (exit 5), saying both.
    if (e == 0 && miss == JobMiss::kNone)
      return fail_json(json, kExitBadCheckpoint,
                       "cannot inspect " + target +
                           ": no job of that name or pid is running, and ./" + target +
                           " is not a directory (a checkpoint directory, or a job's runtime "
                           "directory, was expected)");
    also = e == 0 ? ", and ./" + target + " is not a directory"
           : e == ENOENT || e == ENOTDIR
               ? ", and there is no checkpoint directory ./" + target
               : ", and ./" + target + " cannot be looked at: " + std::strerror(e);
  }
  if (int rc = resolve_job(target, json, &entry, also); rc >= 0) return rc;
  return inspect_job(entry, json);
}

}  // namespace cusnap::cli
