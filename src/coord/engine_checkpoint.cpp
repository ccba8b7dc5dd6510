// checkpoint_job: preconditions, driver lock + checkpoint, CRIU dump,
// checksums, manifest, then stop the job or let it run on.
//
// CRIU options, chosen for jobs that a cusnap supervisor runs:
// - the job is a session leader whose stdout/stderr are pipes to the
//   supervisor: dump needs nothing for them; restore reconnects them with
//   --inherit-fd (the pipe ids are in the manifest).
// - --file-locks: jobs commonly hold flock()s (lock files); harmless without.
// - -L EMPTY: no CRIU plugins. CRIU's CUDA plugin would drive the same
//   driver checkpoint a second time; cusnap does it itself.
// - --leave-stopped (default mode): after the dump the tree stays stopped, so
//   it never runs past the dumped state; cusnap kills it once the manifest is
//   safely written, or continues it if anything fails before that.
// - --leave-running (--leave-running mode): the tree goes on; its GPU state is
//   restored right after the dump.
// - --tcp-established, only when the job holds established TCP connections
//   (torchrun's store, NCCL's bootstrap sockets between ranks), with
//   --network-lock $CUSNAP_CRIU_NETWORK_LOCK (default nftables, which CRIU
//   does itself, without the iptables programs); the manifest records it and
//   the restore passes it too. Connections to outside the job come back only
//   where their peer still is.
// - --ghost-limit: deleted files the job holds open or mapped (NCCL's host
//   buffers in /dev/shm when its ranks talk over sockets, tensors PyTorch
//   shares through unlinked shared memory) are saved whole, whatever their
//   size, unless CUSNAP_CRIU_GHOST_LIMIT caps it (CRIU's own default, 1 MiB,
//   fails such jobs).
// - not used: --ext-unix-sk (a job connected to outside unix sockets cannot be restored
//   faithfully), --link-remap (CRIU keeps small deleted files as ghost
//   files already; link-remap would leave links behind in the job's tree).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "coord/criu_interrupt.h"
#include "coord/criu_leftovers.h"
#include "coord/engine_internal.h"
#include "coord/manifest.h"
#include "coord/ports.h"
#include "coord/procs.h"
#include "coord/runtime_dir.h"
#include "coord/settings.h"
#include "coord/sha256_chunked.h"

namespace cusnap {
using namespace engine_detail;
namespace fs = std::filesystem;

namespace {

/// After open_pidfd(pid) failed (errno still its): true when pid has ended
/// (nothing to hold); else *why says why it cannot be held.
bool unheld_ended(pid_t pid, std::string* why) {
  const int e = errno;
  if (e == ESRCH) return true;
  *why = "cannot hold its process " + std::to_string(pid) + " (pidfd_open: " + std::strerror(e) +
         ")" +
         (out_of_descriptors(e)
              ? ": the supervisor has too few descriptors for the job's processes (raise "
                "\"ulimit -n\" for the cusnap launch or restore that supervises it)"
              : "");
  return false;
}

/// Why an existing checkpoint directory is not taken: not_private's reason
/// for it, said with what it risks and what to do.
std::string dir_not_private(const std::string& dir, const std::string& why) {
  return "the checkpoint directory " + dir + ": " + why +
         ": a checkpoint holds the job's whole memory and a restore runs what it says as "
         "root, so cusnap writes one only into a directory of its own user that no one else may "
         "change (another user could plant links there that its files would be written "
         "through, or change them before a restore); give a path that does not exist yet "
         "(cusnap makes it, private) or a directory of your own";
}

/// Whether the directories above real (resolved) pass path_not_held, as a
/// restore requires (checkpoint_dir_private); *err says what to do when not.
bool restorable_path(const std::string& dir, const std::string& real, std::string* err) {
  const std::string why = path_not_held(real);
  if (why.empty()) return true;
  *err = "the checkpoint directory " + not_held_refusal(dir, why, true);
  return false;
}

/// Held in a checkpoint directory from its claim until criu/ is made there.
constexpr const char* kClaimFile = ".cusnap-claim";

/// Whether the directory a is a checkpoint, finished or being written: one
/// claimed (kClaimFile), or one whose criu/ (private, 0700, as a checkpoint
/// makes it) holds CRIU's images, or nothing yet. A directory that merely
/// holds a criu/ (a CRIU source tree, a user's own dump directory, which
/// CRIU does not make) is none; nor is one with another program's
/// manifest.json.
bool is_checkpoint_dir(const fs::path& a) {
  std::error_code ec;
  if (fs::exists(a / kClaimFile, ec)) return true;
  const fs::path criu = a / "criu";
  const fs::file_status st = fs::symlink_status(criu, ec);
  if (!fs::is_directory(st) || st.permissions() != fs::perms::owner_all) return false;
  fs::directory_iterator it(criu, ec), end;
  if (ec) return false;
  if (it == end) return true;  // made, CRIU not yet begun
  for (; it != end; it.increment(ec)) {
    if (ec) return false;
    if (it->path().extension() == ".img") return true;
  }
  return false;
}

/// Whether real (resolved; the checkpoint directory to be) lies outside every
/// checkpoint and every runtime directory (the job's own, or an entry of the
/// runtime base holding a lock file); *err says which one it is in when not.
/// A checkpoint holds only what its manifest lists (another written into it
/// would leave it unrestorable, and its roll back would remove it), and a
/// runtime directory is removed with its job. The runtime base itself may
/// hold checkpoints: only runtime directories in it are cleaned.
bool outside_others(const std::string& dir, const fs::path& real, const std::string& runtime_dir,
                    std::string* err) {
  auto resolved = [&](const std::string& p) {
    char buf[PATH_MAX];
    return !p.empty() && ::realpath(p.c_str(), buf) != nullptr ? fs::path(buf) : fs::path();
  };
  const fs::path base = resolved(runtime_base()), own = resolved(runtime_dir);
  for (fs::path a = real.parent_path(); !a.empty(); a = a.parent_path()) {
    if (is_checkpoint_dir(a)) {
      *err = "the checkpoint directory " + dir + " is inside the checkpoint " + a.string() +
             ", which would then hold files its manifest does not list and could no longer be "
             "restored: choose a -o DIR outside it";
      return false;
    }
    if (a == own || (!base.empty() && a.parent_path() == base && holds_lock_file(a.string()))) {
      *err = "the checkpoint directory " + dir + " is inside " +
             (a == own ? "the job's runtime directory " : "the runtime directory ") + a.string() +
             ", which cusnap removes with its job: choose a -o DIR outside it";
      return false;
    }
    if (a == a.root_path()) break;
  }
  return true;
}

// Checks opts.dir without changing anything: absent (its parent must exist)
// or an empty directory of this user's that no one else may write to, below
// directories a restore accepts, and outside other checkpoints and runtime
// directories.
bool check_output_dir(const std::string& dir, const std::string& runtime_dir, bool* exists,
                      std::string* err) {
  std::error_code ec;
  if (dir.empty()) {
    *err = "no checkpoint directory given";
    return false;
  }
  auto st = fs::symlink_status(dir, ec);
  *exists = fs::exists(st);
  // Where the checkpoint's files go must take them: a read-only file system
  // or a directory without write permission is said here, before the job is
  // touched, not later by CRIU for a subdirectory.
  auto writable = [&](const std::string& where) {
    if (::access(where.c_str(), W_OK | X_OK) == 0) return true;
    *err = "cannot write the checkpoint into " + where + ": " + std::strerror(errno) +
           ": choose another -o DIR";
    return false;
  };
  if (!*exists) {
    fs::path parent = fs::absolute(dir, ec).parent_path();
    if (!fs::is_directory(parent, ec)) {
      const bool there = fs::exists(fs::symlink_status(parent, ec));
      *err = "the parent of the checkpoint directory " + dir + " (" + parent.string() +
             (there ? ") is not a directory: choose another -o DIR"
                    : ") does not exist: create it or choose another -o DIR");
      return false;
    }
    char real[PATH_MAX];
    if (::realpath(parent.c_str(), real) != nullptr) {
      const std::string target = std::string(real) + "/" + fs::path(dir).filename().string();
      if (!outside_others(dir, target, runtime_dir, err)) return false;
      if (::geteuid() == 0 && !restorable_path(dir, target, err)) return false;
    }
    return writable(parent.string());
  }
  if (fs::is_symlink(st)) {
    // Written by root, a link could send the checkpoint anywhere it points.
    *err = dir + " is a symbolic link (to " + fs::read_symlink(dir, ec).string() +
           "): give the directory itself, or another -o DIR";
    return false;
  }
  if (!fs::is_directory(st)) {
    *err = dir + " exists and is not a directory: choose another -o DIR";
    return false;
  }
  if (std::string why = not_private(dir, ::geteuid()); !why.empty()) {
    *err = dir_not_private(dir, why);
    return false;
  }
  if (char real[PATH_MAX]; ::realpath(dir.c_str(), real) != nullptr) {
    if (!outside_others(dir, real, runtime_dir, err)) return false;
    if (::geteuid() == 0 && !restorable_path(dir, real, err)) return false;
  }
  if (!fs::is_empty(dir, ec)) {
    *err = "the checkpoint directory " + dir +
           " is not empty: choose a new or empty directory (-o DIR), or remove what is in it";
    return false;
  }
  return writable(dir);
}

/// Makes the checkpoint directory this run's alone, after check_output_dir:
/// another checkpoint (of another job) given the same -o DIR meanwhile must
/// be refused, not write its images among these, nor have its roll back
/// remove them. The directory (made here if absent) is claimed through a file
/// only one run can create, and must then hold nothing else; a run that loses
/// leaves it to the winner. A directory made here is private to its owner, as
/// a checkpoint holds the job's whole memory (one given empty keeps the mode
/// it has; what is written into it is private).
bool claim_output_dir(const std::string& dir, bool* existed, std::string* err) {
  if (!*existed && ::mkdir(dir.c_str(), 0700) != 0) {
    if (errno != EEXIST) {
      *err = "cannot create the checkpoint directory " + dir + ": " + std::strerror(errno);
      return false;
    }
    *existed = true;  // another run made it since the check: not ours to remove
  }
  if (*existed) {  // as checked, unless replaced since (by a link, say)
    struct stat st;
    if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      *err = "the checkpoint directory " + dir +
             " is no longer a directory (replaced since it was checked): choose another -o DIR";
      return false;
    }
    if (std::string why = not_private(dir, ::geteuid()); !why.empty()) {
      *err = dir_not_private(dir, why);
      return false;
    }
  }
  const std::string claim = dir + "/" + kClaimFile;
  UniqueFd fd(::open(claim.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) {
    if (!*existed) ::rmdir(dir.c_str());  // only while it is empty
    *err = errno == EEXIST
               ? "another checkpoint is being written into " + dir + ": choose another -o DIR"
               : "cannot write the checkpoint into " + dir + ": " + std::strerror(errno) +
                     ": choose another -o DIR";
    return false;
  }
  // A directory that cannot be listed is not known to be empty.
  int list_errno = 0;
  const std::vector<std::string> names = list_dir(dir, &list_errno);
  if (list_errno != 0) {
    ::unlink(claim.c_str());
    if (!*existed) ::rmdir(dir.c_str());  // only while it is empty
    *err = errno_message("cannot list the checkpoint directory " + dir, list_errno) +
           (out_of_descriptors(list_errno) ? "" : ": choose another -o DIR");
    return false;
  }
  for (const std::string& name : names) {
    if (name == kClaimFile) continue;
    ::unlink(claim.c_str());
    *err = "the checkpoint directory " + dir +
           " is no longer empty (another checkpoint wrote into it): choose another -o DIR";
    return false;
  }
  return true;
}

/// Removes what a failed checkpoint wrote. keep_saved: the job is left
/// suspended and the shared memory saved in shim/ and shared/ is the only
/// copy (leave_suspended), so those stay.
void remove_output(const std::string& dir, bool existed, bool keep_saved = false) {
  std::error_code ec;
  if (!existed && !keep_saved) {
    fs::remove_all(dir, ec);
    return;
  }
  // Names read first (list_dir): a directory_iterator's increment throws on
  // a read error, and entries are removed as the loop goes.
  for (const std::string& name : list_dir(dir)) {
    if (keep_saved && (name == "shim" || name == "shared")) continue;
    fs::remove_all(dir + "/" + name, ec);
  }
  if (!existed) fs::remove(dir, ec);  // only when empty
}

}  // namespace

bool checkpoint_job(const JobInfo& job, const CheckpointOptions& opts, const ProgressSink& progress,
                    CheckpointResult* out, std::string* err) {
  auto report = [&](const char* phase, uint64_t done = 0, uint64_t total = 0) {
    if (progress) progress(Progress{phase, done, total});
  };
  Stopwatch sw;
  out->code = kExitRefused;
  out->dir = opts.dir;
  // A cancel asked of this checkpoint (CheckpointOptions::cancel); not
  // heeded once a job left running could not be brought back in place
  // (below): its checkpoint then completes, as the one good copy.
  bool heed_cancel = opts.cancel != nullptr;
  auto cancelled = [&] { return heed_cancel && opts.cancel->requested(); };

  // Preconditions: nothing changes until every one holds.
  report("check");
  if (!require_root("checkpoint", kRootForSupervisor, err)) return false;
  if (!refuse_when_left_suspended(job, "checkpoint", err)) return false;
  // Settings the client sent count before this supervisor's environment.
  auto value = [&](const char* name) { return setting(opts.settings, name); };
  // A refused value from this supervisor's environment is said to be.
  auto refused = [&](const char* name) { return refused_setting(opts.settings, name, err); };
  CriuInfo criu;
  if (!find_criu(&criu, err, value("CUSNAP_CRIU_BREAKPOINTS")))
    return refused("CUSNAP_CRIU_BREAKPOINTS");
  bool dir_existed = false;
  if (!check_output_dir(opts.dir, job.runtime_dir, &dir_existed, err)) return false;
  unsigned hash_threads = 0;
  if (!hash_thread_count(value("CUSNAP_HASH_THREADS"), &hash_threads, err))
    return refused("CUSNAP_HASH_THREADS");
  std::string ghost_limit, network_lock;
  if (!criu_ghost_limit(value("CUSNAP_CRIU_GHOST_LIMIT"), &ghost_limit, err))
    return refused("CUSNAP_CRIU_GHOST_LIMIT");
  if (!criu_network_lock(value("CUSNAP_CRIU_NETWORK_LOCK"), &network_lock, err))
    return refused("CUSNAP_CRIU_NETWORK_LOCK");
  Driver driver;
  JobScan scan;
  if (!scan_job(job, &driver, CU_PROCESS_STATE_RUNNING, "checkpoint", &scan, err)) return false;
  // Before shared memory is released: each process's whole use.
  if (!note_gpu_use(job, scan.cuda, value(kRestoreMarginSetting), &driver, err))
    return refused(kRestoreMarginSetting);
  driver.restore_memory().policy.origin = setting_origin(opts.settings, kRestoreMarginSetting);
  set_driver_deadlines(driver, opts.timeout, scan.gpus);
  std::vector<pid_t> pids;
  for (const ProcessInfo& p : scan.procs) pids.push_back(p.pid);
  std::string what;
  if (find_terminal_fd(pids, &what)) {
    *err = "job " + job.name + ": " + what +
           "; CRIU cannot checkpoint a job holding a terminal of another session: launch it "
           "with its input and output redirected";
    return false;
  }
  if (find_io_uring(pids, &what)) {
    *err = "job " + job.name + ": " + what +
           ", whose state CRIU cannot checkpoint (libuv uses it, e.g. in PyTorch's TCPStore: "
           "run the job with USE_LIBUV=0, and torchrun with --rdzv-conf use_libuv=0). Launch "
           "the job with cusnap launch --strict to refuse io_uring in it from the start (libuv "
           "then falls back to epoll)";
    return false;
  }
  TempDir work("cusnap-dump-");
  TempDir no_plugins("cusnap-noplugins-");
  if (!criu_temp_dirs_usable(work, no_plugins, true, err)) return false;
  if (!claim_output_dir(opts.dir, &dir_existed, err)) return false;
  // Again once the directory is this run's: a checkpoint above it may have
  // begun since the check.
  if (char real[PATH_MAX]; ::realpath(opts.dir.c_str(), real) != nullptr &&
                           !outside_others(opts.dir, real, job.runtime_dir, err)) {
    remove_output(opts.dir, dir_existed);
    return false;
  }
  if (opts.on_claimed) opts.on_claimed(!dir_existed);
  std::string criu_dir = opts.dir + "/criu";
  // Private whatever the mode of a directory given empty: CRIU makes its
  // images readable by all, and they hold the job's memory.
  const int made = ::mkdir(criu_dir.c_str(), 0700), mkdir_errno = errno;
  ::unlink((opts.dir + "/" + kClaimFile).c_str());  // criu/ now marks it taken
  if (made != 0) {
    *err = "cannot create the checkpoint directory " + criu_dir + ": " + std::strerror(mkdir_errno);
    remove_output(opts.dir, dir_existed);
    return false;
  }
  // Each process is held by a descriptor, so that the stop, a roll back and
  // the kill reach it, and only it. One that ended since the scan needs
  // none; any other unheld fails the check.
  std::vector<UniqueFd> pidfds;
  for (pid_t pid : pids) {
    pidfds.push_back(open_pidfd(pid));
    if (std::string why_not; !pidfds.back() && !unheld_ended(pid, &why_not)) {
      *err = "job " + job.name + ": " + why_not + "; nothing was changed";
      out->code = kExitFailure;
      pidfds.clear();  // the descriptors the removal may need
      remove_output(opts.dir, dir_existed);
      return false;
    }
  }
  out->phases.emplace_back("check", sw.lap());
  if (cancelled()) {
    *err =
        "job " + job.name + ": " + kCancelledReason + " after the check phase; nothing was changed";
    out->code = kExitFailure;
    remove_output(opts.dir, dir_existed);
    return false;
  }

  // Shared memory: quiesce, save, release (a no-op for a job that shares none).
  SharedMemory shared;
  {
    ExitCode code = kExitRefused;
    if (!shared_prepare(job, scan, opts.timeout, opts.settings, "checkpoint", opts.dir, progress,
                        &shared, &code, err)) {
      out->code = code;
      const bool left = code == kExitJobLost;
      if (left) *err += leave_suspended(job, opts.dir, !dir_existed, "checkpoint", *err);
      remove_output(opts.dir, dir_existed, left);
      return false;
    }
    if (shared.active()) out->phases.emplace_back("shared-save", sw.lap());
    out->collective_cut = shared.cut_counts();
    out->capture_retries = shared.capture_retries();
  }
  // A roll back that failed leaves the job suspended (engine_internal.h);
  // remove_dir: the directory was made here, and goes once empty.
  auto left_suspended = [&](bool remove_dir, const std::string& why) {
    return leave_suspended(job, opts.dir, remove_dir, "checkpoint", why, driver.restore_refused());
  };

  if (cancelled()) {
    std::string rb;
    out->code = kExitFailure;
    if (shared_rebuild_in_place(job, &shared, opts.dir, opts.timeout, {}, &rb)) {
      *err = "job " + job.name + ": " + kCancelledReason + " after the shared-save phase; " +
             after_roll_back(job, scan.cuda);
      remove_output(opts.dir, dir_existed);
      return false;
    }
    const std::string why =
        std::string(kCancelledReason) + "; bringing the job's shared memory back failed: " + rb;
    out->code = kExitJobLost;
    *err = "job " + job.name + ": " + why + left_suspended(!dir_existed, why);
    remove_output(opts.dir, dir_existed, true);
    return false;
  }

  // The driver: lock every CUDA process, then checkpoint each.
  out->code = kExitFailure;
  report("driver-checkpoint");
  bool rolled_back = true;
  // A process that began to use the GPU, or to share device memory, after
  // the scan holds GPU state the driver phase would not save (or could not
  // restore): checked once every process is locked, before any checkpoint,
  // and for a new CUDA process once more after the checkpoints.
  auto unchanged = [&](std::string* why) {
    return job_unchanged_since_scan(job, driver, scan, &shared, "checkpoint", why);
  };
  auto no_newcomer = [&](std::string* why) {
    return no_new_cuda_processes(job, driver, scan, "checkpoint", why);
  };
  // A cancel is looked at once every process is locked, and once each is
  // checkpointed: driver_suspend_all rolls the driver back then.
  auto not_cancelled = [&](const char* when, std::string* why) {
    if (!cancelled()) return true;
    *why = std::string(kCancelledReason) + " " + when;
    return false;
  };
  if (!driver_suspend_all(
          driver, scan.cuda, opts.timeout, &rolled_back, err,
          [&](std::string* why) {
            return unchanged(why) && not_cancelled("once the job was locked", why);
          },
          [&](std::string* why) {
            return no_newcomer(why) && not_cancelled("after the driver checkpoint", why);
          })) {
    std::string rb;
    if (rolled_back && !shared_rebuild_in_place(job, &shared, opts.dir, opts.timeout, {}, &rb)) {
      rolled_back = false;
      *err += "; bringing its shared memory back failed: " + rb;
    }
    *err =
        "job " + job.name + ": " + *err +
        (rolled_back ? "; " + after_roll_back(job, scan.cuda) : left_suspended(!dir_existed, *err));
    if (!rolled_back) out->code = kExitJobLost;
    remove_output(opts.dir, dir_existed, !rolled_back);
    return false;
  }
  complete_gpu_use(job, &driver);
  out->phases.emplace_back("driver-checkpoint", sw.lap());

  // The dump's established TCP connections (counted at the dump) and its
  // log, which names CRIU's run.
  size_t tcp = 0;
  const std::string dump_log = work.path() + "/dump.log";
  // Bring the job back after a failure from here on: lift the lock CRIU may
  // have left on its TCP connections (criu_leftovers.h), continue it (it may
  // be stopped by --leave-stopped, or before a CRIU killed at its timeout),
  // then restore and unlock its GPU state and rebuild its shared memory.
  auto roll_back = [&](const std::string& why) {
    std::string unlocked;
    if (tcp > 0) unlocked = lift_criu_network_lock(pids, network_lock, dump_log);
    for (const UniqueFd& fd : pidfds) signal_pidfd(fd, SIGCONT);
    std::string rb;
    bool ok = driver_bring_back(driver, scan.cuda, &rb);
    if (ok && !shared_rebuild_in_place(job, &shared, opts.dir, opts.timeout, {}, &rb)) {
      ok = false;
      rb = "shared memory: " + rb;
    }
    *err = "job " + job.name + ": " + why + (unlocked.empty() ? "" : "\n" + unlocked) +
           (ok ? "\n" + after_roll_back(job, scan.cuda)
               : "\nbringing the job's GPU state back failed: " + rb +
                     left_suspended(!dir_existed, why + "; bringing the job back failed: " + rb));
    out->code = ok ? kExitFailure : kExitJobLost;
    remove_output(opts.dir, dir_existed, !ok);
    return false;
  };

  // CRIU dump.
  report("dump");
  uint64_t rss = 0;
  for (pid_t pid : pids) {
    std::string statm;
    unsigned long size = 0, resident = 0;
    if (read_text_file("/proc/" + std::to_string(pid) + "/statm", &statm) &&
        std::sscanf(statm.c_str(), "%lu %lu", &size, &resident) == 2)
      rss += uint64_t(resident) * uint64_t(sysconf(_SC_PAGESIZE));
  }
  CriuRun run;
  // The log goes to the work directory (-W) so that it survives a failed
  // dump, whose partial images are removed; after success it joins them.
  run.args = {"dump",
              "-t",
              std::to_string(job.root_pid),
              "-D",
              criu_dir,
              "-W",
              work.path(),
              "-o",
              "dump.log",
              "-v4",
              "-L",
              no_plugins.path(),
              "--file-locks",
              "--ghost-limit",
              ghost_limit,
              opts.leave_running ? "--leave-running" : "--leave-stopped"};
  // Established TCP connections (torchrun's store, NCCL's bootstrap between
  // ranks): CRIU saves them in repair mode; the network is locked meanwhile.
  const std::vector<JobTcpSocket> sockets = job_tcp_sockets(pids);
  tcp = size_t(std::count_if(sockets.begin(), sockets.end(), [](const JobTcpSocket& s) {
    return s.entry.state == kTcpEstablished;
  }));
  if (tcp > 0) {
    run.args.insert(run.args.end(), {"--tcp-established", "--network-lock", network_lock});
  }
  // The ports the job listens on, which a restore checks are free first.
  const std::vector<TcpListener> listeners = job_tcp_listeners(sockets);
  run.output_path = work.path() + "/criu-output.txt";
  run.log_path = dump_log;
  run.success_line = "Dumping finished successfully";
  // A bound that grows with the memory to write (at 100 MB/s at worst).
  run.timeout = opts.timeout + std::chrono::milliseconds(rss / 100000);
  run.on_tick = [&] { report("dump", directory_bytes(criu_dir), rss); };
  // A cancel during the dump ends CRIU as its timeout does; either waits
  // while CRIU drives a process by ptrace alone (criu_interrupt.h), up to
  // CUSNAP_CRIU_KILL_GRACE_MS.
  run.stop_now = [&] { return cancelled(); };
  CriuDumpLog dump_log_watch(dump_log);
  run.killable = [&] { return dump_log_watch.killable(); };
  run.kill_grace = criu_kill_grace();
  // Killed, CRIU lets go of the tasks it held, which would run on at once:
  // stopped first, they wait for the roll back (which continues them).
  run.before_kill = [&] {
    for (const UniqueFd& fd : pidfds) signal_pidfd(fd, SIGSTOP);
  };
  if (opts.on_dump) opts.on_dump(dump_log, tcp > 0 ? network_lock : "");
  std::string why;
  if (!run_criu(criu, run, &why)) {
    if (cancelled())
      return roll_back(std::string(kCancelledReason) + " during the CRIU dump: " + why);
    work.keep();
    if (why.find("Can't dump ghost file") != std::string::npos)
      why += "the job holds a deleted file bigger than CUSNAP_CRIU_GHOST_LIMIT=" + ghost_limit +
             setting_origin(opts.settings, "CUSNAP_CRIU_GHOST_LIMIT") +
             ": raise the limit or unset it\n";
    if (tcp > 0 && (why.find("Locking network failed") != std::string::npos ||
                    why.find("Locking connection failed") != std::string::npos))
      why += "CRIU could not lock the job's TCP connections with " + network_lock +
             " (CUSNAP_CRIU_NETWORK_LOCK" +
             setting_origin(opts.settings, "CUSNAP_CRIU_NETWORK_LOCK") +
             "): where this machine has no nftables, set it to "
             "iptables (needs the iptables programs) or skip (no lock: a packet from outside "
             "the job during the dump may reset a connection)\n";
    return roll_back("CRIU dump phase: " + why + "(CRIU's log and output are kept in " +
                     work.path() + ")");
  }
  std::error_code ec;
  fs::copy_file(run.log_path, criu_dir + "/dump.log", fs::copy_options::overwrite_existing, ec);
  out->phases.emplace_back("dump", sw.lap());
  if (!opts.leave_running) {
    // The stopped tree is stable now; take in any process that appeared
    // after the scan, so the stop and a roll back reach it too.
    for (pid_t pid : process_tree(job.root_pid))
      if (std::find(pids.begin(), pids.end(), pid) == pids.end()) {
        pids.push_back(pid);
        pidfds.push_back(open_pidfd(pid));
        if (std::string why_not; !pidfds.back() && !unheld_ended(pid, &why_not)) {
          ::kill(pid, SIGCONT);  // stopped with the tree, which no descriptor reaches
          return roll_back(why_not);
        }
      }
    // Stopped, no process can begin to use the GPU now: the last look.
    if (!no_newcomer(&why)) return roll_back(why);
    if (cancelled()) return roll_back(std::string(kCancelledReason) + " after the CRIU dump");
  }

  // After --leave-running, a job that cannot be brought back in place is
  // left suspended (exit 6); its dump is whole all the same, so the
  // checkpoint is still completed, and restores.
  std::string left_behind;  // what failed bringing it back in place
  if (opts.leave_running) {
    report("driver-restore");
    std::string rb;
    if (!driver_bring_back(driver, scan.cuda, &rb)) {
      left_behind = "restoring its GPU state in place failed: " + rb;
    } else {
      out->phases.emplace_back("driver-restore", sw.lap());
      if (shared.active()) {
        report("rebuild");
        if (shared_rebuild_in_place(job, &shared, opts.dir, opts.timeout, progress, &rb))
          out->phases.emplace_back("shared-rebuild", sw.lap());
        else
          left_behind = "rebuilding its shared memory in place failed: " + rb;
      }
    }
  }

  if (!left_behind.empty()) heed_cancel = false;

  // Checksums and the manifest, written last: without it nothing restores.
  Manifest m;
  // After --leave-running the job already runs on: a failure only discards
  // the checkpoint. After --leave-stopped it rolls the job back.
  auto fail_late = [&](const std::string& why) {
    if (!opts.leave_running) return roll_back(why);
    const bool left = !left_behind.empty();
    *err = "job " + job.name + ": " +
           (left ? "the dump succeeded but " + left_behind +
                       "; completing the checkpoint failed too: " + why +
                       left_suspended(!dir_existed, left_behind + "; then: " + why)
                 : why + "\nthe job runs on unchanged");
    out->code = left ? kExitJobLost : kExitFailure;
    remove_output(opts.dir, dir_existed, left);
    return false;
  };
  if (cancelled()) return fail_late(std::string(kCancelledReason) + " after the CRIU dump");
  if (!hash_directory(opts.dir, &m.files, progress, &why, kHashChunkSize, cancelled, hash_threads))
    return fail_late(cancelled() ? std::string(kCancelledReason) + " in the checksum phase"
                                 : "checksum phase: " + why);
  if (!flush_to_disk(opts.dir, m.files, &why)) return fail_late("checksum phase: " + why);
  out->phases.emplace_back("checksum", sw.lap());
  m.created = utc_now();
  m.cusnap_version = cusnap_version();
  m.job = job;
  // The processes as dumped: after --leave-stopped the tree as it stood
  // (pids was refreshed then), else as scanned.
  std::vector<ProcessInfo> dumped = scan.procs;
  for (pid_t pid : pids) {
    ProcessInfo p;
    bool known = std::any_of(dumped.begin(), dumped.end(),
                             [&](const ProcessInfo& q) { return q.pid == pid; });
    if (!known && read_process(pid, &p)) dumped.push_back(p);
  }
  for (const ProcessInfo& p : dumped) {
    ManifestProcess mp;
    mp.pid = p.pid;
    mp.ppid = read_ppid(p.pid);
    mp.exe = p.exe;
    mp.cmdline = p.cmdline;
    mp.uses_cuda = std::find(scan.cuda.begin(), scan.cuda.end(), p.pid) != scan.cuda.end();
    if (mp.uses_cuda) {
      mp.gpus = scan.gpu_uuids[p.pid];
      const ProcessGpuUse& use = driver.restore_memory().use;
      if (auto it = use.find(p.pid); it != use.end()) mp.gpu_memory = it->second;
      if (mp.gpus.empty())
        for (const GpuDevice& g : scan.gpus) mp.gpus.push_back(g.uuid);
    }
    m.processes.push_back(mp);
  }
  m.driver_version = scan.driver_version;
  m.gpu_free = driver.restore_memory().free_before;
  m.driver_path = scan.cuda.empty() ? "" : driver.path();
  m.gpus = scan.gpus;
  m.criu_version = criu.version;
  m.criu_path = criu.path;
  m.criu_run_id = criu_run_id(dump_log);
  if (tcp > 0 && !opts.leave_running && network_lock != "skip") m.criu_network_lock = network_lock;
  m.leave_running = opts.leave_running;
  m.tcp_established = tcp > 0;
  m.tcp_listeners = listeners;
  if (shared.active()) m.shim_processes = shared.processes();
  m.phases = out->phases;
  m.phases.emplace_back("manifest", 0.0);
  // The point of no return: once the manifest is written the checkpoint is
  // complete, and a cancel asked after this is too late.
  if (heed_cancel && !opts.cancel->commit())
    return fail_late(std::string(kCancelledReason) + " before the manifest was written");
  if (!write_manifest(opts.dir, m, &why)) return fail_late("manifest phase: " + why);
  out->phases.emplace_back("manifest", sw.lap());
  if (!left_behind.empty()) {
    *err = "job " + job.name + ": the dump succeeded but " + left_behind + "\nthe checkpoint in " +
           opts.dir + " is complete" +
           left_suspended(false, "the dump succeeded but " + left_behind);
    out->code = kExitJobLost;
    return false;
  }

  if (!opts.leave_running) {
    // The checkpoint is complete: stop the job (the supervisor reaps it).
    report("stop");
    // Connections CRIU saved must not be torn down on the wire: a restore
    // binds the same addresses again.
    if (tcp > 0) set_tcp_repair(pids, TcpRepair::kOn);
    for (const UniqueFd& fd : pidfds) signal_pidfd(fd, SIGKILL);
    // "Stopped" means gone: a killed CUDA process spends a moment in the
    // driver's teardown, and a restore started right after this returns
    // needs its pids free. (Killed, they go in the end even past the limit.)
    (void)wait_pidfds_exited(pidfds, opts.timeout);
    out->job_stopped = true;
    out->phases.emplace_back("stop", sw.lap());
  }
  out->bytes = directory_bytes(opts.dir);
  out->code = kExitOk;
  return true;
}

}  // namespace cusnap
