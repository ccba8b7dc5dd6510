// probe_util.h: what the GPU probes of this directory share. Each probe is a
// standalone program, built on a GPU machine with
//   g++ -O1 -I/usr/local/cuda/include PROBE.cpp -lcuda -o PROBE
// (scripts/gpu-test-shim.sh builds some of them so); this header comes with
// it from the same directory.
#pragma once

#include <cuda.h>

/// The driver's name of a result ("CUDA_SUCCESS"), or "?".
inline const char* name(CUresult r) {
  const char* s = nullptr;
  cuGetErrorName(r, &s);
  return s ? s : "?";
}

/// cuInit, then device 0's primary context made current (its device in
/// *dev); false when cuInit fails.
inline bool init_primary(CUdevice* dev = nullptr) {
  if (cuInit(0) != CUDA_SUCCESS) return false;
  CUdevice d = 0;
  CUcontext ctx = nullptr;
  cuDeviceGet(&d, 0);
  cuDevicePrimaryCtxRetain(&ctx, d);
  cuCtxSetCurrent(ctx);
  if (dev) *dev = d;
  return true;
}

/// The properties of a pinned allocation of device dev's memory, exportable
/// as the handle types given.
inline CUmemAllocationProp device_prop(
    int dev, CUmemAllocationHandleType types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = types;
  return prop;
}

/// Read-write access to a mapping, for the device of prop.
inline CUmemAccessDesc rw_access(const CUmemAllocationProp& prop) {
  CUmemAccessDesc acc{};
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return acc;
}
