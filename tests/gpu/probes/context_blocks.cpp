// context_blocks.cpp: what goes with a context. A created context's
// cuMemAlloc block at its cuCtxDestroy, and the primary context's cuMemAlloc
// block and a VMM mapping at cuDevicePrimaryCtxReset (cudaDeviceReset): the
// device memory given back (cuMemGetInfo), and whether the VMM mapping is
// still usable. Run on the driver alone and under `cusnap launch` (where the
// shim serves cuMemAlloc from VMM memory and must free its blocks itself).
// Build: g++ -O1 -o context_blocks context_blocks.cpp -I$CUDA/include -L$CUDA/lib64/stubs -lcuda
#include <cuda.h>

#include <cstdio>

#include "probe_util.h"

static long long free_mib() {
  size_t f = 0, t = 0;
  cuMemGetInfo(&f, &t);
  return static_cast<long long>(f >> 20);
}

int main() {
  if (cuInit(0) != CUDA_SUCCESS) return 1;
  const size_t big = size_t(4) << 30;
  CUdevice dev;
  cuDeviceGet(&dev, 0);
  CUcontext own = nullptr, primary = nullptr;
  cuDevicePrimaryCtxRetain(&primary, dev);  // made first: its own memory is not counted below
  cuCtxCreate(&own, nullptr, 0, dev);
  const long long f0 = free_mib();
  CUdeviceptr a = 0;
  std::printf("created context: cuMemAlloc 4 GiB: %s", name(cuMemAlloc(&a, big)));
  const long long f1 = free_mib();
  std::printf(", cuCtxDestroy: %s\n", name(cuCtxDestroy(own)));
  cuCtxSetCurrent(primary);
  std::printf("   taken %lld MiB, given back at the destroy %lld MiB\n", f0 - f1, free_mib() - f1);

  const long long g0 = free_mib();
  CUdeviceptr b = 0;
  std::printf("primary context: cuMemAlloc 4 GiB: %s", name(cuMemAlloc(&b, big)));
  const CUmemAllocationProp prop = device_prop(dev, CU_MEM_HANDLE_TYPE_NONE);
  CUmemGenericAllocationHandle h;
  CUdeviceptr va = 0;
  const CUmemAccessDesc acc = rw_access(prop);
  std::printf(", VMM 4 GiB: %s", name(cuMemCreate(&h, big, &prop, 0)));
  cuMemAddressReserve(&va, big, 0, 0, 0);
  cuMemMap(va, big, 0, h, 0);
  cuMemSetAccess(va, big, &acc, 1);
  const long long g1 = free_mib();
  std::printf(", cuDevicePrimaryCtxReset: %s\n", name(cuDevicePrimaryCtxReset(dev)));
  cuDevicePrimaryCtxRetain(&primary, dev);
  cuCtxSetCurrent(primary);
  const long long g2 = free_mib();
  std::printf("   taken %lld MiB, given back at the reset %lld MiB\n", g0 - g1, g2 - g1);
  std::printf("   cuMemsetD8 on the VMM mapping after: %s\n", name(cuMemsetD8(va, 1, 16)));
  std::printf("   cuMemFree of the cuMemAlloc block after: %s\n", name(cuMemFree(b)));
  cuMemUnmap(va, big);
  cuMemAddressFree(va, big);
  cuMemRelease(h);
  std::printf("   after the VMM mapping's release: %lld MiB more\n", free_mib() - g2);
  return 0;
}
