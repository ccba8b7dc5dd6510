// The simulated devices as the environment describes them, shared by the
// driver (devices.cpp) and the simulated NVML (nvml.cpp) so that both see the
// same devices with the very same UUIDs:
//   FAKECUDA_DEVICES (1, at most kMaxDevices), FAKECUDA_DEVICE_NAME,
//   FAKECUDA_TOTAL_MEM (bytes per device), FAKECUDA_UUID_SEED.
// Free of the CUDA headers (the NVML library does not include them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

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

/// Deterministic 16-byte UUID of device `index` under `seed` (cuDeviceGetUuid).
void device_uuid(int index, uint64_t seed, unsigned char out[16]);

/// NVML's form of a UUID: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
std::string gpu_uuid_string(const unsigned char bytes[16]);

}  // namespace fc
