// Pieces shared by the engine's operations (engine_*.cpp); not for callers.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "coord/criu.h"
#include "coord/driver.h"
#include "coord/engine.h"
#include "coord/manifest.h"
#include "coord/process_kill.h"
#include "coord/shared_memory.h"
#include "proto/unique_fd.h"

namespace cusnap::engine_detail {

/// Seconds since a start point, for PhaseTimes.
class Stopwatch {
 public:
  Stopwatch() : t0_(std::chrono::steady_clock::now()) {}
  double lap() {
    auto now = std::chrono::steady_clock::now();
    double s = std::chrono::duration<double>(now - t0_).count();
    t0_ = now;
    return s;
  }

 private:
  std::chrono::steady_clock::time_point t0_;
};

/// The job as found, after every precondition passed.
struct JobScan {
  std::vector<ProcessInfo> procs;  ///< the tree, root first
  std::vector<pid_t> cuda;         ///< processes the driver knows, in tree order
  /// GPUs each CUDA process has open, read before the driver checkpoint
  /// closes the device files (empty where /proc does not tell).
  std::map<pid_t, std::vector<std::string>> gpu_uuids;
  std::vector<GpuDevice> gpus;  ///< when there are CUDA processes
  int driver_version = 0;
};

/// What to do when an operation is refused for want of root: the one that
/// runs it as root. Checkpoint, suspend and resume run in the job's
/// supervisor; a restore runs in the restoring command.
inline constexpr const char* kRootForSupervisor =
    "run the job's cusnap supervisor as root (sudo cusnap launch ...)";
inline constexpr const char* kRootForRestore = "run the restore as root (sudo cusnap restore ...)";

/// The root check of operation `what`; the message ends with remedy.
bool require_root(const char* what, const char* remedy, std::string* err);

/// When this process has few descriptors left, why the driver, which opens
/// its device files at cuInit, may have failed: measured on an H200 (driver
/// 580.159.04), a supervisor 12 descriptors short of its limit gets
/// CUDA_ERROR_NO_DEVICE from cuInit. Empty otherwise.
std::string descriptor_shortage();

/// Scans the job and checks what every operation needs: the job is running,
/// the driver has the checkpoint API (when a process uses CUDA), every CUDA
/// process is in `want` state. Shared device memory is shared_prepare's
/// business. Changes nothing.
bool scan_job(const JobInfo& job, Driver* driver, CUprocessState want, const char* operation,
              JobScan* out, std::string* err);

/// Once the driver locked (and again once it checkpointed) scan.cuda: true
/// when the job has no CUDA process outside scan.cuda. A process that began
/// to use the GPU after the scan (a worker started while the gates waited
/// for a capture) would have its GPU state neither saved nor released, so
/// the caller rolls back; *err names the process and says to retry.
bool no_new_cuda_processes(const JobInfo& job, Driver& driver, const JobScan& scan,
                           const char* operation, std::string* err);
/// driver_suspend_all's when_locked for checkpoint and suspend:
/// no_new_cuda_processes, and for a job that shared no device memory at the
/// first look (sm not active), that none of its shims began to share since
/// (SharedMemory::unshared_since_inspect). False: *err says why and to retry.
bool job_unchanged_since_scan(const JobInfo& job, Driver& driver, const JobScan& scan,
                              SharedMemory* sm, const char* operation, std::string* err);

/// The shared-memory phases before the driver checkpoint, for checkpoint and
/// suspend (engine_shared.cpp): inspects the shims of scan.cuda; when memory
/// is shared through them, closes the gates and drains, saves the shared
/// bytes and records into state_dir and releases the shared memory. When it
/// is not, refuses a job whose processes still share device memory. On
/// failure *code is kExitRefused (nothing changed), kExitFailure (rolled
/// back: memory rebuilt, gates open) or kExitJobLost. settings: what the
/// client sent (settings.h).
bool shared_prepare(const JobInfo& job, const JobScan& scan, std::chrono::milliseconds timeout,
                    const proto::Settings& settings, const char* operation,
                    const std::string& state_dir, const ProgressSink& progress, SharedMemory* sm,
                    ExitCode* code, std::string* err);
/// After the driver restored the job's GPU state in place (a roll back,
/// --leave-running, resume): rebuilds shared memory from state_dir, verifies
/// it and opens the gates; tries twice. A no-op when !sm->active().
bool shared_rebuild_in_place(const JobInfo& job, SharedMemory* sm, const std::string& state_dir,
                             std::chrono::milliseconds timeout, const ProgressSink& progress,
                             std::string* err);
/// Rebuilds in place whatever shared memory an operation saved in state_dir
/// (shim/<pid>.records there; nothing saved: true). *pids gets the
/// processes whose records were found.
bool shared_rebuild_saved(const JobInfo& job, const std::string& state_dir,
                          std::chrono::milliseconds timeout, std::vector<pid_t>* pids,
                          std::string* err);
/// Where the job's shims bind their sockets.
std::string shim_dir_of(const JobInfo& job);
SharedTimeouts shared_timeouts(std::chrono::milliseconds phase);

/// Locks every process, then checkpoints every process (a consistent cut).
/// when_locked (if set) runs once all are locked, before any checkpoint (no
/// process can call the driver then), when_checkpointed once all are
/// checkpointed; false with a reason from either brings them all back.
/// On a failure it brings back, in reverse, those already done and returns
/// false with an error naming the process and the call; *rolled_back says
/// whether everything came back (else the job's GPU state is lost).
bool driver_suspend_all(Driver& d, const std::vector<pid_t>& pids,
                        std::chrono::milliseconds timeout, bool* rolled_back, std::string* err,
                        const std::function<bool(std::string*)>& when_locked = {},
                        const std::function<bool(std::string*)>& when_checkpointed = {});

/// For a restore onto other GPUs, each process's GPUs, in the order to try
/// them: the driver takes only pairs of GPUs the process has and refuses
/// others, INVALID_VALUE, the process left checkpointed (measured:
/// docs/gpu-runs/restore-pairs-h200.log); which GPUs it counts as the
/// process's (those it sees, or those it used) is not known from one GPU.
/// Per process: the GPUs the manifest says it has, then those it held memory
/// on, each only when it differs from the ones before.
using GpuChoices = std::map<pid_t, std::vector<std::vector<std::string>>>;
GpuChoices gpu_choices(const Manifest& m);

/// The pairs of `pairs` whose old GPU is one of `gpus`.
std::vector<CUcheckpointGpuPair> pairs_of(const std::vector<CUcheckpointGpuPair>& pairs,
                                          const std::vector<std::string>& gpus);

/// Restores (with pairs) and unlocks every process in reverse order, each
/// from whatever state it is in (checkpointed -> restore + unlock, locked ->
/// unlock, running -> nothing). Goes on past failures; *err lists them all.
/// With choices, a process is given the pairs of its GPUs (gpu_choices), one
/// choice after another while the driver refuses them INVALID_VALUE, and
/// last every pair.
bool driver_resume_all(Driver& d, const std::vector<pid_t>& pids,
                       const std::vector<CUcheckpointGpuPair>& pairs, std::string* err,
                       const GpuChoices& choices = {});

/// driver_resume_all for a roll back: up to three passes, 100 ms and then
/// 500 ms apart, each taking every process on from the state the last left
/// it in, so that a transient driver failure does not leave the job without
/// its GPU. *err: each pass's failures.
bool driver_bring_back(Driver& d, const std::vector<pid_t>& pids, std::string* err);

/// pids less those that map the driver but never initialised it (its state
/// query fails CUDA_ERROR_NOT_INITIALIZED, as for a child forked after its
/// parent started CUDA): they have no GPU state to save or bring back. A
/// query that fails otherwise keeps the process (its caller says the error).
std::vector<pid_t> initialized_only(Driver& d, const std::vector<pid_t>& pids);

/// What became of the job after a roll back that succeeded: "the job runs on
/// unchanged", or which of pids (or the job's root) ended meanwhile.
std::string after_roll_back(const JobInfo& job, const std::vector<pid_t>& pids);

/// A job whose roll back failed is left suspended (left_suspended.cpp): its
/// processes wait at the driver's and the shims' gates with their GPU state
/// kept, and what the operation saved of its shared memory stays in
/// state_dir. A marker in the runtime directory notes it; cusnap resume then
/// brings the job back (recover_job), and checkpoint and suspend refuse.
inline constexpr const char* kLeftSuspendedFile = "left-suspended";
struct LeftSuspended {
  std::string operation;  ///< what failed: checkpoint, suspend, recovery
  std::string since;      ///< when (UTC, ISO 8601)
  std::string reason;     ///< the failure that left it suspended
  std::string state_dir;  ///< where the saved shared memory is
  bool remove_dir = false;  ///< state_dir was made by the operation: removed once empty
  bool saved = false;       ///< shared memory was saved there (and released)
  bool restore_refused = false;  ///< the driver refused a restore: cusnap resume cannot help
};
/// Writes the marker (state_dir is kept only when it holds saved shim
/// records; why: the failure, kept for cusnap inspect) and returns the
/// sentence for the error: what is kept, where, and that cusnap resume brings
/// the job back, or, when the driver refused a restore for lack of GPU memory
/// (Driver::restore_refused), that it cannot.
std::string leave_suspended(const JobInfo& job, const std::string& state_dir, bool remove_dir,
                            const char* operation, const std::string& why,
                            bool restore_refused = false);
/// ": stop it (SIGTERM to its supervisor ...) and restore an earlier
/// checkpoint of JOB": the end of an error for a job that cannot come back
/// (called in its supervisor).
std::string cannot_come_back(const JobInfo& job);
/// True when the job carries the marker, or when this process left it
/// suspended and could not write the marker (a full disk): then kept in
/// memory, so that the supervisor's cusnap resume still finds it.
bool read_left_suspended(const JobInfo& job, LeftSuspended* out);
/// The driver refused to restore the job's GPU state (after which it never
/// does): the marker says so from now on, the rest of it unchanged.
void note_restore_refused(const JobInfo& job);
/// After the job came back: removes the saved shared memory, the state
/// directory when the operation made it and it is empty, and the marker.
void clear_left_suspended(const JobInfo& job, const LeftSuspended& left);
/// False, saying to run cusnap resume first, when the job carries the marker.
bool refuse_when_left_suspended(const JobInfo& job, const char* operation, std::string* err);
/// Where a suspend keeps the job's shared memory: private to the supervisor.
std::string suspend_state_dir(const JobInfo& job);

/// The time now, UTC, as ISO 8601 ("2026-12-02T09:15:12Z").
std::string utc_now();

/// How long CRIU due to end may go on while a kill would end a process of
/// the job: CUSNAP_CRIU_KILL_GRACE_MS (proto::kCriuKillGraceMs); its default
/// for a bad value, which launch and restore refuse.
std::chrono::milliseconds criu_kill_grace();

/// How old a temporary directory of a process that is gone must be for
/// sweep_stale_temp_dirs to take it (one of a process in another pid
/// namespace, which kill cannot see, is left while it may be in use).
inline constexpr std::chrono::seconds kStaleTempAge{600};

/// In a temporary directory a failure kept for its files (TempDir::keep).
inline constexpr const char* kTempKeptMarker = ".cusnap-kept";

/// Removes base's temporary directories of checkpoints and restores
/// (TempDir's, named PREFIX PID "-" XXXXXX) whose maker is gone and that were
/// last changed at least min_age ago: a process killed outright leaves its
/// directory behind. Only directories of this user, and none kept for its
/// files (kTempKeptMarker). Returns how many.
size_t sweep_stale_temp_dirs(const std::string& base, std::chrono::seconds min_age);

/// A private empty directory under $TMPDIR (or /tmp), named PREFIX PID
/// "-" XXXXXX; removed by the destructor. The first one a process makes
/// sweeps stale ones (sweep_stale_temp_dirs).
class TempDir {
 public:
  explicit TempDir(const char* prefix);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  bool ok() const { return !path_.empty(); }
  /// Not removed by the destructor, nor swept later: a message names it
  /// for the files it keeps (a marker file, kTempKeptMarker, says so).
  void keep();
  /// Why it could not be made, naming the directory and whether TMPDIR chose it.
  const std::string& failure() const { return failure_; }
  int error_number() const { return errno_; }

 private:
  std::string path_;
  std::string failure_;
  int errno_ = 0;
  bool keep_ = false;
};

/// Whether CRIU's work directory and its empty plugin directory were made
/// and the first takes a write (CRIU's log and work files go there: its
/// errors would be lost with them); false with *err naming the directory
/// and what to do. In a supervisor (a checkpoint) TMPDIR is the one the job
/// was launched or restored with, not the client's.
bool criu_temp_dirs_usable(const TempDir& work, const TempDir& no_plugins, bool in_supervisor,
                           std::string* err);

/// Decides which device each GPU the checkpoint used is restored onto: the
/// one named by device_map (key: old index or UUID; value: new index or
/// UUID), else the same UUID, else an unclaimed device of the same model.
/// *pairs stays empty when every device maps to itself, else it pairs every
/// used device. Fails, naming the GPU and model, when none fits; then
/// *gpus_here (when given) says whether the GPUs present are why (a map's NEW
/// not here, no free GPU of a model), not the map or the checkpoint, and
/// *new_side (when given) whether the map's NEW sent a GPU where it cannot
/// go (another model, a GPU taken): where NEW is an index, the numbering of
/// this command's GPUs may be why.
bool plan_device_pairs(const std::vector<GpuDevice>& recorded, const std::vector<std::string>& used,
                       const std::vector<GpuDevice>& present,
                       const std::map<std::string, std::string>& device_map,
                       std::vector<CUcheckpointGpuPair>* pairs, std::string* err,
                       bool* gpus_here = nullptr, bool* new_side = nullptr);

/// How long one driver checkpoint call may take before it counts as stuck:
/// the phase timeout plus the devices' memory at 0.5 GB/s (measured: about
/// 1.5 GB/s), so a large job is never cut short while a hang still ends.
std::chrono::milliseconds driver_deadline(std::chrono::milliseconds base,
                                          const std::vector<GpuDevice>& gpus);
/// Bounds d's calls for an operation whose timeout is base: checkpoint and
/// restore by driver_deadline; lock, unlock and the state, which move no
/// memory, by base plus the control timeout (a lock's own timeout is base),
/// so that a roll back's state calls after a stuck checkpoint do not each
/// wait the time the machine's memory would take to copy.
void set_driver_deadlines(Driver& d, std::chrono::milliseconds base,
                          const std::vector<GpuDevice>& gpus);

/// The free-memory check of the driver's restore (engine_memory.cpp,
/// gpu_memory.h). note_gpu_use: before checkpoint or suspend touch the job,
/// reads the setting `margin` (CUSNAP_RESTORE_MEMORY_MARGIN; false with *err
/// when invalid) and notes what each process of `cuda` uses on each GPU now,
/// into driver->restore_memory() and the job's runtime directory for a
/// later resume. load_gpu_use: the same from that record, for a resume.
bool note_gpu_use(const JobInfo& job, const std::vector<pid_t>& cuda, const char* margin,
                  Driver* driver, std::string* err);
bool load_gpu_use(const JobInfo& job, const char* margin, Driver* driver, std::string* err);
/// Once every process is driver-checkpointed: for processes NVML gave no
/// count for, the rise of each GPU's free memory since note_gpu_use, less
/// the counted processes' use, noted as theirs (a stand-in that other
/// processes' allocations meanwhile make rough).
void complete_gpu_use(const JobInfo& job, Driver* driver);
/// The device map of a restore's pairs: old GPU UUID -> new.
std::map<std::string, std::string> pair_uuid_map(const std::vector<CUcheckpointGpuPair>& pairs);
/// Each process's use as the checkpoint recorded it (processes without one
/// are left out).
ProcessGpuUse manifest_gpu_use(const Manifest& m);

/// Total size of every file under dir.
uint64_t directory_bytes(const std::string& dir);

}  // namespace cusnap::engine_detail
