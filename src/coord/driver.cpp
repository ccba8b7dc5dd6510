#include "coord/driver.h"

#include <dlfcn.h>

#include <strings.h>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "proto/shim_messages.h"
#include "proto/wire.h"

namespace cusnap {

std::string format_gpu_uuid(const CUuuid& u) {
  return proto::format_gpu_uuid(reinterpret_cast<const unsigned char*>(u.bytes));
}

bool parse_gpu_uuid(const std::string& s, CUuuid* out) {
  // "GPU-" in either case, as the hex digits after it, grouped 8-4-4-4-12
  // as nvidia-smi and the driver write them (no dash elsewhere).
  if (s.size() != 4 + 36 || ::strncasecmp(s.c_str(), "GPU-", 4) != 0) return false;
  std::string hex;
  for (size_t i = 4; i < s.size(); ++i) {
    const size_t at = i - 4;
    const bool dash_here = at == 8 || at == 13 || at == 18 || at == 23;
    if (dash_here != (s[i] == '-')) return false;
    if (dash_here) continue;
    if (!std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
    hex.push_back(s[i]);
  }
  if (hex.size() != 32) return false;
  for (int i = 0; i < 16; ++i)
    out->bytes[i] = char(std::strtoul(hex.substr(2 * i, 2).c_str(), nullptr, 16));
  return true;
}

std::string process_state_name(CUprocessState s) {
  switch (s) {
    case CU_PROCESS_STATE_RUNNING:
      return "running";
    case CU_PROCESS_STATE_LOCKED:
      return "locked";
    case CU_PROCESS_STATE_CHECKPOINTED:
      return "checkpointed";
    case CU_PROCESS_STATE_FAILED:
      return "failed";
  }
  return "state " + std::to_string(int(s));
}

Driver::~Driver() {
  // The library stays loaded: the driver does not support being unloaded
  // while it has initialized, and the handle is refcounted anyway.
}

bool Driver::load(std::string* err) {
  if (handle_) return true;
  const char* env = getenv("CUSNAP_LIBCUDA");
  path_ = env && *env ? env : "libcuda.so.1";
  handle_ = dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    const char* e = dlerror();
    *err = "cannot load the CUDA driver " + path_ + ": " + (e ? e : "unknown error") +
           ": install the NVIDIA driver (or put the simulated driver's directory in "
           "LD_LIBRARY_PATH, where the job finds it too), or set CUSNAP_LIBCUDA to the driver "
           "library cusnap loads (the job's programs still find theirs through the loader)";
    return false;
  }
  auto sym = [&](const char* name, const char* alt = nullptr) -> void* {
    void* p = dlsym(handle_, name);
    if (!p && alt) p = dlsym(handle_, alt);
    return p;
  };
  struct Entry {
    const char* name;
    const char* alt;
    void** slot;
    bool checkpoint_api;
  };
  const Entry entries[] = {
      {"cuInit", nullptr, reinterpret_cast<void**>(&cuInit_), false},
      {"cuDriverGetVersion", nullptr, reinterpret_cast<void**>(&cuDriverGetVersion_), false},
      {"cuDeviceGetCount", nullptr, reinterpret_cast<void**>(&cuDeviceGetCount_), false},
      {"cuDeviceGet", nullptr, reinterpret_cast<void**>(&cuDeviceGet_), false},
      {"cuDeviceGetName", nullptr, reinterpret_cast<void**>(&cuDeviceGetName_), false},
      {"cuDeviceGetUuid_v2", "cuDeviceGetUuid", reinterpret_cast<void**>(&cuDeviceGetUuid_), false},
      {"cuDeviceTotalMem_v2", "cuDeviceTotalMem", reinterpret_cast<void**>(&cuDeviceTotalMem_),
       false},
      {"cuCheckpointProcessLock", nullptr, reinterpret_cast<void**>(&cuCheckpointProcessLock_),
       true},
      {"cuCheckpointProcessCheckpoint", nullptr,
       reinterpret_cast<void**>(&cuCheckpointProcessCheckpoint_), true},
      {"cuCheckpointProcessRestore", nullptr,
       reinterpret_cast<void**>(&cuCheckpointProcessRestore_), true},
      {"cuCheckpointProcessUnlock", nullptr, reinterpret_cast<void**>(&cuCheckpointProcessUnlock_),
       true},
      {"cuCheckpointProcessGetState", nullptr,
       reinterpret_cast<void**>(&cuCheckpointProcessGetState_), true},
  };
  for (const Entry& e : entries) {
    *e.slot = sym(e.name, e.alt);
    if (*e.slot) continue;
    if (e.checkpoint_api)
      *err = "the CUDA driver at " + path_ +
             " has no process checkpoint API (cuCheckpointProcessLock): driver >= 570 is needed";
    else
      *err = "the CUDA driver at " + path_ + " lacks " + e.name + ": it is not a CUDA driver";
    dlclose(handle_);
    handle_ = nullptr;
    return false;
  }
  cuGetErrorName_ = reinterpret_cast<decltype(cuGetErrorName_)>(sym("cuGetErrorName"));
  // The checkpoint calls act on other processes, but a driver may still want
  // this one initialized; a failure here (no device) shows up in devices().
  initialized_ = cuInit_(0) == CUDA_SUCCESS;
  return true;
}

std::string Driver::error_name(CUresult r) const {
  const char* name = nullptr;
  if (cuGetErrorName_ && cuGetErrorName_(r, &name) == CUDA_SUCCESS && name)
    return std::string(name) + " (" + std::to_string(int(r)) + ")";
  return "CUDA error " + std::to_string(int(r));
}

bool Driver::call_failed(CUresult r, const char* call, pid_t pid, std::string* err) const {
  last_ = r;
  if (r == CUDA_SUCCESS) return false;
  *err = std::string(call) + (pid > 0 ? " of process " + std::to_string(pid) : std::string()) +
         " failed: " + error_name(r);
  return true;
}

bool Driver::version(int* v, std::string* err) {
  return !call_failed(cuDriverGetVersion_(v), "cuDriverGetVersion", 0, err);
}

bool Driver::devices(std::vector<GpuDevice>* out, std::string* err) {
  out->clear();
  if (!initialized_) {
    if (call_failed(cuInit_(0), "cuInit", 0, err)) return false;
    initialized_ = true;
  }
  int n = 0;
  if (call_failed(cuDeviceGetCount_(&n), "cuDeviceGetCount", 0, err)) return false;
  for (int i = 0; i < n; ++i) {
    CUdevice dev;
    GpuDevice g;
    g.index = i;
    char name[256] = {};
    CUuuid uuid{};
    size_t mem = 0;
    if (call_failed(cuDeviceGet_(&dev, i), "cuDeviceGet", 0, err) ||
        call_failed(cuDeviceGetName_(name, sizeof name - 1, dev), "cuDeviceGetName", 0, err) ||
        call_failed(cuDeviceGetUuid_(&uuid, dev), "cuDeviceGetUuid", 0, err) ||
        call_failed(cuDeviceTotalMem_(&mem, dev), "cuDeviceTotalMem", 0, err))
      return false;
    g.name = name;
    g.uuid = format_gpu_uuid(uuid);
    g.total_mem = mem;
    out->push_back(g);
  }
  return true;
}

bool Driver::get_state(pid_t pid, CUprocessState* state, std::string* err) {
  // Bounded as the others are: a roll back asks the state of a process
  // whose checkpoint call did not return, and the answer may wait on it. An
  // abandoned call writes into memory of its own.
  auto fn = cuCheckpointProcessGetState_;
  // Before an operation set its deadline (its first look at the job, or
  // ps and inspect listing a job's processes), the control timeout bounds it.
  auto out = std::make_shared<CUprocessState>(CU_PROCESS_STATE_FAILED);
  const std::chrono::milliseconds bound =
      quick_deadline_.count() > 0 ? quick_deadline_
                                  : proto::control_timeout_from_env(proto::kDefaultTimeout);
  if (!bounded_call([fn, pid, out] { return fn(pid, out.get()); }, "cuCheckpointProcessGetState",
                    pid, err, bound))
    return false;
  *state = *out;
  return true;
}

bool Driver::lock(pid_t pid, std::chrono::milliseconds timeout, std::string* err) {
  auto fn = cuCheckpointProcessLock_;
  unsigned ms = unsigned(std::max<int64_t>(1, timeout.count()));
  const bool ok = bounded_call(
      [fn, pid, ms] {
        CUcheckpointLockArgs args{};
        args.timeoutMs = ms;
        return fn(pid, &args);
      },
      "cuCheckpointProcessLock", pid, err, quick_deadline_);
  // Measured on an H200 (docs/gpu-runs/state-and-lock-h200.log): a lock
  // waits for the process's device work and driver calls, and answers
  // NOT_READY when they outlast its timeout, the process left running.
  if (!ok && last_ == CUDA_ERROR_NOT_READY)
    *err += " (its device work or a driver call did not finish within " + std::to_string(ms) +
            " ms; the process runs on: try again, or with a longer --timeout)";
  return ok;
}

bool Driver::checkpoint(pid_t pid, std::string* err) {
  auto fn = cuCheckpointProcessCheckpoint_;
  return bounded_call(
      [fn, pid] {
        CUcheckpointCheckpointArgs args{};
        return fn(pid, &args);
      },
      "cuCheckpointProcessCheckpoint", pid, err);
}

bool Driver::restore(pid_t pid, const std::vector<CUcheckpointGpuPair>& pairs, std::string* err) {
  auto fn = cuCheckpointProcessRestore_;
  const bool ok = bounded_call(
      [fn, pid, pairs] {
        CUcheckpointRestoreArgs args{};
        if (pairs.empty()) return fn(pid, nullptr);
        args.gpuPairs = const_cast<CUcheckpointGpuPair*>(pairs.data());
        args.gpuPairsCount = unsigned(pairs.size());
        return fn(pid, &args);
      },
      "cuCheckpointProcessRestore", pid, err);
  if (ok) return true;
  // Measured on an H200 (driver 580.159.04, docs/gpu-runs/restore-full-h200.log):
  // a restore that finds the GPU's memory taken fails OUT_OF_MEMORY and the
  // process stays checkpointed for good; every later restore of it fails
  // OPERATING_SYSTEM, however much memory is free then.
  if (last_ == CUDA_ERROR_OUT_OF_MEMORY) {
    restore_refused_ = true;
    *err +=
        " (the GPU lacks the free memory to restore it: other processes took it while this "
        "one's was out; the driver will not restore this process after this failure)";
  } else if (last_ == CUDA_ERROR_OPERATING_SYSTEM) {
    restore_refused_ = true;
    *err +=
        " (as the driver answers, measured, once a restore of the process failed for lack "
        "of GPU memory: it will not restore it again)";
  }
  return false;
}

bool Driver::unlock(pid_t pid, std::string* err) {
  auto fn = cuCheckpointProcessUnlock_;
  return bounded_call(
      [fn, pid] {
        CUcheckpointUnlockArgs args{};
        return fn(pid, &args);
      },
      "cuCheckpointProcessUnlock", pid, err, quick_deadline_);
}

bool Driver::bounded_call(std::function<CUresult()> fn, const char* call, pid_t pid,
                          std::string* err, std::chrono::milliseconds bound) {
  const std::chrono::milliseconds deadline = bound.count() > 0 ? bound : deadline_;
  if (deadline.count() <= 0) return !call_failed(fn(), call, pid, err);
  // The call runs on a helper thread so that a driver call that never
  // returns (GPU.md: a checkpoint with a collective in flight) cannot hold
  // the coordinator forever. A stuck call cannot be cancelled: its thread is
  // left behind, owning only what the lambda copied.
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    CUresult r = CUDA_SUCCESS;
  };
  auto sh = std::make_shared<Shared>();
  std::thread([sh, fn = std::move(fn)] {
    CUresult r = fn();
    std::lock_guard<std::mutex> l(sh->mu);
    sh->r = r;
    sh->done = true;
    sh->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> l(sh->mu);
  if (!sh->cv.wait_for(l, deadline, [&] { return sh->done; })) {
    last_ = CUDA_ERROR_TIMEOUT;
    *err = std::string(call) + " of process " + std::to_string(pid) + " did not return within " +
           (deadline.count() >= 1000 ? std::to_string(deadline.count() / 1000) + " s"
                                     : std::to_string(deadline.count()) + " ms") +
           ": the driver may be stuck (a job with device work waiting on another process "
           "cannot be checkpointed by the driver alone); the process's GPU state is unknown";
    return false;
  }
  return !call_failed(sh->r, call, pid, err);
}

}  // namespace cusnap
