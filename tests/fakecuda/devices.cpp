// cuInit, versions, error strings and device queries.
#include "gate.h"
#include "state.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

using namespace fc;

namespace {

void load_devices(Driver& d) {
  const DeviceEnv env = read_device_env();
  // Ordinal i is the machine's device `machine` (CUDA_VISIBLE_DEVICES).
  const std::vector<int> visible = visible_devices(env.count, env.seed);
  for (int i = 0; i < static_cast<int>(visible.size()); ++i) {
    const int machine = visible[static_cast<size_t>(i)];
    Device dev;
    dev.name = env.name;
    unsigned char u[16];
    device_uuid(machine, env.seed, u);
    memcpy(dev.uuid.bytes, u, sizeof u);
    dev.total_mem = env.total_mem;
    dev.ledger_index = machine;
    d.devices.push_back(dev);
    auto* p = new Context;
    p->dev = i;
    p->primary = true;
    p->id = d.next_ctx_id++;
    d.primary.push_back(p);
    d.contexts.insert(p);
  }
  const char* mc = getenv("FAKECUDA_MULTICAST");
  d.multicast = mc && strcmp(mc, "1") == 0;
}

int attribute_value(CUdevice_attribute a, CUdevice dev, bool multicast) {
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z:
      return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X:
      return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
      return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z:
      return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
      return 49152;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY:
      return 65536;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
      return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK:
      return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE:
      return 1980000;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      return 132;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
      return 1;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
      return 1;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
      return 0x18 + dev;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
      return 0;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
      return 0;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE:
      return 2619000;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH:
      return 5120;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE:
      return 52428800;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
      return 2048;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
      return 3;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
      return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      return 9;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR:
      return 233472;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR:
      return 65536;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
      return 232448;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR:
      return 32;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED:
      return multicast ? 1 : 0;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
      return 1;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED:  // as an H100 reports
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED:  // as an H200 reports
    case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED:
      return 1;
    default:
      return 0;
  }
}

/// The descriptors the real driver's first cuInit needs below the soft
/// RLIMIT_NOFILE, and holds from then on: an eventfd, two pipes,
/// /dev/nvidiactl, /dev/nvidia-uvm twice, /dev/nvidia0 four times and a
/// socket (measured with one GPU, H100, driver 580.159.04; README.md,
/// "cuInit and descriptors").
constexpr int kInitDescriptors = 13;

/// How many descriptors, up to kInitDescriptors, this process can open now:
/// it opens them (an eventfd and duplicates of it) and closes them again.
int descriptors_available() {
  int fds[kInitDescriptors];
  fds[0] = eventfd(0, EFD_CLOEXEC);
  if (fds[0] < 0) return 0;
  int n = 1;
  for (; n < kInitDescriptors; ++n)
    if ((fds[n] = fcntl(fds[0], F_DUPFD_CLOEXEC, 0)) < 0) break;
  for (int i = 0; i < n; ++i) close(fds[i]);
  return n;
}

/// The real driver's first cuInit with `available` descriptors left, as
/// measured: 0-5 OPERATING_SYSTEM, for good in the process; 6-7 UNKNOWN;
/// 8-12 NO_DEVICE. The last two fail only this call.
CUresult init_with_descriptors(int available) {
  if (available >= kInitDescriptors) return CUDA_SUCCESS;
  if (available >= 8) return CUDA_ERROR_NO_DEVICE;
  if (available >= 6) return CUDA_ERROR_UNKNOWN;
  return CUDA_ERROR_OPERATING_SYSTEM;
}

/// Device lookup shared by the queries below; caller holds no lock.
CUresult check_device(CUdevice dev) {
  if (!driver().initialized) return CUDA_ERROR_NOT_INITIALIZED;
  return valid_device(dev) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

}  // namespace

FC_EXPORT CUresult cuInit(unsigned int Flags) {
  FC_ENTER("cuInit");
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  // A child forked after its parent's cuInit cannot initialise (measured:
  // CUDA_ERROR_NOT_INITIALIZED; device queries fail alike, the checkpoint
  // API on other processes works). FAKECUDA_FORK_REINIT=1 lets it, for tests
  // that fork their processes from an initialised one for convenience.
  if (d.forked_after_init) {
    const char* reinit = getenv("FAKECUDA_FORK_REINIT");
    if (!reinit || std::strcmp(reinit, "1") != 0) return CUDA_ERROR_NOT_INITIALIZED;
  }
  // The first cuInit needs descriptors below the soft RLIMIT_NOFILE, as the
  // real driver's, which opens its device files (kInitDescriptors); once
  // initialised it needs none. None is kept open here.
  if (!d.initialized) {
    if (d.init_failed_for_good) return CUDA_ERROR_OPERATING_SYSTEM;
    const CUresult r = init_with_descriptors(descriptors_available());
    if (r == CUDA_ERROR_OPERATING_SYSTEM) d.init_failed_for_good = true;
    if (r != CUDA_SUCCESS) return r;
  }
  {
    std::lock_guard<std::mutex> l(d.mu);
    if (d.devices.empty()) load_devices(d);  // once per process (and per forked child)
    if (d.devices.empty()) return CUDA_ERROR_NO_DEVICE;
  }
  CUresult r = start_control_server();
  if (r != CUDA_SUCCESS) return r;
  d.initialized = true;
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuDriverGetVersion(int* driverVersion) {
  FC_ENTER_UNGATED("cuDriverGetVersion");
  if (!driverVersion) return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = static_cast<int>(env_u64("FAKECUDA_DRIVER_VERSION", 13000));
  return CUDA_SUCCESS;
}

namespace {
struct ErrorEntry {
  CUresult code;
  const char* name;
  const char* text;
};
constexpr ErrorEntry kErrors[] = {
#define FAKECUDA_ERROR(n, s) {n, #n, s},
#include "error_table.inc"
#undef FAKECUDA_ERROR
};
const ErrorEntry* find_error(CUresult e) {
  for (const auto& x : kErrors)
    if (x.code == e) return &x;
  return nullptr;
}
}  // namespace

FC_EXPORT CUresult cuGetErrorName(CUresult error, const char** pStr) {
  if (!pStr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorEntry* e = find_error(error);
  *pStr = e ? e->name : nullptr;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FC_EXPORT CUresult cuGetErrorString(CUresult error, const char** pStr) {
  if (!pStr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorEntry* e = find_error(error);
  *pStr = e ? e->text : nullptr;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FC_EXPORT CUresult cuDeviceGetCount(int* count) {
  FC_ENTER("cuDeviceGetCount");
  FC_REQUIRE_INIT();
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = static_cast<int>(driver().devices.size());
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  FC_ENTER("cuDeviceGet");
  FC_REQUIRE_INIT();
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  FC_ENTER("cuDeviceGetName");
  if (CUresult r = check_device(dev)) return r;
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(driver().mu);
  snprintf(name, static_cast<size_t>(len), "%s", driver().devices[dev].name.c_str());
  return CUDA_SUCCESS;
}

static CUresult get_uuid(CUuuid* uuid, CUdevice dev) {
  if (CUresult r = check_device(dev)) return r;
  if (!uuid) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(driver().mu);
  *uuid = driver().devices[dev].uuid;
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  FC_ENTER("cuDeviceGetUuid");
  return get_uuid(uuid, dev);
}

FC_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  FC_ENTER("cuDeviceGetUuid");
  return get_uuid(uuid, dev);
}

FC_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  FC_ENTER("cuDeviceTotalMem");
  if (CUresult r = check_device(dev)) return r;
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  *bytes = driver().devices[dev].total_mem;
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuDeviceTotalMem(unsigned int* bytes, CUdevice dev) {
  FC_ENTER("cuDeviceTotalMem");
  if (CUresult r = check_device(dev)) return r;
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  size_t t = driver().devices[dev].total_mem;
  *bytes = t > 0xffffffffu ? 0xffffffffu : static_cast<unsigned>(t);
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  FC_ENTER("cuDeviceGetAttribute");
  if (CUresult r = check_device(dev)) return r;
  if (!pi || attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  *pi = attribute_value(attrib, dev, driver().multicast);
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev) {
  FC_ENTER("cuDeviceGetPCIBusId");
  if (CUresult r = check_device(dev)) return r;
  if (!pciBusId || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  snprintf(pciBusId, static_cast<size_t>(len), "0000:%02x:00.0", 0x18 + dev);
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuDeviceGetByPCIBusId(CUdevice* dev, const char* pciBusId) {
  FC_ENTER("cuDeviceGetByPCIBusId");
  FC_REQUIRE_INIT();
  if (!dev || !pciBusId) return CUDA_ERROR_INVALID_VALUE;
  unsigned dom = 0, bus = 0, slot = 0, fn = 0;
  if (sscanf(pciBusId, "%x:%x:%x.%x", &dom, &bus, &slot, &fn) != 4) return CUDA_ERROR_INVALID_VALUE;
  int idx = static_cast<int>(bus) - 0x18;
  if (dom != 0 || slot != 0 || !valid_device(idx)) return CUDA_ERROR_INVALID_DEVICE;
  *dev = idx;
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuDeviceCanAccessPeer(int* canAccessPeer, CUdevice dev, CUdevice peerDev) {
  FC_ENTER("cuDeviceCanAccessPeer");
  if (CUresult r = check_device(dev)) return r;
  if (!valid_device(peerDev)) return CUDA_ERROR_INVALID_DEVICE;
  if (!canAccessPeer) return CUDA_ERROR_INVALID_VALUE;
  *canAccessPeer = dev != peerDev ? 1 : 0;
  return CUDA_SUCCESS;
}
