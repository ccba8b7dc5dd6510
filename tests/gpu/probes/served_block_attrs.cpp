// served_block_attrs.cpp: what a program sees of a cuMemAlloc block through
// the driver's pointer queries, run once on the driver alone and once under
// `cusnap launch` (where the shim serves the block from an exportable VMM
// allocation): the attributes a library may test before it shares or frees
// a block (IS_LEGACY_CUDA_IPC_CAPABLE, ALLOWED_HANDLE_TYPES, MEMPOOL_HANDLE,
// the range and the mapping), cuMemGetAddressRange of an interior pointer,
// cuPointerSetAttribute(SYNC_MEMOPS) and cuMemRetainAllocationHandle; and the
// device's GPUDirect RDMA attributes, with what a VMM allocation reports
// without and with allocFlags.gpuDirectRDMACapable (and which handle a retain
// of its mapping returns).
// Build: g++ -O1 -o served_block_attrs served_block_attrs.cpp -I$CUDA/include -L$CUDA/lib64/stubs
// -lcuda
#include <cuda.h>

#include <cstdio>

#include "probe_util.h"

static void attr(const char* what, CUpointer_attribute a, CUdeviceptr p) {
  unsigned long long v = 0;  // wide enough for every attribute asked
  CUresult r = cuPointerGetAttribute(&v, a, p);
  if (r == CUDA_SUCCESS)
    std::printf("   %-28s %#llx\n", what, v);
  else
    std::printf("   %-28s %s\n", what, name(r));
}

int main() {
  CUdevice dev = 0;
  if (!init_primary(&dev)) return 1;
  int v = -1;
  cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, dev);
  std::printf("device GPU_DIRECT_RDMA_SUPPORTED %d", v);
  v = -1;
  cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev);
  std::printf(", GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED %d\n", v);
  for (int flag = 0; flag < 2; ++flag) {  // a VMM allocation, without and with the RDMA flag
    CUmemAllocationProp prop = device_prop(0);
    prop.allocFlags.gpuDirectRDMACapable = flag;
    CUmemGenericAllocationHandle h;
    CUdeviceptr va = 0;
    const CUmemAccessDesc acc = rw_access(prop);
    const size_t vs = 2 << 20;
    std::printf("VMM gpuDirectRDMACapable=%d: cuMemCreate %s", flag,
                name(cuMemCreate(&h, vs, &prop, 0)));
    cuMemAddressReserve(&va, vs, 0, 0, 0);
    cuMemMap(va, vs, 0, h, 0);
    cuMemSetAccess(va, vs, &acc, 1);
    std::printf("\n");
    attr("IS_GPU_DIRECT_RDMA_CAPABLE", CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, va);
    CUmemGenericAllocationHandle again = 0;
    CUresult rr = cuMemRetainAllocationHandle(&again, reinterpret_cast<void*>(va + 4096));
    std::printf("   cuMemRetainAllocationHandle: %s, %s\n", name(rr),
                again == h ? "the handle it was mapped with" : "another handle");
    if (rr == CUDA_SUCCESS) std::printf("   cuMemRelease of it: %s\n", name(cuMemRelease(again)));
    cuMemUnmap(va, vs);
    cuMemAddressFree(va, vs);
    cuMemRelease(h);
  }
  CUdeviceptr d = 0;
  const size_t size = 3 << 20;  // not a multiple of the 2 MiB granularity
  std::printf("cuMemAlloc 3 MiB: %s\n", name(cuMemAlloc(&d, size)));
  const CUdeviceptr in = d + 4096;
  attr("MEMORY_TYPE", CU_POINTER_ATTRIBUTE_MEMORY_TYPE, in);
  attr("DEVICE_ORDINAL", CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, in);
  attr("IS_LEGACY_CUDA_IPC_CAPABLE", CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, in);
  attr("ALLOWED_HANDLE_TYPES", CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, in);
  attr("MEMPOOL_HANDLE", CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, in);
  attr("IS_GPU_DIRECT_RDMA_CAPABLE", CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, in);
  attr("MAPPED", CU_POINTER_ATTRIBUTE_MAPPED, in);
  attr("ACCESS_FLAGS", CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, in);
  std::printf("   (base %#llx)\n", (unsigned long long)d);
  attr("RANGE_START_ADDR", CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, in);
  attr("RANGE_SIZE", CU_POINTER_ATTRIBUTE_RANGE_SIZE, in);
  attr("MAPPING_BASE_ADDR", CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, in);
  attr("MAPPING_SIZE", CU_POINTER_ATTRIBUTE_MAPPING_SIZE, in);
  CUdeviceptr base = 0;
  size_t got = 0;
  CUresult r = cuMemGetAddressRange(&base, &got, in);
  std::printf("cuMemGetAddressRange(base+4 KiB): %s base %#llx size %zu\n", name(r),
              (unsigned long long)base, got);
  unsigned one = 1;
  std::printf("cuPointerSetAttribute(SYNC_MEMOPS): %s\n",
              name(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, d)));
  CUmemGenericAllocationHandle retained = 0;
  std::printf("cuMemRetainAllocationHandle: %s\n",
              name(cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(d))));
  CUipcMemHandle h;
  std::printf("cuIpcGetMemHandle: %s\n", name(cuIpcGetMemHandle(&h, d)));
  std::printf("cuMemFree: %s\n", name(cuMemFree(d)));
  return 0;
}
