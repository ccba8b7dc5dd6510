// The NVML entry points cusnap calls, as one table resolved from a dlopen
// handle: the coordinator's reader (src/coord/gpu_memory.cpp) and the
// simulated NVML's test (tests/fakecuda/nvml_test.cpp) share it, so that the
// list of names is written once.
#pragma once

#include <dlfcn.h>

#include <type_traits>

#include "cudaapi/nvml_api.h"

namespace cusnap {

struct NvmlTable {
  decltype(&nvmlInit_v2) init = nullptr;
  decltype(&nvmlShutdown) shutdown = nullptr;
  decltype(&nvmlErrorString) error_string = nullptr;
  decltype(&nvmlDeviceGetCount_v2) count = nullptr;
  decltype(&nvmlDeviceGetHandleByIndex_v2) by_index = nullptr;
  decltype(&nvmlDeviceGetUUID) uuid = nullptr;
  decltype(&nvmlDeviceGetMemoryInfo) memory = nullptr;
  decltype(&nvmlDeviceGetComputeRunningProcesses_v3) processes = nullptr;

  /// Resolves every entry point from `handle`. Returns the name of the first
  /// one missing (and leaves `init` null, so that the table is not used), or
  /// nullptr when all were found.
  const char* resolve(void* handle) {
    const char* missing = nullptr;
    auto sym = [&](auto* fn, const char* name) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(handle, name));
      if (!*fn && !missing) missing = name;
    };
    sym(&init, "nvmlInit_v2");
    sym(&shutdown, "nvmlShutdown");
    sym(&error_string, "nvmlErrorString");
    sym(&count, "nvmlDeviceGetCount_v2");
    sym(&by_index, "nvmlDeviceGetHandleByIndex_v2");
    sym(&uuid, "nvmlDeviceGetUUID");
    sym(&memory, "nvmlDeviceGetMemoryInfo");
    sym(&processes, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (missing) init = nullptr;
    return missing;
  }
};

}  // namespace cusnap
