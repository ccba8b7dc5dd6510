// The CUDA driver as the coordinator uses it: dlopen'ed ("libcuda.so.1", or
// $CUSNAP_LIBCUDA), never linked, so the real or the simulated driver is
// chosen at run time. A typed table of the functions used; a missing
// checkpoint entry point makes load fail (driver < 570).
//
// The checkpoint calls act on another process (by pid): states are
// 0 running, 1 locked, 2 checkpointed; a call in the wrong state returns
// CUDA_ERROR_ILLEGAL_STATE (401).
#pragma once

#include <cuda.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "coord/gpu_memory.h"

namespace cusnap {

struct GpuDevice {
  int index = 0;
  std::string name;
  std::string uuid;  ///< "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  uint64_t total_mem = 0;
};

/// What a restore through a Driver must find free (gpu_memory.h): each
/// process's use noted before its suspend, and the check's setting.
/// driver_resume_all checks before it restores; fell_short says a check
/// kept it from restoring (the processes are as they were).
struct RestoreMemory {
  ProcessGpuUse use;
  RestoreMemoryPolicy policy;
  bool fell_short = false;
  std::string note;  ///< why nothing could be checked, when so
  /// Each GPU's free memory before the suspend: the margin's cap
  /// (restore_memory_fits).
  GpuUse free_before;
  /// Processes NVML gave no count for (it cannot see their pids, e.g. from
  /// another pid namespace): the rise of the free memory at the driver
  /// checkpoint, less the counted processes' use, stands for them
  /// (complete_gpu_use).
  std::vector<pid_t> uncounted;
};

/// "GPU-..." form of a driver UUID, and back.
std::string format_gpu_uuid(const CUuuid& u);
bool parse_gpu_uuid(const std::string& s, CUuuid* out);

class Driver {
 public:
  Driver() = default;
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;
  ~Driver();

  /// Loads the driver and resolves every function; fails with a message
  /// naming the library when it is missing or lacks the checkpoint API.
  bool load(std::string* err);
  const std::string& path() const { return path_; }

  /// cuDriverGetVersion (e.g. 13000).
  bool version(int* v, std::string* err);
  /// Every device the driver shows (cuInit first).
  bool devices(std::vector<GpuDevice>* out, std::string* err);

  /// The process checkpoint API for process pid. Errors name the call, the
  /// process and the driver's error.
  bool get_state(pid_t pid, CUprocessState* state, std::string* err);
  bool lock(pid_t pid, std::chrono::milliseconds timeout, std::string* err);
  bool checkpoint(pid_t pid, std::string* err);
  bool restore(pid_t pid, const std::vector<CUcheckpointGpuPair>& pairs, std::string* err);
  bool unlock(pid_t pid, std::string* err);

  /// Bounds every checkpoint and restore call, which move the process's
  /// device memory, by d, and every lock, unlock and state call, which move
  /// none, by quick (0: d too): past it the call is reported as stuck (0 =
  /// wait as long as the driver takes).
  void set_call_deadline(std::chrono::milliseconds d,
                         std::chrono::milliseconds quick = std::chrono::milliseconds(0)) {
    deadline_ = d;
    quick_deadline_ = quick.count() > 0 ? quick : d;
  }

  /// "CUDA_ERROR_X (n)" for a result code.
  std::string error_name(CUresult r) const;
  /// Result of the last driver call made through this object.
  CUresult last_result() const { return last_; }
  /// A restore through this object failed for lack of GPU memory (or after
  /// such a failure), or a process's state was failed: the driver will not
  /// restore that process again.
  bool restore_refused() const { return restore_refused_; }
  /// A process's GPU state was found failed ("an uncorrectable error during
  /// the checkpoint/restore process", cuda.h): as a refused restore, the
  /// driver brings it back no more.
  void note_state_failed() { restore_refused_ = true; }
  /// The free-memory check of restores through this object.
  RestoreMemory& restore_memory() { return restore_memory_; }

 private:
  bool call_failed(CUresult r, const char* call, pid_t pid, std::string* err) const;
  /// bound: the limit of this call (0: the call deadline).
  bool bounded_call(std::function<CUresult()> fn, const char* call, pid_t pid, std::string* err,
                    std::chrono::milliseconds bound = std::chrono::milliseconds(0));

  void* handle_ = nullptr;
  std::string path_;
  bool initialized_ = false;
  mutable CUresult last_ = CUDA_SUCCESS;
  bool restore_refused_ = false;
  RestoreMemory restore_memory_;
  std::chrono::milliseconds deadline_{0};
  std::chrono::milliseconds quick_deadline_{0};

  CUresult (*cuInit_)(unsigned int) = nullptr;
  CUresult (*cuDriverGetVersion_)(int*) = nullptr;
  CUresult (*cuDeviceGetCount_)(int*) = nullptr;
  CUresult (*cuDeviceGet_)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetName_)(char*, int, CUdevice) = nullptr;
  CUresult (*cuDeviceGetUuid_)(CUuuid*, CUdevice) = nullptr;
  CUresult (*cuDeviceTotalMem_)(size_t*, CUdevice) = nullptr;
  CUresult (*cuGetErrorName_)(CUresult, const char**) = nullptr;  ///< optional
  CUresult (*cuCheckpointProcessGetState_)(int, CUprocessState*) = nullptr;
  CUresult (*cuCheckpointProcessLock_)(int, CUcheckpointLockArgs*) = nullptr;
  CUresult (*cuCheckpointProcessCheckpoint_)(int, CUcheckpointCheckpointArgs*) = nullptr;
  CUresult (*cuCheckpointProcessRestore_)(int, CUcheckpointRestoreArgs*) = nullptr;
  CUresult (*cuCheckpointProcessUnlock_)(int, CUcheckpointUnlockArgs*) = nullptr;
};

/// "running", "locked", "checkpointed", "failed" or "state N".
std::string process_state_name(CUprocessState s);

}  // namespace cusnap
