// verify_checkpoint and restore_job: verify the manifest and every file,
// match the GPUs, check that the job's pids and listening TCP ports are free here,
// CRIU restore the tree as a child of the caller, then
// driver restore + unlock of every CUDA process.
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include "coord/engine_internal.h"
#include "coord/manifest.h"
#include "coord/ports.h"
#include "coord/procs.h"
#include "coord/restore_watch.h"
#include "coord/sha256_chunked.h"

namespace cusnap {
using namespace engine_detail;

namespace engine_detail {

bool plan_device_pairs(const std::vector<GpuDevice>& recorded, const std::vector<std::string>& used,
                       const std::vector<GpuDevice>& present,
                       const std::map<std::string, std::string>& device_map,
                       std::vector<CUcheckpointGpuPair>* pairs, std::string* err, bool* gpus_here,
                       bool* new_side) {
  if (gpus_here) *gpus_here = false;
  if (new_side) *new_side = false;
  auto where_new_sent = [&] {
    if (new_side) *new_side = true;
    return false;
  };
  // A refusal for the GPUs this machine (or this command) shows, not for the
  // map or the checkpoint.
  auto short_here = [&] {
    if (gpus_here) *gpus_here = true;
    return false;
  };
  auto find_present = [&](const std::string& key) -> const GpuDevice* {
    for (const GpuDevice& g : present)
      if (g.uuid == key || std::to_string(g.index) == key) return &g;
    return nullptr;
  };
  auto entry = [](const auto& m) { return "'" + m->first + "=" + m->second + "'"; };
  // Every OLD names a GPU the checkpoint's processes used: a map entry that
  // matched none would be ignored, and the job restored where the user did
  // not ask.
  std::string used_list;
  for (const std::string& uuid : used) {
    auto it = std::find_if(recorded.begin(), recorded.end(),
                           [&](const GpuDevice& g) { return g.uuid == uuid; });
    used_list += (used_list.empty() ? "" : ", ") +
                 (it != recorded.end() ? std::to_string(it->index) + " (" + uuid + ")" : uuid);
  }
  for (auto m = device_map.begin(); m != device_map.end(); ++m) {
    auto rec = std::find_if(recorded.begin(), recorded.end(), [&](const GpuDevice& g) {
      return g.uuid == m->first || std::to_string(g.index) == m->first;
    });
    const std::string uuid = rec != recorded.end() ? rec->uuid : m->first;
    if (std::find(used.begin(), used.end(), uuid) != used.end()) continue;
    *err = "the device map moves GPU " + m->first + " (" + entry(m) + "), which the checkpoint " +
           (rec != recorded.end() ? "recorded but its processes did not use" : "does not name") +
           ": " +
           (used.empty() ? std::string("its processes used no GPU")
                         : "its processes used GPU " + used_list) +
           " (see cusnap inspect)";
    return false;
  }
  std::map<std::string, std::string> claimed;             // new uuid -> old uuid sent there
  std::vector<std::pair<std::string, std::string>> plan;  // old uuid -> new uuid
  // Explicit choices first, then same-UUID ones, so that neither takes a
  // device the other chose and the model fallback takes only devices nobody
  // asked for.
  for (const std::string& uuid : used) {
    auto it = std::find_if(recorded.begin(), recorded.end(),
                           [&](const GpuDevice& g) { return g.uuid == uuid; });
    GpuDevice old;
    if (it != recorded.end())
      old = *it;
    else
      old.uuid = uuid, old.index = -1;
    plan.emplace_back(old.uuid, "");
    auto m = device_map.find(old.uuid);
    auto by_index = old.index >= 0 ? device_map.find(std::to_string(old.index)) : device_map.end();
    if (m != device_map.end() && by_index != device_map.end()) {
      *err = "the device map maps GPU " + old.uuid + " twice, by UUID (" + entry(m) +
             ") and by index (" + entry(by_index) + "): map each GPU once";
      return false;
    }
    if (m == device_map.end()) m = by_index;
    if (m == device_map.end()) continue;
    const GpuDevice* to = find_present(m->second);
    if (!to) {
      // NEW names a GPU of this machine: list those, not the checkpoint's.
      std::string here;
      for (const GpuDevice& g : present)
        here += (here.empty() ? "" : ", ") + std::to_string(g.index) + " (" + g.uuid + ", " +
                g.name + ")";
      *err = "the device map sends GPU " + old.uuid + " to " + m->second + " (" + entry(m) +
             "), which is not a GPU here: this machine has GPU " + here;
      return short_here();
    }
    if (!old.name.empty() && to->name != old.name) {
      *err = "the device map sends GPU " + old.uuid + " (" + old.name + ") to GPU " + to->uuid +
             " (" + to->name + "): a checkpoint restores only onto the same GPU model";
      return where_new_sent();
    }
    if (auto c = claimed.find(to->uuid); c != claimed.end()) {
      *err = "the device map sends both GPU " + c->second + " and GPU " + old.uuid + " to GPU " +
             to->uuid + ": map each GPU of the checkpoint to a different GPU";
      return where_new_sent();
    }
    plan.back().second = to->uuid;
    claimed[to->uuid] = old.uuid;
  }
  for (auto& [from, to] : plan) {
    if (!to.empty()) continue;
    if (const GpuDevice* same = find_present(from)) {
      if (auto c = claimed.find(same->uuid); c != claimed.end()) {
        *err = "the device map sends GPU " + c->second + " to GPU " + same->uuid +
               ", which the checkpoint also used and the map does not move: map that GPU too "
               "(to swap two GPUs, map each to the other)";
        return where_new_sent();
      }
      to = same->uuid;
      claimed[same->uuid] = from;
    }
  }
  for (auto& [from, to] : plan) {
    if (!to.empty()) continue;
    auto rec = std::find_if(recorded.begin(), recorded.end(),
                            [&](const GpuDevice& g) { return g.uuid == from; });
    const std::string model = rec != recorded.end() ? rec->name : "";
    if (model.empty()) {
      // A GPU the job's processes used that its supervisor did not see
      // (outside its CUDA_VISIBLE_DEVICES): its model is not known, and a
      // GPU of another model would be refused by the driver's restore, after
      // CRIU, with the job lost. The user names the GPU that replaces it.
      *err = "the checkpoint ran on GPU " + from +
             ", which is not here, and does not record its model (its processes used it, but "
             "its supervisor did not see it: outside the CUDA_VISIBLE_DEVICES of its launch): "
             "name a GPU of the same model here for it with --device-map " +
             from + "=NEW (nvidia-smi -L lists them), or restore it where that GPU is";
      return false;
    }
    for (const GpuDevice& g : present)
      if (!claimed.count(g.uuid) && g.name == model) {
        to = g.uuid;
        claimed[g.uuid] = from;
        break;
      }
    if (to.empty()) {
      // Every GPU of that model here is taken by another GPU of the job:
      // the job used more of them than this machine has, and no map helps
      // (it sends each GPU onto a different one of the same model).
      auto of_model = [&](const std::string& uuid) {
        auto r = std::find_if(recorded.begin(), recorded.end(),
                              [&](const GpuDevice& g) { return g.uuid == uuid; });
        return r != recorded.end() && r->name == model;
      };
      const auto used_here = std::count_if(used.begin(), used.end(), of_model);
      const auto model_here = std::count_if(present.begin(), present.end(),
                                            [&](const GpuDevice& g) { return g.name == model; });
      const std::string gpus = model + " GPUs";
      std::string here;
      for (const GpuDevice& g : present) here += (here.empty() ? "" : ", ") + g.name;
      *err = "the checkpoint ran on GPU " + from + " (" + model + ") and no " + model +
             " is available here" +
             (model_here > 0
                  ? ": every one is taken by the job's other GPUs (its processes used " +
                        std::to_string(used_here) + " " + gpus + ", this machine has " +
                        std::to_string(model_here) +
                        "; a device map sends each GPU onto a different one): restore it on a "
                        "machine with at least " +
                        std::to_string(used_here) + " " + gpus
                  : " (this machine has " + (here.empty() ? std::string("none") : here) +
                        "): restore it on a machine with that GPU model; --device-map "
                        "moves a job only between GPUs of the same model");
      return short_here();
    }
  }
  pairs->clear();
  bool identity =
      std::all_of(plan.begin(), plan.end(), [](auto& p) { return p.first == p.second; });
  if (identity) return true;
  for (const auto& [from, to] : plan) {
    CUcheckpointGpuPair p{};
    if (!parse_gpu_uuid(from, &p.oldUuid) || !parse_gpu_uuid(to, &p.newUuid)) {
      *err = "GPU UUID " + from + " or " + to + " is malformed";
      return false;
    }
    pairs->push_back(p);
  }
  return true;
}

}  // namespace engine_detail

namespace {

bool verify_impl(const std::string& dir, const std::map<std::string, std::string>& device_map,
                 const ProgressSink& progress, Manifest* m, Driver* driver,
                 std::vector<CUcheckpointGpuPair>* pairs, ExitCode* code, std::string* err,
                 const std::function<bool()>& cancelled = {}, bool* files_intact = nullptr) {
  if (files_intact) *files_intact = false;
  std::error_code ec;
  unsigned hash_threads = 0;
  if (!hash_thread_count(&hash_threads, err)) {
    *code = kExitRefused;
    return false;
  }
  if (!std::filesystem::exists(dir, ec)) {
    *code = kExitNotFound;
    *err = "no checkpoint at " + dir + ": the directory does not exist";
    return false;
  }
  if (!checkpoint_dir_private(dir, err)) {
    *code = kExitRefused;
    return false;
  }
  *code = kExitBadCheckpoint;
  if (!read_manifest(dir, m, err)) return false;
  bool any_cuda = std::any_of(m->processes.begin(), m->processes.end(),
                              [](const ManifestProcess& p) { return p.uses_cuda; });
  if (!any_cuda && !device_map.empty()) {
    *code = kExitRefused;
    *err =
        "--device-map was given, but no process of the checkpoint used a GPU: restore it "
        "without --device-map";
    return false;
  }
  auto plan = [&] {
    *code = kExitRefused;
    std::vector<GpuDevice> present;
    if (!driver->load(err)) return false;
    // What this command sees of the GPUs here, where that may be why.
    auto visible_hint = [&] {
      if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES"))
        *err += " (this command sees only the GPUs its CUDA_VISIBLE_DEVICES='" +
                std::string(visible) + "' names; unset it to count every GPU here)";
      return false;
    };
    if (!driver->devices(&present, err)) {
      *err =
          "the checkpoint needs a GPU and the driver at " + driver->path() + " shows none: " + *err;
      if (const std::string few = engine_detail::descriptor_shortage(); !few.empty()) {
        *err += few;
        return false;
      }
      return visible_hint();
    }
    bool gpus_here = false, new_side = false;
    if (plan_device_pairs(m->gpus, used_gpus(*m), present, device_map, pairs, err, &gpus_here,
                          &new_side))
      return true;
    // Only where the GPUs here fall short (not for a map that is wrong).
    if (gpus_here) return visible_hint();
    // A map that is wrong may be read in another numbering than the user's:
    // a NEW index counts the GPUs this command's CUDA_VISIBLE_DEVICES names.
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    const bool new_index = std::any_of(device_map.begin(), device_map.end(), [](const auto& e) {
      return !e.second.empty() && std::isdigit(static_cast<unsigned char>(e.second[0]));
    });
    if (visible && new_index && new_side)
      *err += " (a NEW index counts the GPUs this command's CUDA_VISIBLE_DEVICES='" +
              std::string(visible) + "' names, in its order; a UUID names one GPU whatever it is)";
    return false;
  };
  // A device map is the user's to get right: checked against the manifest
  // and the GPUs here before every file of a checkpoint of perhaps hundreds
  // of GiB is hashed, so that a mistyped one is refused at once.
  const bool map_first = any_cuda && !device_map.empty();
  if (map_first && !plan()) return false;
  *code = kExitBadCheckpoint;
  if (!verify_manifest_files(dir, *m, progress, err, cancelled)) return false;
  if (files_intact) *files_intact = true;
  if (!any_cuda || map_first) return true;
  return plan();
}

/// Every process and thread id the checkpoint gives back: its processes', and
/// each thread's of CRIU's images (one criu/core-ID.img per thread, among the
/// files the manifest lists and verify checked), sorted.
std::vector<pid_t> restored_ids(const Manifest& m) {
  std::set<pid_t> ids;
  for (const ManifestProcess& p : m.processes) ids.insert(p.pid);
  for (const ManifestFile& f : m.files) {
    const std::string& name = f.path;
    if (!name.starts_with("criu/core-") || !name.ends_with(".img")) continue;
    pid_t id = 0;
    if (!parse_num(std::string_view(name).substr(10, name.size() - 14), &id) || id <= 0) continue;
    ids.insert(id);
  }
  return {ids.begin(), ids.end()};
}

/// The first id of ids that a process or thread of this machine holds, with
/// what holds it ("process 123 (sleep)", or "a thread of process 120
/// (python3)"); 0 when none.
pid_t id_in_use(const std::vector<pid_t>& ids, std::string* holder) {
  for (pid_t id : ids) {
    std::string status;
    if (!read_text_file("/proc/" + std::to_string(id) + "/status", &status)) continue;
    std::istringstream lines(status);
    std::string line, name, tgid;
    while (std::getline(lines, line)) {
      if (line.starts_with("Name:\t")) name = line.substr(6);
      if (line.starts_with("Tgid:\t")) tgid = line.substr(6);
    }
    *holder = (tgid == std::to_string(id) ? "process " : "a thread of process ") + tgid + " (" +
              name + ")";
    return id;
  }
  return 0;
}

/// Whether pid is a child of this process: a restored root that a failed
/// CRIU left is (the restore runs in its supervisor, a subreaper); the job
/// of another restore of the same checkpoint, which took the pid, is not.
bool child_of_ours(pid_t pid) {
  return read_ppid(pid) == ::getpid();
}

/// Kills the restored tree and reaps it: the caller is its subreaper, and a
/// zombie left behind would hold a pid that the next restore of this
/// checkpoint needs (where pid 1 does not reap, for ever). With tcp (the
/// checkpoint saved established connections) their sockets go into repair
/// mode first, as the watch does (restore_watch.h): past CRIU's network
/// unlock they are out of it, and closed the ordinary way the peer would see
/// the connection end and its port would stay in TIME-WAIT for a minute, in
/// which the next restore of the checkpoint is refused.
void kill_restored(pid_t root, bool tcp) {
  if (tcp) set_tcp_repair(process_tree(root), TcpRepair::kOn);
  kill_process_tree(root, TreeReap::kAll);
}

}  // namespace

bool verify_checkpoint_coded(const std::string& dir,
                             const std::map<std::string, std::string>& device_map, ExitCode* code,
                             std::string* err, bool* files_intact) {
  Manifest m;
  Driver driver;
  std::vector<CUcheckpointGpuPair> pairs;
  ExitCode c = kExitOk;
  bool ok = verify_impl(dir, device_map, nullptr, &m, &driver, &pairs, &c, err, {}, files_intact);
  if (code) *code = ok ? kExitOk : c;
  return ok;
}

bool verify_checkpoint(const std::string& dir, std::string* err) {
  return verify_checkpoint_coded(dir, {}, nullptr, err);
}

namespace {

/// Whether the job's working directory and each process's executable are
/// where the checkpoint found them; false with *err naming the first that is
/// not. Not checked: one deleted before the checkpoint ("... (deleted)", which
/// CRIU brought along), and a path that was not UTF-8 (the manifest keeps it
/// for showing only, each such byte replaced by U+FFFD; CRIU's images have it).
bool job_files_present(const Manifest& m, std::string* err) {
  auto gone = [](const std::string& path) {
    struct stat st;
    return !path.empty() && path[0] == '/' && !path.ends_with(" (deleted)") &&
           path.find("\xEF\xBF\xBD") == std::string::npos && ::stat(path.c_str(), &st) != 0 &&
           (errno == ENOENT || errno == ENOTDIR);
  };
  std::string what;
  if (gone(m.job.cwd))
    what = "the job's working directory " + m.job.cwd;
  else
    for (const ManifestProcess& p : m.processes)
      if (gone(p.exe)) {
        what = "the executable " + p.exe + " of process " + std::to_string(p.pid);
        break;
      }
  if (what.empty()) return true;
  *err = what +
         " is gone: CRIU restores the job with the files it had, where they were; put it back "
         "and restore again (nothing was restored; the checkpoint is unchanged)";
  return false;
}

}  // namespace

bool restore_job(const RestoreOptions& opts, const ProgressSink& progress, RestoreResult* out,
                 std::string* err) {
  auto report = [&](const char* phase) {
    if (progress) progress(Progress{phase, 0, 0});
  };
  Stopwatch sw;
  out->code = kExitRefused;
  report("check");
  if (!require_root("restore", kRootForRestore, err)) return false;
  CriuInfo criu;
  if (!find_criu(&criu, err, std::getenv("CUSNAP_CRIU_BREAKPOINTS"))) return false;
  int subreaper = 0;
  if (prctl(PR_GET_CHILD_SUBREAPER, &subreaper) != 0 || !subreaper) {
    *err = "restore must run in a child subreaper (the cusnap supervisor); this process is not one";
    return false;
  }
  // A signal that asks to stop, heeded until CRIU starts.
  auto stop_asked = [&] {
    if (!out->interrupted_by && opts.interrupted) out->interrupted_by = opts.interrupted();
    return out->interrupted_by != 0;
  };
  auto stopped = [&] {
    const char* abbrev = sigabbrev_np(out->interrupted_by);
    *err = "the restore of " + opts.dir + " was interrupted (" +
           (abbrev ? "SIG" + std::string(abbrev) : std::to_string(out->interrupted_by)) +
           ") before CRIU started: nothing was restored; the checkpoint is unchanged";
    return false;
  };
  Manifest m;
  Driver driver;
  std::vector<CUcheckpointGpuPair> pairs;
  ExitCode code = kExitOk;
  if (!verify_impl(opts.dir, opts.device_map, progress, &m, &driver, &pairs, &code, err,
                   stop_asked)) {
    out->code = code;
    if (out->interrupted_by) return stopped();
    return false;
  }
  out->phases.emplace_back("verify", sw.lap());
  set_driver_deadlines(driver, opts.timeout, m.gpus);
  // CRIU gives every process and thread its old id back.
  const std::vector<pid_t> ids = restored_ids(m);
  std::string holder;
  if (const pid_t id = id_in_use(ids, &holder)) {
    *err = "process id " + std::to_string(id) + " that the checkpoint restores is in use, by " +
           holder +
           " (the original job still running, another restore of this checkpoint, or a process "
           "not yet reaped?): stop it first (cusnap ps lists jobs), then restore";
    return false;
  }
  // CRIU binds the job's listening sockets again; one whose port is taken
  // here would fail the restore half way.
  for (const TcpListener& l : m.tcp_listeners)
    if (!tcp_listener_bindable(l, err)) return false;
  // CRIU opens each process's executable and the job's working directory
  // where they were; one that is gone fails the restore half way, in
  // words of CRIU's log.
  if (!job_files_present(m, err)) return false;
  // The driver's restore loses a process that finds its GPU's memory taken
  // (gpu_memory.h): checked before CRIU restores anything, and again by
  // driver_resume_all just before the driver's restore.
  {
    RestoreMemory& rm = driver.restore_memory();
    if (!restore_memory_policy(std::getenv(kRestoreMarginSetting), &rm.policy, err)) return false;
    rm.use = manifest_gpu_use(m);
    rm.free_before = m.gpu_free;
    std::vector<pid_t> cuda_pids;
    for (const ManifestProcess& p : m.processes)
      if (p.uses_cuda) cuda_pids.push_back(p.pid);
    std::string why;
    const auto uuid_map = pair_uuid_map(pairs);
    if (!restore_memory_fits(restore_need(rm.use, cuda_pids, uuid_map), rm.policy,
                             map_gpus(rm.free_before, uuid_map), &why, &rm.note)) {
      // A restore may also go onto another GPU of the model with room, where
      // this machine has another GPU.
      std::vector<GpuDevice> here;
      std::string unused;
      const bool others = driver.devices(&here, &unused) && here.size() > 1;
      *err = "checkpoint " + opts.dir + ": " + why +
             (others ? " Or restore onto another GPU of the same model with room: --device-map "
                       "OLD=NEW (cusnap inspect lists the job's GPUs; a UUID names one GPU "
                       "whatever the numbering)."
                     : "") +
             "\nnothing was restored; the checkpoint is unchanged";
      return false;
    }
  }

  if (stop_asked()) return stopped();
  if (opts.before_criu && !opts.before_criu(err)) return false;
  out->code = kExitFailure;
  report("restore");
  TempDir work("cusnap-restore-");
  TempDir no_plugins("cusnap-noplugins-");
  if (!criu_temp_dirs_usable(work, no_plugins, false, err)) return false;
  // Should this process be killed from here on, the watch ends what was
  // restored and removes these two directories, which the destructors would
  // (restore_watch.h). Declared after them: dismissed first on the way out
  // of a failure; after a success it goes on, in *out, until the caller has
  // the job guarded.
  auto watch_owner = std::make_unique<RestoreWatch>();
  RestoreWatch& watch = *watch_owner;
  {
    std::vector<pid_t> pids;
    for (const ManifestProcess& p : m.processes) pids.push_back(p.pid);
    if (!watch.start(pids, opts.dir, opts.report_fd, err, {work.path(), no_plugins.path()}))
      return false;
  }
  std::string pidfile = work.path() + "/root.pid";
  CriuRun run;
  run.args = {"restore",     "-d",  "-D", opts.dir + "/criu", "-W",           work.path(), "-o",
              "restore.log", "-v4", "-L", no_plugins.path(),  "--file-locks", "--pidfile", pidfile};
  auto inherit = [&](int fd, const std::string& id) {
    if (fd < 0 || id.empty()) return;
    run.args.push_back("--inherit-fd");
    run.args.push_back("fd[" + std::to_string(fd) + "]:" + id);
    run.inherit_fds.push_back(fd);
  };
  if (m.tcp_established) run.args.push_back("--tcp-established");
  inherit(opts.stdout_fd, m.job.stdout_pipe_id);
  if (m.job.stderr_pipe_id != m.job.stdout_pipe_id) inherit(opts.stderr_fd, m.job.stderr_pipe_id);
  run.output_path = work.path() + "/criu-output.txt";
  run.log_path = work.path() + "/restore.log";
  run.success_line = "Restore finished successfully";
  run.die_with_caller = true;
  uint64_t bytes = directory_bytes(opts.dir);
  run.timeout = opts.timeout + std::chrono::milliseconds(bytes / 100000);
  std::string why;
  if (!run_criu(criu, run, &why)) {
    work.keep();
    watch.keep_temp_dir(work.path());
    *err = "CRIU restore phase: " + why + "(its files are kept in " + work.path() + ")";
    // CRIU kills what it restored when it fails; make sure, but only of a
    // tree it left to us: another restore may hold the pid by now.
    if (child_of_ours(m.job.root_pid)) kill_restored(m.job.root_pid, m.tcp_established);
    if (const pid_t id = id_in_use(ids, &holder); id && !child_of_ours(id)) {
      out->code = kExitRefused;
      *err = "process id " + std::to_string(id) +
             " that the checkpoint restores was taken while CRIU ran, by " + holder +
             " (another restore of this checkpoint?); nothing was restored: " + *err;
    }
    return false;
  }
  std::string text;
  pid_t root = 0;
  if (read_text_file(pidfile, &text)) root = pid_t(std::atoi(text.c_str()));
  if (root <= 0) root = m.job.root_pid;
  out->root_pid = root;
  out->phases.emplace_back("criu-restore", sw.lap());

  report("driver-restore");
  std::vector<pid_t> cuda;
  for (const ManifestProcess& p : m.processes)
    if (p.uses_cuda) cuda.push_back(p.pid);
  // driver_resume_all goes in reverse; restore in tree order instead.
  std::reverse(cuda.begin(), cuda.end());
  if (!driver_resume_all(driver, cuda, pairs, &why, gpu_choices(m))) {
    kill_restored(root, m.tcp_established);
    *err = "job " + m.job.name + ": " + why +
           "\nthe restored processes were killed; the checkpoint " + opts.dir + " is unchanged";
    return false;
  }
  out->phases.emplace_back("driver-restore", sw.lap());

  // Shared memory: creators load their bytes, importers import them again,
  // everything maps where it was; the gates open once the records match.
  if (!m.shim_processes.empty()) {
    if (progress) progress(Progress{"rebuild", 0, 0});
    SharedMemory shared;
    if (!shared.load_records(opts.dir, m.shim_processes, &why) ||
        !shared_rebuild_in_place(m.job, &shared, opts.dir, opts.timeout, progress, &why)) {
      kill_restored(root, m.tcp_established);
      *err = "job " + m.job.name + ", shared memory: " + why +
             "\nthe restored processes were killed; the checkpoint " + opts.dir + " is unchanged";
      return false;
    }
    out->phases.emplace_back("shared-rebuild", sw.lap());
  }
  out->job = m.job;
  out->job.root_pid = root;
  for (const CUcheckpointGpuPair& p : pairs)
    if (std::memcmp(&p.oldUuid, &p.newUuid, sizeof p.oldUuid) != 0)
      out->gpu_moves.emplace_back(format_gpu_uuid(p.oldUuid), format_gpu_uuid(p.newUuid));
  out->code = kExitOk;
  out->watch = std::move(watch_owner);
  return true;
}

}  // namespace cusnap
