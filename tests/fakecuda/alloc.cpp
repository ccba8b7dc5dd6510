// cuMemAlloc/cuMemFree (each allocation its own memfd, mapped read-write),
// memory info (system-wide, ledger.h), address ranges, pointer attributes and
// page-locked host memory (plain host memory here). cuMemAlloc, cuMemFree and cuMemAllocHost are
// potentially unsafe calls during a stream capture (capture.cpp).
#include "gate.h"
#include "ledger.h"
#include "memory.h"

#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

using namespace fc;

namespace {

/// How a call fares while a stream captures: kUnsafe, a potentially unsafe
/// call that a capture may prohibit (capture_unsafe_call), measured for
/// cuMemAlloc, cuMemFree and cuMemAllocHost; kAllowed, not treated so
/// (the stream-ordered forms, cuMemHostAlloc).
enum class InCapture { kUnsafe, kAllowed };

CUresult mem_alloc(CUdeviceptr* dptr, size_t bytes, bool low32, InCapture in_capture) {
  FC_REQUIRE_INIT();
  if (!dptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  Context* c = current_ctx();
  if (!valid_ctx(reinterpret_cast<CUcontext>(c))) return CUDA_ERROR_INVALID_CONTEXT;
  if (in_capture == InCapture::kUnsafe)
    if (CUresult r = capture_unsafe_call()) return r;
  // Mapped in whole granules; the queries report the bytes asked for
  // (find_known).
  size_t size = round_up(bytes, kGranularity);
  if (size < bytes) return CUDA_ERROR_OUT_OF_MEMORY;
  uint64_t id = 0;
  if (CUresult r = new_allocation(AllocKind::kLegacy, size, c->dev, &id)) return r;
  Allocation* a = find_alloc(id);
  a->owner = c;
  a->requested = bytes;
  uintptr_t va = 0;
  if (CUresult r = reserve_va(size, kGranularity, 0, low32, true, &va)) {
    maybe_destroy(id);
    return r;
  }
  if (CUresult r = map_range(va, size, 0, id)) {
    free_va(va, size);
    maybe_destroy(id);
    return r;
  }
  Mapping& m = d.mappings[va];
  m.access[c->dev] = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  apply_access(va, m);
  *dptr = va;
  return CUDA_SUCCESS;
}

CUresult mem_free(CUdeviceptr dptr, InCapture in_capture) {
  FC_REQUIRE_INIT();
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  auto m = d.mappings.find(dptr);
  if (m == d.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
  Allocation* a = find_alloc(m->second.alloc);
  if (!a || a->kind != AllocKind::kLegacy) return CUDA_ERROR_INVALID_VALUE;
  if (in_capture == InCapture::kUnsafe)
    if (CUresult r = capture_unsafe_call()) return r;
  size_t size = m->second.size;
  unmap_range(dptr, size);
  free_va(dptr, size);
  return CUDA_SUCCESS;
}

/// Free memory is system-wide, as on the driver: the device's total less
/// what every process holds on it (the ledger's scan of /proc, ledger.h), or
/// less this process's own use where that is more (memory not yet visible as
/// a memfd). Allocations check this process's use only (new_allocation): a
/// scan per allocation would be too slow.
CUresult mem_info(size_t* free_bytes, size_t* total) {
  FC_REQUIRE_INIT();
  if (!free_bytes || !total) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  CUdevice device = 0;
  {
    std::lock_guard<std::mutex> l(d.mu);
    Context* c = current_ctx();
    if (!valid_ctx(reinterpret_cast<CUcontext>(c))) return CUDA_ERROR_INVALID_CONTEXT;
    device = c->dev;
  }
  const LedgerScan scan = ledger_scan();  // without Driver::mu: reading /proc takes a while
  std::lock_guard<std::mutex> l(d.mu);
  if (!valid_device(device)) return CUDA_ERROR_INVALID_CONTEXT;
  const Device& dev = d.devices[device];
  const int k = dev.ledger_index;
  uint64_t used = k >= 0 && k < kMaxDevices ? scan.device[k] : 0;
  if (used < dev.used) used = dev.used;
  *total = dev.total_mem;
  *free_bytes = used >= dev.total_mem ? 0 : dev.total_mem - used;
  return CUDA_SUCCESS;
}

CUresult address_range(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
  FC_REQUIRE_INIT();
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  uintptr_t b = 0;
  size_t n = 0;
  if (!find_known(p, &b, &n)) {
    // The driver writes 0 into both variables of a query it refuses
    // (measured on an H100: tests/gpu/probes/alloc_sizes.cpp, past a block,
    // at a freed block, at a low address).
    if (base) *base = 0;
    if (size) *size = 0;
    return CUDA_ERROR_NOT_FOUND;
  }
  if (base) *base = b;
  if (size) *size = n;
  return CUDA_SUCCESS;
}

CUresult host_alloc(void** pp, size_t bytes, unsigned flags, InCapture in_capture) {
  FC_REQUIRE_INIT();
  if (!pp || bytes == 0 || (flags & ~0xfu)) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(driver().mu);
  if (in_capture == InCapture::kUnsafe)
    if (CUresult r = capture_unsafe_call()) return r;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  driver().host_allocs[reinterpret_cast<uintptr_t>(p)] = HostAlloc{bytes, flags, false};
  *pp = p;
  return CUDA_SUCCESS;
}

/// How [p, p + n) is mapped in this process, from /proc/self/maps: false when
/// part of it is not mapped or not readable; *writable when all of it is;
/// *file when some of it maps a file (inode not 0: a regular file, a memfd,
/// tmpfs, ...; not anonymous memory).
bool host_range(uintptr_t p, size_t n, bool* writable, bool* file) {
  *writable = true;
  *file = false;
  FILE* maps = fopen("/proc/self/maps", "re");
  if (!maps) return false;
  uintptr_t at = p;
  const uintptr_t end = p + n;
  char line[512];
  while (at < end && fgets(line, sizeof line, maps)) {
    unsigned long lo = 0, hi = 0, inode = 0;
    char perms[8] = {};
    if (sscanf(line, "%lx-%lx %7s %*s %*s %lu", &lo, &hi, perms, &inode) != 4) continue;
    if (hi <= at) continue;
    if (lo > at || perms[0] != 'r') break;  // a hole, or unreadable
    if (perms[1] != 'w') *writable = false;
    if (inode != 0) *file = true;
    at = hi;
  }
  fclose(maps);
  return at >= end;
}

/// $FAKECUDA_HOST_REGISTER_FILES: "refuse" (CUDA_ERROR_INVALID_VALUE) or an
/// error code: cuMemHostRegister of a range that maps a file fails with it,
/// as the real driver does where the kernel refuses to pin such pages
/// (writable file mappings outside tmpfs/shmem) or the driver refuses them.
/// Read at every call. 0: accepted (the default).
CUresult file_refusal() {
  const char* e = getenv("FAKECUDA_HOST_REGISTER_FILES");
  if (!e || !*e) return CUDA_SUCCESS;
  if (strcmp(e, "refuse") == 0) return CUDA_ERROR_INVALID_VALUE;
  return static_cast<CUresult>(strtol(e, nullptr, 10));
}

/// cuMemHostRegister as the driver documents it: flags among PORTABLE,
/// DEVICEMAP, IOMEMORY and READ_ONLY (the device supports read-only
/// registration); a current context; every byte mapped and readable, and
/// writable unless READ_ONLY (the driver pins the pages for writing);
/// overlapping a registered range or pinned allocation ->
/// CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED. Any host memory qualifies,
/// MAP_SHARED file mappings included; no pages are pinned here.
CUresult host_register(void* p, size_t bytes, unsigned flags) {
  FC_REQUIRE_INIT();
  constexpr unsigned kKnown = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                              CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
  if (!p || bytes == 0 || (flags & ~kKnown)) return CUDA_ERROR_INVALID_VALUE;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p);
  if (lo + bytes < lo) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(driver().mu);
  if (!valid_ctx(reinterpret_cast<CUcontext>(current_ctx()))) return CUDA_ERROR_INVALID_CONTEXT;
  auto& hs = driver().host_allocs;
  auto next = hs.lower_bound(lo);
  if (next != hs.end() && next->first < lo + bytes) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  if (next != hs.begin() && std::prev(next)->first + std::prev(next)->second.size > lo)
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  bool writable = false, file = false;
  if (!host_range(lo, bytes, &writable, &file)) return CUDA_ERROR_INVALID_VALUE;
  if (!writable && !(flags & CU_MEMHOSTREGISTER_READ_ONLY)) return CUDA_ERROR_INVALID_VALUE;
  if (file)
    if (CUresult r = file_refusal(); r != CUDA_SUCCESS) return r;
  hs[lo] = HostAlloc{bytes, flags, true};
  return CUDA_SUCCESS;
}

}  // namespace

FC_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  FC_ENTER("cuMemAlloc");
  return mem_alloc(dptr, bytesize, false, InCapture::kUnsafe);
}

FC_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1* dptr, unsigned int bytesize) {
  FC_ENTER("cuMemAlloc");
  if (!dptr) return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr p = 0;
  CUresult r = mem_alloc(&p, bytesize, true, InCapture::kUnsafe);
  if (r == CUDA_SUCCESS) *dptr = static_cast<CUdeviceptr_v1>(p);
  return r;
}

// Stream-ordered forms: streams are synchronous, so these are the plain ones.
FC_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  FC_ENTER("cuMemAllocAsync");
  {
    std::lock_guard<std::mutex> l(driver().mu);
    if (driver().initialized && !valid_stream(hStream)) return CUDA_ERROR_INVALID_HANDLE;
  }
  return mem_alloc(dptr, bytesize, false, InCapture::kAllowed);
}
FC_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  FC_ENTER("cuMemAllocAsync");
  {
    std::lock_guard<std::mutex> l(driver().mu);
    if (driver().initialized && !valid_stream(hStream)) return CUDA_ERROR_INVALID_HANDLE;
  }
  return mem_alloc(dptr, bytesize, false, InCapture::kAllowed);
}
FC_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  FC_ENTER("cuMemFreeAsync");
  {
    std::lock_guard<std::mutex> l(driver().mu);
    if (driver().initialized && !valid_stream(hStream)) return CUDA_ERROR_INVALID_HANDLE;
  }
  return mem_free(dptr, InCapture::kAllowed);
}
FC_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  FC_ENTER("cuMemFreeAsync");
  {
    std::lock_guard<std::mutex> l(driver().mu);
    if (driver().initialized && !valid_stream(hStream)) return CUDA_ERROR_INVALID_HANDLE;
  }
  return mem_free(dptr, InCapture::kAllowed);
}

FC_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  FC_ENTER("cuMemFree");
  return mem_free(dptr, InCapture::kUnsafe);
}

FC_EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr) {
  FC_ENTER("cuMemFree");
  return mem_free(dptr, InCapture::kUnsafe);
}

FC_EXPORT CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  FC_ENTER("cuMemGetInfo");
  return mem_info(free, total);
}

FC_EXPORT CUresult cuMemGetInfo(unsigned int* free, unsigned int* total) {
  FC_ENTER("cuMemGetInfo");
  if (!free || !total) return CUDA_ERROR_INVALID_VALUE;
  size_t f = 0, t = 0;
  CUresult r = mem_info(&f, &t);
  if (r == CUDA_SUCCESS) {
    *free = f > 0xffffffffu ? 0xffffffffu : static_cast<unsigned>(f);
    *total = t > 0xffffffffu ? 0xffffffffu : static_cast<unsigned>(t);
  }
  return r;
}

FC_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  FC_ENTER("cuMemGetAddressRange");
  return address_range(pbase, psize, dptr);
}

FC_EXPORT CUresult cuMemGetAddressRange(CUdeviceptr_v1* pbase, unsigned int* psize,
                                        CUdeviceptr_v1 dptr) {
  FC_ENTER("cuMemGetAddressRange");
  CUdeviceptr b = 0;
  size_t s = 0;
  CUresult r = address_range(&b, &s, dptr);
  if (r == CUDA_SUCCESS) {
    if (pbase) *pbase = static_cast<CUdeviceptr_v1>(b);
    if (psize) *psize = static_cast<unsigned>(s);
  }
  return r;
}

namespace {

/// Whether p lies in host memory the driver knows of (cuMemAllocHost,
/// cuMemHostAlloc, cuMemHostRegister). Driver::mu held.
bool known_host_memory(uintptr_t p) {
  auto& hs = driver().host_allocs;
  auto h = hs.upper_bound(p);
  return h != hs.begin() && p < std::prev(h)->first + std::prev(h)->second.size;
}

/// One attribute of ptr, as cuPointerGetAttribute answers (Driver::mu held).
CUresult pointer_attribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  uintptr_t base = 0;
  size_t size = 0;
  Mapping* m = find_known(ptr, &base, &size);
  if (!m) {
    if (!known_host_memory(ptr)) return CUDA_ERROR_INVALID_VALUE;
    switch (attribute) {
      case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *static_cast<unsigned*>(data) = CU_MEMORYTYPE_HOST;
        return CUDA_SUCCESS;
      case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *static_cast<void**>(data) = reinterpret_cast<void*>(ptr);
        return CUDA_SUCCESS;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  }
  Allocation* a = find_alloc(m->alloc);
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      // A legacy IPC open: the context it was opened in (measured on an
      // H100, driver 580.159.04: tests/gpu/probes/alloc_sizes.cpp ipc_attrs).
      if (auto o = d.ipc_opens.find(base); o != d.ipc_opens.end()) {
        *static_cast<CUcontext*>(data) =
            reinterpret_cast<CUcontext>(const_cast<void*>(o->second.owner));
        return CUDA_SUCCESS;
      }
      // A cuMemAlloc block: the context it was allocated in, whichever is
      // current (cuda.h: "the CUcontext in which ptr was allocated";
      // alloc_sizes.cpp ctx_attrs, on an H100). A VMM mapping: none, whether
      // its allocation was created here with a created context current
      // (ctx_attrs) or imported from another process (ipc_attrs, under the
      // shim, which maps such an import).
      if (a->kind == AllocKind::kLegacy)
        *static_cast<CUcontext*>(data) =
            reinterpret_cast<CUcontext>(a->owner ? const_cast<void*>(a->owner) : d.primary[a->dev]);
      else
        *static_cast<CUcontext*>(data) = nullptr;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned*>(data) = CU_MEMORYTYPE_DEVICE;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      *static_cast<CUdeviceptr*>(data) = ptr;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = a->dev;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = base;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<size_t*>(data) = size;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
      *static_cast<int*>(data) = 1;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      *static_cast<int*>(data) = a->kind == AllocKind::kLegacy;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      // None for memory another process created: a legacy IPC open, and a
      // VMM allocation imported from its POSIX descriptor (measured as for
      // CONTEXT, the second under the shim, which opens a handle so).
      *static_cast<unsigned long long*>(data) = a->imported ? 0 : a->prop.requestedHandleTypes;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      *static_cast<unsigned long long*>(data) = a->id;
      return CUDA_SUCCESS;
    // Device memory that is not managed, from no pool, and the access the
    // current context's device has to it (served-block-h100.log, for a
    // cuMemAlloc block and a VMM mapping; alloc_sizes.cpp ipc_attrs for a
    // legacy IPC open). cuda.h gives the first two no width: the lowest byte.
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      *static_cast<unsigned char*>(data) = 0;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: {
      const Context* c = current_ctx();
      const CUdevice dev =
          valid_ctx(reinterpret_cast<CUcontext>(const_cast<Context*>(c))) ? c->dev : a->dev;
      *static_cast<unsigned char*>(data) = m->access[dev];
      return CUDA_SUCCESS;
    }
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      *static_cast<CUmemoryPool*>(data) = nullptr;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
      // What cuPointerSetAttribute last set on this mapping, read the same
      // with any context current; a VMM mapping, which refuses it, reads 0
      // (alloc_sizes.cpp ctx_attrs, on an H100), in 4 bytes as the driver
      // writes it there.
      *static_cast<unsigned*>(data) = m->sync_memops;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
      // A cuMemAlloc block is; a VMM allocation only when created so
      // (served-block-h100.log).
      *static_cast<int*>(data) =
          a->kind == AllocKind::kLegacy || a->prop.allocFlags.gpuDirectRDMACapable;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

/// What cuPointerGetAttributes writes of an address the driver does not
/// know: 0, the device ordinal -2 (an int). Measured on an H200, driver
/// 580.159.04 (tests/gpu/probes/alloc_sizes.cpp, one past a cuMemAlloc
/// block's bytes): CONTEXT, MEMORY_TYPE, DEVICE_POINTER, BUFFER_ID,
/// IS_MANAGED, DEVICE_ORDINAL, RANGE_START_ADDR, RANGE_SIZE, MAPPED,
/// IS_LEGACY_CUDA_IPC_CAPABLE, ALLOWED_HANDLE_TYPES, ACCESS_FLAGS and
/// MEMPOOL_HANDLE. Each in the width cuda.h gives it (a handle, an address,
/// a size, an id, the P2P tokens); a boolean or flags, for which cuda.h
/// gives none, in its lowest byte (the driver's own width is not measured).
void unknown_attribute(void* data, CUpointer_attribute attribute) {
  if (!data) return;
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *static_cast<CUcontext*>(data) = nullptr;
      break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      *static_cast<void**>(data) = nullptr;
      break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned*>(data) = 0;
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
      *static_cast<CUdeviceptr*>(data) = 0;
      break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
      *static_cast<size_t*>(data) = 0;
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = -2;
      break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
      *static_cast<unsigned long long*>(data) = 0;
      break;
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
      *static_cast<CUDA_POINTER_ATTRIBUTE_P2P_TOKENS*>(data) = {};
      break;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
    case CU_POINTER_ATTRIBUTE_MAPPED:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      // cuda.h gives no width (a boolean, a bitmask of a 4-byte enum): the
      // lowest byte only, so that no caller's variable is overrun.
      *static_cast<unsigned char*>(data) = 0;
      break;
    default:
      break;
  }
}

}  // namespace

FC_EXPORT CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute,
                                         CUdeviceptr ptr) {
  FC_ENTER("cuPointerGetAttribute");
  FC_REQUIRE_INIT();
  std::lock_guard<std::mutex> l(driver().mu);
  return pointer_attribute(data, attribute, ptr);
}

/// cuPointerGetAttributes: each attribute as cuPointerGetAttribute answers
/// it; one it cannot answer (an attribute the fake does not keep) is left as
/// the caller set it, and the call succeeds. For an address the driver does
/// not know (no device mapping, no host memory it knows of, the tail of a
/// cuMemAlloc block past its bytes) it writes each attribute's
/// unknown_attribute value and succeeds, as the driver's does.
FC_EXPORT CUresult cuPointerGetAttributes(unsigned int numAttributes,
                                          CUpointer_attribute* attributes, void** data,
                                          CUdeviceptr ptr) {
  FC_ENTER("cuPointerGetAttributes");
  FC_REQUIRE_INIT();
  if (numAttributes == 0 || !attributes || !data) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(driver().mu);
  const bool known = find_known(ptr, nullptr, nullptr) || known_host_memory(ptr);
  for (unsigned int i = 0; i < numAttributes; ++i) {
    if (known)
      pointer_attribute(data[i], attributes[i], ptr);
    else
      unknown_attribute(data[i], attributes[i]);
  }
  return CUDA_SUCCESS;
}

/// cuPointerSetAttribute: SYNC_MEMOPS on a cuMemAlloc block, and on a legacy
/// IPC open of one (alloc_sizes.cpp ipc_attrs, on an H100), is taken (the
/// fake's memory operations are synchronous anyway): the block's attribute,
/// not its context's flag (alloc_sizes.cpp ctx_attrs); on a VMM mapping the
/// driver refuses it, NOT_SUPPORTED (served-block-h100.log). Other
/// attributes, and addresses of no device memory (a cuMemAlloc block's tail
/// past its bytes among them, find_known): INVALID_VALUE.
FC_EXPORT CUresult cuPointerSetAttribute(const void* value, CUpointer_attribute attribute,
                                         CUdeviceptr ptr) {
  FC_ENTER("cuPointerSetAttribute");
  FC_REQUIRE_INIT();
  if (!value || attribute != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(driver().mu);
  Mapping* m = find_known(ptr, nullptr, nullptr);
  if (!m) return CUDA_ERROR_INVALID_VALUE;
  Allocation* a = find_alloc(m->alloc);
  if (!driver_block(a)) return CUDA_ERROR_NOT_SUPPORTED;
  m->sync_memops = *static_cast<const unsigned*>(value) != 0;
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuMemAllocHost_v2(void** pp, size_t bytesize) {
  FC_ENTER("cuMemAllocHost");
  return host_alloc(pp, bytesize, 0, InCapture::kUnsafe);
}
FC_EXPORT CUresult cuMemAllocHost(void** pp, unsigned int bytesize) {
  FC_ENTER("cuMemAllocHost");
  return host_alloc(pp, bytesize, 0, InCapture::kUnsafe);
}
FC_EXPORT CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  FC_ENTER("cuMemHostAlloc");
  return host_alloc(pp, bytesize, Flags, InCapture::kAllowed);
}

FC_EXPORT CUresult cuMemFreeHost(void* p) {
  FC_ENTER("cuMemFreeHost");
  FC_REQUIRE_INIT();
  std::lock_guard<std::mutex> l(driver().mu);
  auto& hs = driver().host_allocs;
  auto it = hs.find(reinterpret_cast<uintptr_t>(p));
  if (!p || it == hs.end() || it->second.registered) return CUDA_ERROR_INVALID_VALUE;
  munmap(p, it->second.size);
  hs.erase(it);
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int Flags) {
  FC_ENTER("cuMemHostRegister");
  return host_register(p, bytesize, Flags);
}
FC_EXPORT CUresult cuMemHostRegister(void* p, size_t bytesize, unsigned int Flags) {
  FC_ENTER("cuMemHostRegister");
  return host_register(p, bytesize, Flags);
}

FC_EXPORT CUresult cuMemHostUnregister(void* p) {
  FC_ENTER("cuMemHostUnregister");
  FC_REQUIRE_INIT();
  std::lock_guard<std::mutex> l(driver().mu);
  auto& hs = driver().host_allocs;
  auto it = hs.find(reinterpret_cast<uintptr_t>(p));
  if (!p || it == hs.end() || !it->second.registered) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  hs.erase(it);
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p, unsigned int Flags) {
  FC_ENTER("cuMemHostGetDevicePointer");
  FC_REQUIRE_INIT();
  if (!pdptr || !p || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(driver().mu);
  if (check_range(reinterpret_cast<uintptr_t>(p), 1, false) != CUDA_SUCCESS)
    return CUDA_ERROR_INVALID_VALUE;
  *pdptr = reinterpret_cast<uintptr_t>(p);
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuMemHostGetFlags(unsigned int* pFlags, void* p) {
  FC_ENTER("cuMemHostGetFlags");
  FC_REQUIRE_INIT();
  if (!pFlags) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(driver().mu);
  auto& hs = driver().host_allocs;
  auto it = hs.find(reinterpret_cast<uintptr_t>(p));
  if (it == hs.end()) return CUDA_ERROR_INVALID_VALUE;
  *pFlags = it->second.flags;
  return CUDA_SUCCESS;
}
