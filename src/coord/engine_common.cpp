// Preconditions, the driver phases shared by checkpoint and suspend, and the
// job listing for ps/inspect.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iterator>
#include <mutex>
#include <thread>

#include "coord/engine_internal.h"
#include "coord/procs.h"
#include "coord/restore_pairs.h"
#include "coord/write_probe.h"
#include "proto/env_settings.h"

namespace cusnap {
namespace engine_detail {

bool require_root(const char* what, const char* remedy, std::string* err) {
  if (geteuid() == 0) return true;
  *err = std::string(what) +
         " needs root (CRIU and the driver's process checkpoint API require it): " + remedy;
  return false;
}

std::string descriptor_shortage() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return "";
  size_t open = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (const dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++open;
    ::closedir(d);
  }
  if (open + 32 < lim.rlim_cur) return "";
  return " (this process has " + std::to_string(open) + " of its " + std::to_string(lim.rlim_cur) +
         " descriptors open, too few left for the driver's device files: raise \"ulimit -n\" "
         "for the cusnap launch or restore that supervises the job)";
}

bool scan_job(const JobInfo& job, Driver* driver, CUprocessState want, const char* operation,
              JobScan* out, std::string* err) {
  std::vector<pid_t> tree = process_tree(job.root_pid);
  if (tree.empty()) {
    *err = "job " + job.name + ": its process " + std::to_string(job.root_pid) +
           " is not running; nothing to " + operation;
    return false;
  }
  for (pid_t pid : tree) {
    ProcessInfo p;
    if (read_process(pid, &p)) out->procs.push_back(p);
  }
  bool any_cuda = false;
  for (const ProcessInfo& p : out->procs) any_cuda |= p.uses_cuda;
  if (any_cuda) {
    if (!driver->load(err)) return false;
    if (!driver->version(&out->driver_version, err)) return false;
    if (!driver->devices(&out->gpus, err)) {
      *err = "the CUDA driver at " + driver->path() + " shows no usable device: " + *err +
             descriptor_shortage();
      return false;
    }
  }
  std::string what;
  for (ProcessInfo& p : out->procs) {
    if (!p.uses_cuda) continue;
    CUprocessState st;
    std::string why;
    if (!driver->get_state(p.pid, &st, &why)) {
      // A process that maps the driver but never initialized it has no GPU
      // state to save; the driver says CUDA_ERROR_NOT_INITIALIZED.
      if (driver->last_result() == CUDA_ERROR_NOT_INITIALIZED) {
        p.uses_cuda = false;
        continue;
      }
      *err = "job " + job.name + ", process " + std::to_string(p.pid) + " (" + p.exe +
             "), inspect phase: " + why;
      return false;
    }
    if (st != want) {
      *err = "job " + job.name + ", process " + std::to_string(p.pid) + ": its GPU state is " +
             process_state_name(st) + ", not " + process_state_name(want) + "; " +
             (st == CU_PROCESS_STATE_CHECKPOINTED || st == CU_PROCESS_STATE_LOCKED
                  ? "the job is suspended: run cusnap resume first"
                  : std::string("cannot ") + operation + " it now");
      return false;
    }
    p.cuda_state = process_state_name(st);
    out->cuda.push_back(p.pid);
    out->gpu_uuids[p.pid] = process_gpu_uuids(p.pid);
  }
  return true;
}

bool no_new_cuda_processes(const JobInfo& job, Driver& driver, const JobScan& scan,
                           const char* operation, std::string* err) {
  for (pid_t pid : process_tree(job.root_pid)) {
    if (std::find(scan.cuda.begin(), scan.cuda.end(), pid) != scan.cuda.end()) continue;
    ProcessInfo p;
    if (!read_process(pid, &p) || !p.uses_cuda) continue;
    CUprocessState st;
    std::string why;
    if (!driver.get_state(pid, &st, &why)) {
      if (driver.last_result() == CUDA_ERROR_NOT_INITIALIZED) continue;  // no GPU state yet
      if (read_process(pid, &p)) {  // still there: its state is unknown, so not saved
        *err = "process " + std::to_string(pid) + " (" + p.exe +
               ") of the job maps the CUDA driver, which cannot tell its GPU state: " + why;
        return false;
      }
      continue;  // it exited meanwhile
    }
    *err = "process " + std::to_string(pid) + " (" + p.exe + ") began to use the GPU during the " +
           operation + ", after the job's processes were listed, so its GPU state would not be " +
           "saved; run cusnap " + operation + " again";
    return false;
  }
  return true;
}

bool job_unchanged_since_scan(const JobInfo& job, Driver& driver, const JobScan& scan,
                              SharedMemory* sm, const char* operation, std::string* err) {
  if (!no_new_cuda_processes(job, driver, scan, operation, err)) return false;
  if (sm->active()) return true;  // its records were read again behind closed gates
  std::string why;
  if (sm->unshared_since_inspect(&why)) return true;
  *err = why + "; the driver cannot restore a process that imported shared memory without the " +
         "cusnap shim rebuilding it, so the " + operation + " is undone: run cusnap " + operation +
         " again, which then saves the shared memory through the shim";
  return false;
}

bool driver_suspend_all(Driver& d, const std::vector<pid_t>& pids,
                        std::chrono::milliseconds timeout, bool* rolled_back, std::string* err,
                        const std::function<bool(std::string*)>& when_locked,
                        const std::function<bool(std::string*)>& when_checkpointed) {
  *rolled_back = true;
  std::vector<pid_t> locked;
  std::string why;
  const char* phase = "lock";
  bool ok = true;
  // A process that ended under the driver's call fails it with a driver
  // error: said as what happened.
  auto ended = [&](pid_t pid, const char* call) {
    if (!process_runs(pid))
      why = "process " + std::to_string(pid) + " ended during the driver's " + call + " (" + why +
            ")";
  };
  for (pid_t pid : pids) {
    // Brought back even when its lock fails: a lock given up at the call's
    // deadline may still take hold afterwards (one the driver answered
    // NOT_READY left the process running, which the bringing back leaves).
    locked.push_back(pid);
    if (!d.lock(pid, timeout, &why)) {
      ended(pid, "lock");
      ok = false;
      break;
    }
  }
  if (ok && when_locked && !when_locked(&why)) {
    ok = false;
    phase = nullptr;
  }
  if (ok) {
    phase = "checkpoint";
    for (pid_t pid : pids) {
      if (!d.checkpoint(pid, &why)) {
        ended(pid, "checkpoint");
        ok = false;
        break;
      }
    }
  }
  if (ok && when_checkpointed && !when_checkpointed(&why)) {
    ok = false;
    phase = nullptr;
  }
  if (ok) return true;
  *err = phase ? std::string("driver ") + phase + " phase: " + why : why;
  std::string rb;
  if (!driver_bring_back(d, locked, &rb)) {
    *rolled_back = false;
    *err += "; bringing the processes back failed too: " + rb;
  }
  return false;
}

bool driver_bring_back(Driver& d, const std::vector<pid_t>& all, std::string* err) {
  const std::chrono::milliseconds pauses[] = {std::chrono::milliseconds(100),
                                              std::chrono::milliseconds(500)};
  std::string first, last;
  for (size_t pass = 0;; ++pass) {
    last.clear();
    // A process that ended has nothing to bring back (its GPU state went
    // with it); the job's end is said by its caller (after_roll_back).
    std::vector<pid_t> pids;
    for (pid_t pid : all)
      if (process_runs(pid)) pids.push_back(pid);
    if (driver_resume_all(d, pids, {}, &last)) return true;
    if (pass == 0) first = last;
    // Once the driver refused a restore for lack of memory, it never restores
    // that process: another pass cannot help. Memory found short before any
    // restore is not freed in a second either: the job is left suspended.
    if (pass == std::size(pauses) || d.restore_refused() || d.restore_memory().fell_short) {
      *err = pass == 0 || last == first ? last : first + "; then: " + last;
      if (pass > 0 && last == first) *err += " (" + std::to_string(pass + 1) + " tries)";
      return false;
    }
    std::this_thread::sleep_for(pauses[pass]);
  }
}

std::vector<pid_t> initialized_only(Driver& d, const std::vector<pid_t>& pids) {
  std::vector<pid_t> out;
  for (pid_t pid : pids) {
    CUprocessState st;
    std::string why;
    if (!d.get_state(pid, &st, &why) && d.last_result() == CUDA_ERROR_NOT_INITIALIZED) continue;
    out.push_back(pid);
  }
  return out;
}

std::string after_roll_back(const JobInfo& job, const std::vector<pid_t>& pids) {
  if (!process_runs(job.root_pid))
    return "the job ended (its process " + std::to_string(job.root_pid) + " is gone)";
  std::string gone;
  for (pid_t pid : pids)
    if (!process_runs(pid)) gone += (gone.empty() ? "" : ", ") + std::to_string(pid);
  if (gone.empty()) return "the job runs on unchanged";
  return "process " + gone + " of the job ended; the others run on unchanged";
}

GpuChoices gpu_choices(const Manifest& m) {
  GpuChoices out;
  for (const ManifestProcess& p : m.processes) {
    if (!p.uses_cuda) continue;
    auto& choices = out[p.pid];
    std::vector<std::string> used;
    for (const auto& [uuid, bytes] : p.gpu_memory)
      if (bytes > 0) used.push_back(uuid);
    for (std::vector<std::string> gpus : {p.gpus, used}) {
      std::sort(gpus.begin(), gpus.end());
      if (!gpus.empty() && std::find(choices.begin(), choices.end(), gpus) == choices.end())
        choices.push_back(gpus);
    }
  }
  return out;
}

std::vector<CUcheckpointGpuPair> pairs_of(const std::vector<CUcheckpointGpuPair>& pairs,
                                          const std::vector<std::string>& gpus) {
  std::vector<CUcheckpointGpuPair> out;
  for (const CUcheckpointGpuPair& p : pairs)
    if (std::find(gpus.begin(), gpus.end(), format_gpu_uuid(p.oldUuid)) != gpus.end())
      out.push_back(p);
  return out;
}

namespace {

/// The driver's restore of pid with the pairs of its GPUs, one choice after
/// another while refused INVALID_VALUE, then every pair (restore_pair_tries).
bool restore_with_choices(Driver& d, pid_t pid, const std::vector<CUcheckpointGpuPair>& pairs,
                          const GpuChoices& choices, std::string* err) {
  static const std::vector<std::vector<std::string>> kNone;
  const auto it = choices.find(pid);
  const std::vector<std::vector<CUcheckpointGpuPair>> tries =
      restore_pair_tries(pairs, it != choices.end() ? it->second : kNone);
  std::string refused;  // "GPU-a; GPU-a, GPU-b": the pairs refused before
  for (size_t i = 0; i < tries.size(); ++i) {
    std::string why;
    if (d.restore(pid, tries[i], &why)) return true;
    if (d.last_result() != CUDA_ERROR_INVALID_VALUE || i + 1 == tries.size()) {
      *err = why + (refused.empty() ? "" : " (refused before it: the pairs of " + refused + ")");
      return false;
    }
    std::string named;
    for (const CUcheckpointGpuPair& p : tries[i])
      named += (named.empty() ? "" : ", ") + format_gpu_uuid(p.oldUuid);
    refused += (refused.empty() ? "" : "; of ") + named;
  }
  return false;
}

}  // namespace

bool driver_resume_all(Driver& d, const std::vector<pid_t>& pids,
                       const std::vector<CUcheckpointGpuPair>& pairs, std::string* err,
                       const GpuChoices& choices) {
  bool ok = true;
  auto add = [&](const std::string& m) {
    if (!err->empty()) *err += "; ";
    *err += m;
    ok = false;
  };
  // Every state first: the processes to restore need their memory free
  // together, and none is restored when it is not (gpu_memory.h).
  std::vector<CUprocessState> states(pids.size(), CU_PROCESS_STATE_FAILED);
  std::vector<std::string> state_errors(pids.size());
  std::vector<pid_t> to_restore;
  for (size_t i = 0; i < pids.size(); ++i)
    if (d.get_state(pids[i], &states[i], &state_errors[i]) &&
        states[i] == CU_PROCESS_STATE_CHECKPOINTED)
      to_restore.push_back(pids[i]);
  RestoreMemory& rm = d.restore_memory();
  rm.fell_short = false;
  if (!to_restore.empty()) {
    std::string why;
    const auto uuid_map = pair_uuid_map(pairs);
    if (!restore_memory_fits(restore_need(rm.use, to_restore, uuid_map), rm.policy,
                             map_gpus(rm.free_before, uuid_map), &why, &rm.note)) {
      rm.fell_short = true;
      add("driver restore phase: " + why);
      return false;
    }
  }
  for (size_t k = pids.size(); k-- > 0;) {
    const pid_t pid = pids[k];
    std::string why;
    CUprocessState st = states[k];
    if (!state_errors[k].empty()) {
      add(state_errors[k]);
      continue;
    }
    // Neither restored nor unlocked by any call: a driver call on it failed
    // inside the driver (a restore, say), and it is not brought back. Said,
    // not counted as back (the job would be recorded running, its process
    // stopped for good).
    if (st != CU_PROCESS_STATE_CHECKPOINTED && st != CU_PROCESS_STATE_LOCKED &&
        st != CU_PROCESS_STATE_RUNNING) {
      if (st == CU_PROCESS_STATE_FAILED) d.note_state_failed();
      add("driver restore phase: process " + std::to_string(pid) +
          ": the driver reports its GPU state " +
          (st == CU_PROCESS_STATE_FAILED
               ? std::string("failed (an uncorrectable error in a checkpoint or restore call): "
                             "the driver brings it back no more")
               : "unknown (" + std::to_string(int(st)) + "): neither restored nor unlocked"));
      continue;
    }
    if (st == CU_PROCESS_STATE_CHECKPOINTED) {
      if (!restore_with_choices(d, pid, pairs, choices, &why)) {
        add("driver restore phase: " + why);
        continue;
      }
      st = CU_PROCESS_STATE_LOCKED;
    }
    if (st == CU_PROCESS_STATE_LOCKED && !d.unlock(pid, &why)) add("driver unlock phase: " + why);
  }
  return ok;
}

std::chrono::milliseconds driver_deadline(std::chrono::milliseconds base,
                                          const std::vector<GpuDevice>& gpus) {
  uint64_t bytes = 0;
  for (const GpuDevice& g : gpus) bytes += g.total_mem;
  return base + std::chrono::milliseconds(bytes / 500000);
}

void set_driver_deadlines(Driver& d, std::chrono::milliseconds base,
                          const std::vector<GpuDevice>& gpus) {
  d.set_call_deadline(driver_deadline(base, gpus),
                      base + proto::control_timeout_from_env(proto::kDefaultTimeout));
}

std::chrono::milliseconds criu_kill_grace() {
  uint64_t ms = 0;
  if (std::string why; !proto::env_number_checked(proto::kCriuKillGraceMs, &ms, &why))
    ms = proto::kCriuKillGraceMs.fallback;
  return std::chrono::milliseconds(ms);
}

namespace {

/// The prefixes of the temporary directories a checkpoint and a restore make.
constexpr const char* kTempPrefixes[] = {"cusnap-dump-", "cusnap-restore-", "cusnap-noplugins-"};

/// The pid a temporary directory's name holds (PREFIX PID "-" XXXXXX); 0
/// when the name is not one of ours.
pid_t temp_dir_owner(const std::string& name) {
  for (const char* prefix : kTempPrefixes) {
    const size_t n = std::strlen(prefix);
    if (name.compare(0, n, prefix) != 0) continue;
    const size_t dash = name.find('-', n);
    pid_t pid = 0;
    if (dash == std::string::npos || name.size() != dash + 7 ||
        !parse_num(std::string_view(name).substr(n, dash - n), &pid))
      return 0;
    return pid;
  }
  return 0;
}

}  // namespace

size_t sweep_stale_temp_dirs(const std::string& base, std::chrono::seconds min_age) {
  size_t removed = 0;
  const time_t now = ::time(nullptr);
  for (const std::string& name : list_dir(base)) {
    const pid_t owner = temp_dir_owner(name);
    if (owner <= 0) continue;
    const std::string path = base + "/" + name;
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() ||
        now - st.st_mtime < min_age.count())
      continue;
    if (::kill(owner, 0) == 0 || errno != ESRCH) continue;  // its maker may still use it
    // Kept for the files a failure's message names (TempDir::keep).
    if (struct stat kst; ::lstat((path + "/" + kTempKeptMarker).c_str(), &kst) == 0) continue;
    std::error_code ec;
    if (std::filesystem::remove_all(path, ec) > 0 && !ec) ++removed;
  }
  return removed;
}

TempDir::TempDir(const char* prefix) {
  const char* env = getenv("TMPDIR");
  const std::string base = env && *env ? env : "/tmp";
  // What a checkpoint or restore killed outright (SIGKILL, the OOM killer)
  // left: its destructor never ran.
  static std::once_flag swept;
  std::call_once(swept, [&] { sweep_stale_temp_dirs(base, kStaleTempAge); });
  std::string tmpl = base + "/" + prefix + std::to_string(::getpid()) + "-XXXXXX";
  if (mkdtemp(tmpl.data())) {
    path_ = tmpl;
    return;
  }
  errno_ = errno;
  failure_ = "cannot create a temporary directory in " + base + (env && *env ? " (TMPDIR)" : "") +
             ": " + std::strerror(errno_);
}

bool criu_temp_dirs_usable(const TempDir& work, const TempDir& no_plugins, bool in_supervisor,
                           std::string* err) {
  auto advice = [&](bool missing) {
    return std::string(missing ? "create that directory" : "free space there") +
           (in_supervisor ? ", or launch (or restore) the job with TMPDIR set to another "
                            "directory: its supervisor keeps CRIU's files in the TMPDIR it "
                            "started with, not in this command's"
                          : ", or set TMPDIR to another directory");
  };
  if (!work.ok() || !no_plugins.ok()) {
    const TempDir& failed = work.ok() ? no_plugins : work;
    *err = failed.failure() + ": " + advice(failed.error_number() == ENOENT);
    return false;
  }
  if (int e = 0;
      !probe_write(work.path() + "/probe", "the temporary directory " + work.path(), err, &e)) {
    if (!out_of_descriptors(e)) *err += ": " + advice(false);  // else said already
    return false;
  }
  return true;
}

void TempDir::keep() {
  keep_ = true;
  if (path_.empty()) return;
  // Best effort: without the marker a sweep may take it once its maker is gone.
  const int fd =
      ::open((path_ + "/" + kTempKeptMarker).c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0) ::close(fd);
}

TempDir::~TempDir() {
  if (path_.empty() || keep_) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

uint64_t directory_bytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::end(it); it.increment(ec))
    if (it->is_regular_file(ec)) total += it->file_size(ec);
  return total;
}

std::string utc_now() {
  char buf[32];
  time_t t = time(nullptr);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace engine_detail

std::vector<ProcessInfo> list_job_processes(pid_t root) {
  std::vector<ProcessInfo> out;
  Driver driver;
  bool have_driver = false, tried = false;
  for (pid_t pid : process_tree(root)) {
    ProcessInfo p;
    if (!read_process(pid, &p)) continue;
    if (p.uses_cuda) {
      std::string err;
      if (!tried) {
        have_driver = driver.load(&err);
        tried = true;
      }
      CUprocessState st;
      if (have_driver && driver.get_state(pid, &st, &err)) p.cuda_state = process_state_name(st);
    }
    out.push_back(p);
  }
  return out;
}

}  // namespace cusnap
