// free_async_kinds.cpp: what the real driver's cuMemFreeAsync does with
// memory the stream-ordered allocator did not make (the shim serves
// cuMemAlloc from VMM and does not hook cuMemFreeAsync):
//   1. a block of the driver's cuMemAlloc;
//   2. an address mapped by cuMemCreate + cuMemMap (as the shim's blocks are).
// Measured (H100, 580.159.04; docs/gpu-runs/served-block-h100.log): the
// driver frees a cuMemAlloc block in stream order, and refuses a VMM-mapped
// address (INVALID_VALUE, the mapping left), so the shim hooks cuMemFreeAsync
// for the blocks it serves. Run with and without `cusnap launch`.
// Build: g++ -O1 -o free_async_probe free_async_kinds.cpp -I$CUDA/include -L$CUDA/lib64/stubs
// -lcuda
#include <cuda.h>

#include <cstdio>

#include "probe_util.h"

int main() {
  if (!init_primary()) return 1;
  CUstream st;
  cuStreamCreate(&st, CU_STREAM_NON_BLOCKING);

  CUdeviceptr d = 0;
  std::printf("1. cuMemAlloc 1 MiB: %s\n", name(cuMemAlloc(&d, 1 << 20)));
  std::printf("   cuMemFreeAsync: %s\n", name(cuMemFreeAsync(d, st)));
  std::printf("   cuStreamSynchronize: %s\n", name(cuStreamSynchronize(st)));
  std::printf("   cuMemsetD8 on it after: %s\n", name(cuMemsetD8(d, 1, 16)));
  std::printf("   cuCtxSynchronize: %s\n", name(cuCtxSynchronize()));
  std::printf("   cuMemFree of it again: %s\n", name(cuMemFree(d)));

  const CUmemAllocationProp prop = device_prop(0);
  size_t size = 2 << 20;
  CUmemGenericAllocationHandle h;
  CUdeviceptr va = 0;
  const CUmemAccessDesc acc = rw_access(prop);
  std::printf("2. cuMemCreate: %s", name(cuMemCreate(&h, size, &prop, 0)));
  std::printf(", reserve: %s", name(cuMemAddressReserve(&va, size, 0, 0, 0)));
  std::printf(", map: %s", name(cuMemMap(va, size, 0, h, 0)));
  std::printf(", access: %s\n", name(cuMemSetAccess(va, size, &acc, 1)));
  std::printf("   cuMemFreeAsync of the mapped address: %s\n", name(cuMemFreeAsync(va, st)));
  std::printf("   cuStreamSynchronize: %s\n", name(cuStreamSynchronize(st)));
  std::printf("   cuMemsetD8 on it after: %s\n", name(cuMemsetD8(va, 1, 16)));
  std::printf("   cuCtxSynchronize: %s\n", name(cuCtxSynchronize()));
  std::printf("   cuMemUnmap: %s", name(cuMemUnmap(va, size)));
  std::printf(", address free: %s", name(cuMemAddressFree(va, size)));
  std::printf(", release: %s\n", name(cuMemRelease(h)));
  return 0;
}
