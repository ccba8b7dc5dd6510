// ipc_interior_and_full.cpp: two facts of the real driver the shim's legacy
// IPC relies on (track_legacy.cpp), measured without the shim:
//   1. cuIpcGetMemHandle of a pointer inside a cuMemAlloc block (not its
//      base): accepted? the same handle as the base's?
//   2. a device nearly full: once cuMemCreate of the granularity (2 MiB)
//      fails, does cuMemAlloc of 4 KiB still succeed (the case the shim's
//      fall-back to the driver's cuMemAlloc serves), with and without a small
//      cuMemAlloc made before the device filled (the driver's own pool)?
// Build: g++ -O1 -o ipc_probe ipc_interior_and_full.cpp -I$CUDA/include -L$CUDA/lib64/stubs -lcuda
#include <cuda.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "probe_util.h"

int main(int argc, char** argv) {
  const bool pool_first = argc > 1 && std::strcmp(argv[1], "pool") == 0;
  if (!init_primary()) return 1;
  int ver = 0;
  cuDriverGetVersion(&ver);
  std::printf("driver %d, mode %s\n", ver, pool_first ? "pool (a 4 KiB cuMemAlloc first)" : "plain");

  // 1. Interior pointer.
  CUdeviceptr d = 0;
  CUresult r = cuMemAlloc(&d, 1 << 20);
  std::printf("cuMemAlloc 1 MiB: %s\n", name(r));
  CUipcMemHandle base{}, inner{}, end{};
  r = cuIpcGetMemHandle(&base, d);
  std::printf("cuIpcGetMemHandle(base): %s\n", name(r));
  r = cuIpcGetMemHandle(&inner, d + 4096);
  std::printf("cuIpcGetMemHandle(base + 4096): %s, %s the base's\n", name(r),
              std::memcmp(&base, &inner, sizeof base) == 0 ? "the same as" : "differs from");
  r = cuIpcGetMemHandle(&end, d + (1 << 20) - 1);
  std::printf("cuIpcGetMemHandle(last byte): %s\n", name(r));

  // 2. Nearly full.
  CUdeviceptr small = 0;
  if (pool_first) std::printf("cuMemAlloc 4 KiB before filling: %s\n", name(cuMemAlloc(&small, 4096)));
  const CUmemAllocationProp prop = device_prop(0);
  size_t gran = 0;
  cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  std::vector<CUmemGenericAllocationHandle> held;
  for (size_t chunk : {size_t(1) << 30, size_t(64) << 20, gran}) {
    for (;;) {
      CUmemGenericAllocationHandle h;
      if (cuMemCreate(&h, chunk, &prop, 0) != CUDA_SUCCESS) break;
      held.push_back(h);
    }
  }
  size_t free_b = 0, total = 0;
  cuMemGetInfo(&free_b, &total);
  std::printf("filled with %zu cuMemCreate allocations; free %zu KiB of %zu MiB; granularity %zu KiB\n",
              held.size(), free_b >> 10, total >> 20, gran >> 10);
  CUmemGenericAllocationHandle h;
  r = cuMemCreate(&h, gran, &prop, 0);
  std::printf("cuMemCreate %zu KiB now: %s\n", gran >> 10, name(r));
  if (r == CUDA_SUCCESS) held.push_back(h);
  for (size_t bytes : {size_t(4096), size_t(64) << 10, size_t(1) << 20, size_t(2) << 20}) {
    CUdeviceptr p = 0;
    r = cuMemAlloc(&p, bytes);
    std::printf("cuMemAlloc %zu KiB now: %s\n", bytes >> 10, name(r));
    if (r == CUDA_SUCCESS) cuMemFree(p);
  }
  for (auto x : held) cuMemRelease(x);
  if (small) cuMemFree(small);
  cuMemFree(d);
  return 0;
}
