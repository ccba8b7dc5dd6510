// recover_job: brings a job back to running after its supervisor died in the
// middle of an operation (guardian.h runs it): the driver's restore + unlock
// of every CUDA process from whatever state it is in, SIGCONT for a tree CRIU
// left stopped, shared memory rebuilt from the operation's saved bytes, and
// every shim gate opened. A CRIU the dead supervisor started is waited for
// (or killed) first: while it runs it holds the job's tasks seized.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>

#include "coord/criu_interrupt.h"
#include "coord/criu_leftovers.h"
#include "coord/engine_internal.h"
#include "coord/manifest.h"
#include "coord/procs.h"
#include "proto/control.h"
#include "proto/env_settings.h"
#include "proto/wire.h"

namespace cusnap {
using namespace engine_detail;

namespace {

/// Whether process pid, of this process's user, runs a CRIU dump: "dump"
/// among its arguments, and with of_root "-t ROOT" too. Anyone can run a
/// process with such arguments, and a debugger or strace traces the job as
/// CRIU does: neither is the CRIU of a dead supervisor, which the recovery
/// waits for and then kills.
bool runs_criu_dump(pid_t pid, const std::string& root_s, bool of_root) {
  std::vector<std::string> argv;
  if (!read_process_argv(pid, &argv)) return false;
  bool dump = false, root = !of_root;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "dump") dump = true;
    if (argv[i] == "-t" && i + 1 < argv.size() && argv[i + 1] == root_s) root = true;
  }
  // The owner last: only a match, not every process of the machine, is looked up.
  struct stat st {};
  return dump && root && ::stat(("/proc/" + std::to_string(pid)).c_str(), &st) == 0 &&
         st.st_uid == ::geteuid();
}

/// The processes running a CRIU dump (runs_criu_dump) that trace a task of
/// `tree` (TracerPid of any thread), or whose arguments are a dump of `root`
/// ("dump ... -t ROOT", a wrapper through CUSNAP_CRIU included): the CRIU
/// that the dead supervisor started, orphaned now.
std::set<pid_t> orphaned_criu(pid_t root, const std::vector<pid_t>& tree) {
  std::set<pid_t> found;
  const pid_t self = ::getpid();
  const std::string root_s = std::to_string(root);
  for (pid_t pid : tree) {
    // Names read first (list_dir): a range-for over a directory_iterator
    // throws from its increment when the process ends meanwhile.
    const std::string tasks = "/proc/" + std::to_string(pid) + "/task/";
    for (const std::string& t : list_dir(tasks)) {
      std::string status;
      if (!read_text_file(tasks + t + "/status", &status)) continue;
      size_t at = status.find("TracerPid:");
      if (at == std::string::npos) continue;
      pid_t tracer = pid_t(std::atoi(status.c_str() + at + 10));
      if (tracer > 0 && tracer != self && runs_criu_dump(tracer, root_s, false))
        found.insert(tracer);
    }
  }
  DIR* d = ::opendir("/proc");
  if (!d) return found;
  while (dirent* e = ::readdir(d)) {
    pid_t pid = pid_t(std::atoi(e->d_name));
    if (pid <= 0 || pid == self) continue;
    if (runs_criu_dump(pid, root_s, true)) found.insert(pid);
  }
  ::closedir(d);
  return found;
}

/// Waits until every process of `pids` has ended, at most `limit`; true if
/// they all did. Not their parent: it watches them through pidfds.
bool wait_ended(const std::set<pid_t>& pids, std::chrono::milliseconds limit) {
  std::vector<UniqueFd> fds;
  for (pid_t pid : pids) fds.push_back(open_pidfd(pid));
  return wait_pidfds_exited(fds, limit);
}

/// How a CRIU dump was run, from its arguments (/proc/PID/cmdline): its
/// --network-lock method where it saved established TCP connections (empty
/// otherwise), and its log (-o, under -W where relative).
struct DumpRun {
  std::string network_lock, log_path;
};
DumpRun dump_run_of(pid_t pid) {
  DumpRun run;
  std::string work, log;
  std::vector<std::string> argv;
  read_process_argv(pid, &argv);
  bool tcp = false;
  std::string method = "nftables";  // CRIU's default under --tcp-established
  for (size_t i = 0; i < argv.size(); ++i) {
    const bool has_value = i + 1 < argv.size();
    if (argv[i] == "--tcp-established") tcp = true;
    if (argv[i] == "--network-lock" && has_value) method = argv[i + 1];
    if (argv[i] == "-W" && has_value) work = argv[i + 1];
    if (argv[i] == "-o" && has_value) log = argv[i + 1];
  }
  if (tcp) run.network_lock = method;
  run.log_path = log.empty() || log[0] == '/' || work.empty() ? log : work + "/" + log;
  return run;
}

/// The CRIU of a dead supervisor: it may still be dumping the job, its tasks
/// seized (ptrace), their memory visited by its parasite. Left alone it
/// finishes (the tree then stays stopped under --leave-stopped, which the
/// recovery continues); the recovery must not work on the tasks meanwhile.
/// So: wait for it, at most CUSNAP_GUARDIAN_CRIU_WAIT_MS (default 60 s),
/// then stop the tree and kill it (the kernel detaches its tracees, which
/// then stay stopped). true when none is left. Either way it may have left
/// the job's TCP connections locked (criu_leftovers.h): *dump says how it
/// ran, so that the recovery lifts that lock.
bool settle_criu(const JobInfo& job, const std::vector<pid_t>& tree,
                 const std::function<void(const std::string&)>& note, DumpRun* dump) {
  std::set<pid_t> criu = orphaned_criu(job.root_pid, tree);
  if (criu.empty()) return true;
  // Each of our own user (runs_criu_dump): the log it names may be read.
  for (pid_t pid : criu) {
    if (DumpRun r = dump_run_of(pid); !r.log_path.empty() && dump->log_path.empty()) *dump = r;
  }
  std::string list;
  for (pid_t pid : criu) list += (list.empty() ? "" : ", ") + std::to_string(pid);
  // Checked by launch and restore; another value here (a supervisor of an
  // older cusnap) leaves the default, said.
  uint64_t wait_ms = 0;
  if (std::string why; !proto::env_number_checked(proto::kGuardianCriuWaitMs, &wait_ms, &why)) {
    wait_ms = proto::kGuardianCriuWaitMs.fallback;
    note(why + ": " + std::to_string(wait_ms) + " is used");
  }
  if (wait_ended(criu, std::chrono::milliseconds(wait_ms))) {
    note("CRIU (process " + list + ") of the dead supervisor finished; no process of it is left");
    return true;
  }
  // Not while it drives a process by ptrace alone, which a kill would end
  // (criu_interrupt.h), up to CUSNAP_CRIU_KILL_GRACE_MS more.
  const auto grace = criu_kill_grace();
  CriuDumpLog log(dump->log_path);
  const auto grace_end = std::chrono::steady_clock::now() + grace;
  bool killable = log.killable();
  while (!killable && std::chrono::steady_clock::now() < grace_end &&
         !wait_ended(criu, std::chrono::milliseconds(10)))
    killable = log.killable();
  if (wait_ended(criu, std::chrono::milliseconds(0))) {
    note("CRIU (process " + list + ") of the dead supervisor finished; no process of it is left");
    return true;
  }
  for (pid_t pid : tree) signal_pidfd(open_pidfd(pid), SIGSTOP);
  // With what each forked (a helper CRIU forked at its start, left alone,
  // stays stopped for ever).
  for (pid_t pid : criu) kill_process_tree(pid, TreeReap::kAll);
  bool gone = wait_ended(criu, std::chrono::seconds(10));
  note("CRIU (process " + list + ") of the dead supervisor still ran after " +
       std::to_string(wait_ms) + " ms: killed" +
       (killable ? ""
                 : " while it drove a process of the job by ptrace alone, " +
                       std::to_string(grace.count()) + " ms after it was due to end") +
       (gone ? "" : ", but it did not end"));
  return gone;
}

}  // namespace

bool recover_job(const JobInfo& job, const std::string& state_dir_given, bool remove_partial,
                 std::string* report, std::chrono::milliseconds timeout, RecoverBlock* blocked,
                 const char* margin, const RecoverDump& began) {
  RecoverBlock block = RecoverBlock::kNone;
  if (blocked) *blocked = block;
  // A job left suspended by a failed roll back keeps its saved shared memory
  // where the marker says (the supervisor may die before cusnap resume).
  LeftSuspended left;
  const bool was_left = read_left_suspended(job, &left);
  const std::string state_dir = was_left ? left.state_dir : state_dir_given;
  bool ok = true;
  auto note = [&](const std::string& line) { *report += line + "\n"; };
  std::vector<pid_t> tree = process_tree(job.root_pid);
  if (tree.empty()) {
    note("the job is gone: nothing to recover");
    return true;
  }
  // CRIU first: nothing touches the tasks while it holds them.
  DumpRun dump;
  if (!settle_criu(job, tree, note, &dump)) ok = false;
  // No CRIU left to tell how it ran: it ended before the supervisor died
  // (a dump that succeeded, then the checksums took minutes); the supervisor
  // said how it started it.
  if (dump.log_path.empty() && !began.log_path.empty())
    dump = DumpRun{began.network_lock, began.log_path};
  tree = process_tree(job.root_pid);
  // A dump that succeeded (--leave-stopped) or was killed leaves the job's
  // TCP connections locked; lifted before the tree runs again. Sockets in
  // repair mode are taken out of it even where no CRIU was seen.
  if (const std::string lifted = lift_criu_network_lock(tree, dump.network_lock, dump.log_path);
      !lifted.empty())
    note(lifted);
  std::vector<pid_t> cuda;
  for (pid_t pid : tree) {
    ProcessInfo p;
    if (read_process(pid, &p) && p.uses_cuda) cuda.push_back(pid);
  }
  // A tree CRIU left stopped (--leave-stopped) runs again first: the
  // driver's restore needs the process to run (the simulated driver's
  // GetState asks the process itself; it found a stopped one unanswering).
  // The application's threads still wait at the driver's and the shim's
  // gates until the steps below open them.
  for (pid_t pid : tree) signal_pidfd(open_pidfd(pid), SIGCONT);
  // Then the driver: every process from whatever state it is in.
  if (!cuda.empty()) {
    Driver driver;
    std::string why;
    // The free-memory check as the last checkpoint or suspend noted it; a
    // bad setting does not stop a recovery: the default stands.
    if (!load_gpu_use(job, margin ? margin : std::getenv(kRestoreMarginSetting), &driver, &why)) {
      note(why + ": the default margin is used");
      why.clear();
    }
    // Bounded as an operation's calls are (by the timeout, and by the
    // devices' memory for a restore): a driver call that never returns must
    // not keep the guardian from supervising the job, nor a resume from
    // answering. Without the devices the timeout alone bounds a call.
    const bool loaded = driver.load(&why);
    if (loaded) {
      std::vector<GpuDevice> gpus;
      if (std::string unseen; !driver.devices(&gpus, &unseen)) gpus.clear();
      set_driver_deadlines(driver, timeout, gpus);
    }
    // A process that maps the driver but never initialised it (a worker
    // forked after its parent started CUDA) has no GPU state to bring back:
    // left out, as a checkpoint's scan and a resume leave it out.
    const std::vector<pid_t> on_gpu = loaded ? initialized_only(driver, cuda) : cuda;
    if (!loaded) {
      note("the driver: " + why);
      ok = false;
    } else if (!driver_bring_back(driver, on_gpu, &why)) {
      note("driver restore: " + why);
      ok = false;
      // A job the driver refused once is refused for good, whatever this
      // try found (the memory short again, or a 304).
      if (driver.restore_refused() || (was_left && left.restore_refused))
        block = RecoverBlock::kRestoreRefused;
      else if (driver.restore_memory().fell_short)
        block = RecoverBlock::kMemoryShort;
    } else {
      note("driver state of " + std::to_string(on_gpu.size()) + " process(es): running");
    }
  }
  // Shared memory: rebuilt from the saved bytes where the operation saved
  // them (a release may have happened), then every gate opens.
  const std::string shim_dir = shim_dir_of(job);
  std::vector<pid_t> saved;
  std::string why;
  bool gates_stay = false;
  if (block == RecoverBlock::kMemoryShort) {
    // Nothing was restored: the shared memory and the gates wait for the
    // GPU state (a thread let through would call a checkpointed driver), and
    // the job stays as it was.
    gates_stay = true;
  } else if (was_left && left.saved && saved_shim_processes(state_dir).empty()) {
    // The gates stay closed: the memory they guard is released.
    gates_stay = true;
    block = RecoverBlock::kSavedMemoryGone;
    note("shared memory: what the failed " + left.operation + " saved in " + state_dir +
         " is gone, so the job's shared memory cannot be rebuilt");
    ok = false;
  } else if (!shared_rebuild_saved(job, state_dir, timeout, &saved, &why)) {
    note("shared memory: " + why);
    ok = false;
  } else if (!saved.empty()) {
    note("shared memory of " + std::to_string(saved.size()) + " process(es): rebuilt");
  }
  // Gates closed before anything was saved (or left by a failed rebuild's
  // caller) open now; a gate of a process whose memory is still released
  // stays closed, so that no thread touches memory that is not there.
  for (pid_t pid : cuda) {
    std::string path = proto::shim_control_socket(shim_dir, pid);
    struct stat st {};
    if (gates_stay || ::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    if (!ok && std::find(saved.begin(), saved.end(), pid) != saved.end()) continue;
    ShimClient c;
    std::string w;
    if (c.connect(path, pid, proto::control_timeout_from_env(), &w) && c.gate_open(&w)) continue;
    note("gate of process " + std::to_string(pid) + ": " + w);
    ok = false;
  }
  if (!ok) {
    if (blocked) *blocked = block;
    // Nothing saved is removed: a later cusnap resume tries again from it.
    if (!was_left) {
      const std::string m = leave_suspended(job, state_dir, false, "recovery", *report,
                                            block == RecoverBlock::kRestoreRefused);
      note(m.substr(m.find_first_not_of('\n')));
    } else if (block == RecoverBlock::kRestoreRefused) {
      note_restore_refused(job);
    }
    return false;
  }
  if (was_left) clear_left_suspended(job, left);
  std::error_code ec;
  // What a suspend saved is rebuilt: removed, as its resume does (left, its
  // records would name processes to a later resume's rebuild).
  if (!was_left && state_dir == suspend_state_dir(job)) std::filesystem::remove_all(state_dir, ec);
  // A checkpoint without its manifest is only debris.
  if (remove_partial && !state_dir.empty() &&
      !std::filesystem::exists(state_dir + "/" + kManifestName, ec)) {
    for (const std::string& name : list_dir(state_dir))
      std::filesystem::remove_all(state_dir + "/" + name, ec);
    note("the unfinished checkpoint in " + state_dir + " was removed");
  }
  return true;
}

}  // namespace cusnap
