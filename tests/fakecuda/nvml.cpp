// The simulated NVML: libnvidia-ml.so.1 beside the simulated libcuda.so.1,
// exporting what src/cudaapi/nvml_api.h declares (and the old nvmlInit).
// Devices come from the same environment as the driver's (device_env.h), so
// UUIDs are the strings of cuDeviceGetUuid's bytes; memory use and the
// processes using a device come from a scan of every process's descriptors
// (ledger.h), system-wide as NVML's are: a driver-checkpointed process holds
// no device memory and is not listed. FAKECUDA_NVML=off makes nvmlInit fail
// NVML_ERROR_DRIVER_NOT_LOADED (a machine without NVML); =hostpids lists
// processes under pids of another namespace (a container's view).
#include "cudaapi/nvml_api.h"
#include "device_env.h"
#include "ledger.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#define NVML_EXPORT extern "C" __attribute__((visibility("default")))

/// A device handle points at one of these (a static table: never NULL).
struct nvmlDevice_st {
  unsigned index = 0;
};

namespace {

struct Nvml {
  std::mutex mu;
  int init_refs = 0;  ///< nvmlInit minus nvmlShutdown
  fc::DeviceEnv env;  ///< read at the first nvmlInit
  std::string uuids[fc::kMaxDevices];
  nvmlDevice_st handles[fc::kMaxDevices];
};

Nvml& nvml() {
  static Nvml* n = new Nvml;  // never destroyed: callers may run at exit
  return *n;
}

/// Device index behind a handle, or -1 when it is not one of ours.
/// Precondition: Nvml::mu held, initialised.
int index_of(nvmlDevice_t device) {
  Nvml& n = nvml();
  for (int i = 0; i < n.env.count; ++i)
    if (device == &n.handles[i]) return i;
  return -1;
}

/// Checks initialisation and the handle; sets *index.
nvmlReturn_t check(nvmlDevice_t device, int* index) {
  Nvml& n = nvml();
  if (n.init_refs == 0) return NVML_ERROR_UNINITIALIZED;
  *index = index_of(device);
  return *index < 0 ? NVML_ERROR_INVALID_ARGUMENT : NVML_SUCCESS;
}

/// FAKECUDA_NVML=hostpids: processes are listed under pids of another pid
/// namespace, pid + kHostPidOffset (above the kernel's largest pid).
constexpr unsigned kHostPidOffset = 1u << 22;
bool host_pids() {
  const char* v = getenv("FAKECUDA_NVML");
  return v && strcmp(v, "hostpids") == 0;
}

nvmlReturn_t init() {
  const char* off = getenv("FAKECUDA_NVML");
  if (off && strcmp(off, "off") == 0) return NVML_ERROR_DRIVER_NOT_LOADED;
  Nvml& n = nvml();
  std::lock_guard<std::mutex> l(n.mu);
  if (n.init_refs++ > 0) return NVML_SUCCESS;
  n.env = fc::read_device_env();
  for (int i = 0; i < n.env.count; ++i) {
    unsigned char u[16];
    fc::device_uuid(i, n.env.seed, u);
    n.uuids[i] = fc::gpu_uuid_string(u);
    n.handles[i].index = static_cast<unsigned>(i);
  }
  return NVML_SUCCESS;
}

}  // namespace

NVML_EXPORT nvmlReturn_t nvmlInit_v2(void) {
  return init();
}

/// The name of NVML before 4.304 (same behaviour).
NVML_EXPORT nvmlReturn_t nvmlInit(void) {
  return init();
}

NVML_EXPORT nvmlReturn_t nvmlShutdown(void) {
  Nvml& n = nvml();
  std::lock_guard<std::mutex> l(n.mu);
  if (n.init_refs == 0) return NVML_ERROR_UNINITIALIZED;
  --n.init_refs;
  return NVML_SUCCESS;
}

NVML_EXPORT const char* nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
    case NVML_SUCCESS:
      return "Success";
    case NVML_ERROR_UNINITIALIZED:
      return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
      return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
      return "Not Supported";
    case NVML_ERROR_NO_PERMISSION:
      return "Insufficient Permissions";
    case 5:
      return "Already Initialized";
    case NVML_ERROR_NOT_FOUND:
      return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE:
      return "Insufficient Size";
    case 8:
      return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED:
      return "Driver Not Loaded";
    case 10:
      return "Timeout";
    case 11:
      return "Interrupted by IRQ";
    case 12:
      return "Library Not Found";
    case 13:
      return "Function Not Found";
    case 14:
      return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST:
      return "GPU is lost";
    default:
      return "Unknown Error";
  }
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* deviceCount) {
  Nvml& n = nvml();
  std::lock_guard<std::mutex> l(n.mu);
  if (n.init_refs == 0) return NVML_ERROR_UNINITIALIZED;
  if (!deviceCount) return NVML_ERROR_INVALID_ARGUMENT;
  *deviceCount = static_cast<unsigned>(n.env.count);
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  Nvml& n = nvml();
  std::lock_guard<std::mutex> l(n.mu);
  if (n.init_refs == 0) return NVML_ERROR_UNINITIALIZED;
  if (!device || index >= static_cast<unsigned>(n.env.count)) return NVML_ERROR_INVALID_ARGUMENT;
  *device = &n.handles[index];
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length) {
  Nvml& n = nvml();
  std::lock_guard<std::mutex> l(n.mu);
  int i = -1;
  if (nvmlReturn_t r = check(device, &i)) return r;
  if (!uuid) return NVML_ERROR_INVALID_ARGUMENT;
  const std::string& s = n.uuids[i];
  if (length < s.size() + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
  memcpy(uuid, s.c_str(), s.size() + 1);
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  Nvml& n = nvml();
  unsigned long long total = 0;
  int i = -1;
  {
    std::lock_guard<std::mutex> l(n.mu);
    if (nvmlReturn_t r = check(device, &i)) return r;
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    total = n.env.total_mem;
  }
  const fc::LedgerScan scan = fc::ledger_scan();  // no lock held: /proc is slow
  const unsigned long long used = scan.device[i];
  memory->total = total;
  memory->used = used;
  memory->free = used >= total ? 0 : total - used;
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                                 unsigned int* infoCount,
                                                                 nvmlProcessInfo_t* infos) {
  Nvml& n = nvml();
  int i = -1;
  {
    std::lock_guard<std::mutex> l(n.mu);
    if (nvmlReturn_t r = check(device, &i)) return r;
    if (!infoCount) return NVML_ERROR_INVALID_ARGUMENT;
  }
  const fc::LedgerScan scan = fc::ledger_scan();
  unsigned found = 0;
  for (const auto& [pid, own] : scan.own)
    if (own.device[i] > 0) ++found;
  if (*infoCount < found) {
    *infoCount = found;
    return NVML_ERROR_INSUFFICIENT_SIZE;
  }
  if (found > 0 && !infos) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned k = 0;
  for (const auto& [pid, own] : scan.own) {  // by pid
    if (own.device[i] == 0) continue;
    nvmlProcessInfo_t& p = infos[k++];
    // FAKECUDA_NVML=hostpids: pids of another pid namespace (beyond any
    // pid here), as NVML reports them to a process in a container.
    p.pid = static_cast<unsigned>(pid) + (host_pids() ? kHostPidOffset : 0u);
    p.usedGpuMemory = own.device[i];
    p.gpuInstanceId = 0;
    p.computeInstanceId = 0;
  }
  *infoCount = found;
  return NVML_SUCCESS;
}
