// The checkpoint engine: what the coordinator runs for checkpoint, restore,
// suspend and resume of a job. It drives the driver's process checkpoint API
// (driver.h), CRIU (criu.h) and the manifest (manifest.h). The supervisor
// (supervisor.h) owns the job's processes and calls into this from its
// coordinator thread; the engine never reaps or signals a job by itself,
// except stopping it at the end of a checkpoint when asked to.
//
// Error convention: functions return false (or nullopt) and fill *err with a
// message that names the process, the phase and the call that failed, and
// says what to do. Only src/cli prints and exits.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "coord/restore_watch.h"
#include "proto/control.h"

namespace cusnap {

/// Exit codes of the cusnap binary, documented in man/cusnap.1.
enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,        ///< the operation failed; the job is as it was before it
  kExitUsage = 2,          ///< bad command line
  kExitRefused = 3,        ///< refused before anything changed (a precondition failed)
  kExitNotFound = 4,       ///< no such job or checkpoint
  kExitBadCheckpoint = 5,  ///< the checkpoint directory is invalid, corrupted or incomplete
  /// a failure after a destructive step, and its roll back failed too: the
  /// job is not running; it is left suspended (cusnap resume tries again)
  kExitJobLost = 6,
};

/// Progress of a long phase; the CLI renders it on a terminal and stays quiet
/// in pipes. bytes_total is 0 when unknown.
struct Progress {
  std::string phase;
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
};
using ProgressSink = std::function<void(const Progress&)>;

/// What the supervisor knows about a running job.
struct JobInfo {
  std::string name;
  pid_t root_pid = 0;             ///< session leader of the job's tree
  std::vector<std::string> argv;  ///< the command as launched
  std::string cwd;
  std::string runtime_dir;  ///< the job's private runtime directory
  /// The runtime directory the job's shims were started with
  /// (CUSNAP_RUNTIME_DIR in their environment): their listening sockets are
  /// bound there, so CRIU needs that path to exist on restore. Equal to
  /// runtime_dir for a launched job; kept across restores.
  std::string shim_dir;
  uid_t owner_uid = 0;
  /// Pipe inodes ("pipe:[N]") of the job's stdout and stderr as the root
  /// process sees them, so CRIU can reconnect them on restore.
  std::string stdout_pipe_id, stderr_pipe_id;
};

/// A request to cancel a checkpoint or a suspend, shared by whoever asks
/// (the control server, for a client's "cancel") and the engine, which looks
/// at each phase boundary and, where cheap, inside a long phase, and rolls
/// back as for a failure. The engine commits once it passes the point after
/// which the operation completes (the checkpoint's manifest is about to be
/// written; every process of a suspend is checkpointed): a cancel asked
/// after that is too late. Thread-safe.
class CancelToken {
 public:
  /// Asks to cancel: true when the engine will (or did) see it, false when
  /// it committed already (too late). Asking again says the same.
  bool request() {
    int expected = kNone;
    if (state_.compare_exchange_strong(expected, kRequested)) return true;
    return expected == kRequested;
  }
  /// Whether a cancel was asked before the engine committed.
  bool requested() const { return state_.load() == kRequested; }
  /// The engine passes its point of no return: false when a cancel was
  /// asked before (the engine then rolls back instead).
  bool commit() {
    int expected = kNone;
    return state_.compare_exchange_strong(expected, kCommitted) || expected == kCommitted;
  }

 private:
  enum { kNone, kRequested, kCommitted };
  std::atomic<int> state_{kNone};
};

/// The reason a cancelled operation gives (in *err, before what the roll
/// back said).
inline constexpr const char* kCancelledReason = "cancelled on request";

struct CheckpointOptions {
  std::string dir;             ///< output directory: must not exist or be empty
  bool leave_running = false;  ///< restore GPU state in place and resume after the dump
  std::chrono::milliseconds timeout{
      std::chrono::seconds(60)};  ///< driver lock timeout and per-phase bound
  /// Settings the client sent (proto::kClientSettings): each counts
  /// instead of this process's environment variable of the same name.
  proto::Settings settings;
  /// Called once dir is this checkpoint's alone (made here or found empty,
  /// and claimed against other checkpoints given the same dir): from then on
  /// what is in it is this run's to remove should the run die; made: this
  /// run made dir (then it goes too), not found it empty.
  std::function<void(bool made)> on_claimed;
  /// Called just before CRIU's dump with the path of its log and, where it
  /// locks the job's TCP connections, the lock's method (else empty): what a
  /// recovery needs to lift that lock should this process die once CRIU has
  /// ended (criu_leftovers.h).
  std::function<void(const std::string& log_path, const std::string& network_lock)> on_dump;
  /// Looked at between phases, in the checksums, and at the end of the CRIU
  /// dump: a cancel asked there rolls the job back as a failure does
  /// (out->code kExitFailure, *err naming kCancelledReason); the
  /// token is committed just before the manifest is written. May be null.
  CancelToken* cancel = nullptr;
};

/// Timing of each phase in seconds, in the order they ran.
using PhaseTimes = std::vector<std::pair<std::string, double>>;

struct CheckpointResult {
  std::string dir;
  uint64_t bytes = 0;  ///< total size of the checkpoint directory
  PhaseTimes phases;
  bool job_stopped = false;  ///< true when the job was stopped after the dump
  /// The cut across collective ranks: each process's count of collective
  /// launches when its gate closed (empty when none had launched one).
  std::map<pid_t, uint64_t> collective_cut;
  /// Quiesces made again because a process's stream capture was under way.
  int capture_retries = 0;
  /// Set on failure too: kExitRefused when nothing changed because a
  /// precondition failed, kExitFailure when it failed and rolled back (the job
  /// runs on unchanged), kExitJobLost when the job could not be brought back.
  ExitCode code = kExitOk;
};

/// Checkpoints a running job into opts.dir: checks every precondition first
/// (root, CRIU >= 4.1, driver with the checkpoint API, empty dir, no shared
/// device memory between processes), then driver lock + checkpoint of every
/// CUDA process, CRIU dump of the tree, checksums, manifest written last and
/// atomically (a directory without it never restores). Without leave_running
/// the tree stays stopped after the dump and is killed (SIGKILL, the
/// supervisor reaps) once the manifest is written; with it, GPU state is
/// restored and unlocked right after the dump, so the job runs on while the
/// checksums are computed. Any failure before the job is killed restores and
/// unlocks GPU state and leaves the job running (out->code kExitFailure), or
/// refuses before changing anything (kExitRefused). Progress phases: check,
/// driver-checkpoint, dump (bytes written), driver-restore, checksum (bytes
/// hashed), stop. The caller serialises checkpoints of one job.
bool checkpoint_job(const JobInfo& job, const CheckpointOptions& opts, const ProgressSink& progress,
                    CheckpointResult* out, std::string* err);

struct RestoreOptions {
  std::string dir;
  /// Write ends the restored job's stdout and stderr get (CRIU --inherit-fd).
  int stdout_fd = -1, stderr_fd = -1;
  /// Old device (index or UUID) -> new device; empty = same devices.
  std::map<std::string, std::string> device_map;
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  /// Where the restore's watch says what it did should this process die
  /// mid-restore (restore_watch.h): its stderr, or, for a background
  /// supervisor (--detach), that of the command waiting for it.
  int report_fd = 2;
  /// Looked at while the checkpoint is verified (about every 200 ms of its
  /// checksums, and between the checks) and once more just before CRIU
  /// starts: the number of a signal that asks to stop the restore (SIGINT,
  /// SIGTERM, SIGHUP), or 0. Nothing has been started then; once CRIU runs,
  /// the restore goes on.
  std::function<int()> interrupted;
  /// Called once the checkpoint is verified and every check before CRIU
  /// passed, just before CRIU starts: what the caller sets up for CRIU (the
  /// shims' runtime directory). False, with *err saying why, refuses the
  /// restore (kExitRefused; nothing was started). May be empty.
  std::function<bool(std::string* err)> before_criu;
};

struct RestoreResult {
  pid_t root_pid = 0;  ///< the restored tree's root, now our child (we are subreaper)
  JobInfo job;         ///< the job as recorded in the manifest, root_pid updated
  PhaseTimes phases;
  /// Each GPU of the checkpoint restored onto another (--device-map, or a
  /// GPU not here): its UUID, and the UUID of the GPU it is on now.
  std::vector<std::pair<std::string, std::string>> gpu_moves;
  /// Set on failure too: kExitNotFound, kExitBadCheckpoint, kExitRefused
  /// (nothing was started), kExitFailure (the restored tree was killed).
  ExitCode code = kExitOk;
  /// The signal that stopped the restore before anything was started
  /// (RestoreOptions::interrupted); 0 otherwise.
  int interrupted_by = 0;
  /// The restore's watch (restore_watch.h), on after a restore that
  /// succeeded: should this process die before the job has a guardian, it
  /// ends the restored job. The caller dismisses it once the guardian runs
  /// (or on the way out); none after a failure.
  std::unique_ptr<RestoreWatch> watch;
};

/// Verifies dir (manifest version, every file's size and SHA-256, same GPU
/// model present) without changing anything. Fills *err and returns false
/// when the checkpoint must not be restored.
bool verify_checkpoint(const std::string& dir, std::string* err);
/// The same, with the exit code that fits the failure (kExitNotFound,
/// kExitBadCheckpoint, or kExitRefused when no matching GPU is present) and
/// the device map to check against. *files_intact (when given) says whether
/// every file's size and SHA-256 were checked and right, also when it fails
/// for what is here (no driver, no GPU of the model): a checkpoint copied to
/// a machine without a GPU can still be checked.
bool verify_checkpoint_coded(const std::string& dir,
                             const std::map<std::string, std::string>& device_map, ExitCode* code,
                             std::string* err, bool* files_intact = nullptr);

/// Restores a checkpoint: verify_checkpoint, CRIU restore (the tree becomes
/// a child of the calling process, which must be a child subreaper), driver
/// restore + unlock of every CUDA process. On failure after CRIU restored the
/// tree, the restored processes are killed so no half-restored job runs.
bool restore_job(const RestoreOptions& opts, const ProgressSink& progress, RestoreResult* out,
                 std::string* err);

/// Releases the GPU of every CUDA process of the job in place (driver lock +
/// checkpoint); processes stay. Refuses, changing nothing, as checkpoint does.
bool suspend_job(const JobInfo& job, std::chrono::milliseconds timeout, std::string* err);
/// Brings a suspended job's GPU state back (driver restore + unlock).
bool resume_job(const JobInfo& job, std::chrono::milliseconds timeout, std::string* err);
/// What a suspend reports beyond success.
struct SuspendResult {
  ExitCode code = kExitOk;  ///< on failure: kExitRefused (nothing changed) or worse
  /// Per shim process: the collective launches it made before the cut (empty
  /// for a job that has no collective ranks).
  std::map<pid_t, uint64_t> collective_cut;
  /// Times the quiesce was tried again because a stream capture was under way.
  int capture_retries = 0;
  /// In, not out: looked at after the scan and once the driver has locked
  /// every process (the shared memory saved); committed once each is
  /// checkpointed. A cancel asked before rolls back as a failure does
  /// (code kExitFailure, *err naming kCancelledReason). May be null.
  CancelToken* cancel = nullptr;
};
/// The same, with the exit code that fits a failure (kExitRefused when
/// nothing changed, kExitFailure otherwise) and the cut; settings: what the
/// client sent (settings.h), CUSNAP_ALLOW_RANKS_SHARING_GPU. out may be null.
bool suspend_job_coded(const JobInfo& job, std::chrono::milliseconds timeout,
                       const proto::Settings& settings, SuspendResult* out, std::string* err);
/// True when the job is suspended: left so by a failed roll back, or a
/// process of it has its GPU state locked or checkpointed by the driver.
bool job_suspended_now(const JobInfo& job);
/// Resume with the exit code that fits a failure: kExitRefused when nothing
/// changed (not suspended; the GPU's free memory short of what the job used
/// before, gpu_memory.h), kExitFailure otherwise. settings: what the client
/// sent (CUSNAP_RESTORE_MEMORY_MARGIN). When the driver holds no process of
/// the job suspended (its GPU state came back some other way), nothing is
/// restored: the shared memory the suspend saved is brought back, and it
/// succeeds with a note in *err saying so (the job is running).
bool resume_job_coded(const JobInfo& job, std::chrono::milliseconds timeout,
                      const proto::Settings& settings, ExitCode* code, std::string* err);

/// What kept a recovery from bringing the job back (recover_job).
enum class RecoverBlock {
  kNone,
  /// The driver refused a restore for lack of GPU memory: it never restores
  /// that process again.
  kRestoreRefused,
  /// The shared memory the failed operation saved (and released) is gone.
  kSavedMemoryGone,
  /// The GPUs lack the free memory the restore needs now (the check before
  /// any restore): nothing was restored; a later try may succeed.
  kMemoryShort,
};

/// Whether block keeps every later recovery from succeeding too.
inline bool blocks_for_good(RecoverBlock block) {
  return block == RecoverBlock::kRestoreRefused || block == RecoverBlock::kSavedMemoryGone;
}

/// Brings a job back to running after its supervisor died during an
/// operation whose state directory was state_dir (the checkpoint directory,
/// or the runtime directory's suspended/): driver restore + unlock of every
/// CUDA process from whatever state, SIGCONT, shared memory rebuilt from the
/// saved bytes, gates opened; with remove_partial a state_dir without a
/// manifest is removed once the job is back. A job left suspended by a
/// failed roll back (its runtime directory's marker) is recovered from the
/// state directory the marker names, and the marker goes once it is back; a
/// recovery that fails leaves the job so marked, its saved state in place,
/// for cusnap resume to try again. timeout: each shared-memory step's.
/// *report gets one line per step; *blocked (if set) says what keeps a
/// failed recovery from ever succeeding, when something does. margin:
/// CUSNAP_RESTORE_MEMORY_MARGIN's value for the free-memory check (nullptr:
/// this process's environment). dump: the CRIU dump the operation began (its
/// log and network lock method, as GuardedOperation carries them), whose
/// lock on the job's TCP connections is lifted where no CRIU is left to
/// tell (it ended before the supervisor died).
/// (engine_recover.cpp)
struct RecoverDump {
  std::string log_path, network_lock;
};
bool recover_job(const JobInfo& job, const std::string& state_dir, bool remove_partial,
                 std::string* report, std::chrono::milliseconds timeout = std::chrono::seconds(60),
                 RecoverBlock* blocked = nullptr, const char* margin = nullptr,
                 const RecoverDump& dump = {});

/// One process of the job as the engine sees it (for ps/inspect).
struct ProcessInfo {
  pid_t pid = 0;
  std::string exe;
  std::vector<std::string> cmdline;
  bool uses_cuda = false;  ///< holds the driver open
  std::string cuda_state;  ///< "running", "locked", "checkpointed", "" when not CUDA
};
/// Every process of the tree rooted at root, root first.
std::vector<ProcessInfo> list_job_processes(pid_t root);

/// What a job left suspended by a failed roll back carries (its runtime
/// directory's marker), as JSON text for cusnap inspect: {"operation",
/// "since", "reason", "restore_refused", "saved", "state_dir"}; "" when the
/// job carries no marker. (left_suspended.cpp)
std::string left_suspended_details(const JobInfo& job);
/// Whether the job carries that marker and, if so, whether the driver refused
/// to restore its GPU state (then no cusnap resume brings it back), for
/// cusnap ps. (left_suspended.cpp)
enum class LeftSuspendedState { kNo, kResumable, kRestoreRefused };
LeftSuspendedState left_suspended_state(const JobInfo& job);

}  // namespace cusnap
