// Helpers shared by the test workloads: checked driver calls and a context
// on device 0. The workloads link the driver by its soname (libcuda.so.1) and
// carry no run path, so the loader path decides between the real and the
// simulated driver.
#pragma once

#include <cuda.h>

#include <cstdio>
#include <cstdlib>

namespace workload {

/// Exits 2 with the call and the driver's error name when a call fails.
inline void check(CUresult r, const char* call, const char* who) {
  if (r == CUDA_SUCCESS) return;
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  std::fprintf(stderr, "%s: %s failed: %s (%d)\n", who, call, name ? name : "?", int(r));
  std::exit(2);
}
#define WL_CHECK(call, who) ::workload::check((call), #call, (who))

/// cuInit, device 0's primary context made current.
inline CUdevice init_device(const char* who) {
  CUdevice dev;
  CUcontext ctx;
  WL_CHECK(cuInit(0), who);
  WL_CHECK(cuDeviceGet(&dev, 0), who);
  WL_CHECK(cuDevicePrimaryCtxRetain(&ctx, dev), who);
  WL_CHECK(cuCtxSetCurrent(ctx), who);
  return dev;
}

}  // namespace workload
