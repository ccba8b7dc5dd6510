// The simulated devices as the environment describes them, shared by the
// driver (devices.cpp) and the simulated NVML (nvml.cpp) so that both see the
// same devices with the very same UUIDs:
//   FAKECUDA_DEVICES (1, at most kMaxDevices), FAKECUDA_DEVICE_NAME,
//   FAKECUDA_TOTAL_MEM (bytes per device), FAKECUDA_UUID_SEED.
// The driver, not NVML, also honours CUDA_VISIBLE_DEVICES (visible_devices).
// Free of the CUDA headers (the NVML library does not include them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fc {

constexpr int kMaxDevices = 16;
constexpr size_t kDefaultTotalMem = size_t{143771} << 20;  // H200: 143771 MiB
constexpr const char* kDefaultDeviceName = "NVIDIA H200 (simulated)";

struct DeviceEnv {
  int count = 1;  ///< 0..kMaxDevices
  std::string name;
  size_t total_mem = kDefaultTotalMem;
  uint64_t seed = 0;
};

/// An environment variable parsed as an unsigned number (any base strtoull
/// takes), or def when unset, empty or not wholly a number.
unsigned long long env_u64(const char* name, unsigned long long def);

/// Reads the environment now.
DeviceEnv read_device_env();

/// The machine's indexes of the devices a process of the driver sees, in its
/// ordinal order: all `count` when CUDA_VISIBLE_DEVICES is unset, else those
/// it lists (an index, or a UUID "GPU-..." or a prefix of one naming a single
/// device) up to its first entry that names no device or one already listed,
/// as the real driver reads it. Empty (cuInit fails NO_DEVICE) when it is
/// set and names none.
std::vector<int> visible_devices(int count, uint64_t seed);

/// Deterministic 16-byte UUID of device `index` under `seed` (cuDeviceGetUuid).
void device_uuid(int index, uint64_t seed, unsigned char out[16]);

/// NVML's form of a UUID: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
std::string gpu_uuid_string(const unsigned char bytes[16]);

}  // namespace fc
