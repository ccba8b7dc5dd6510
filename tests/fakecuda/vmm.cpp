// Virtual memory management: physical allocations (memfds), address
// reservations, mappings, access, and POSIX file-descriptor export/import.
// Rules enforced as the driver does: 2 MiB granularity for sizes, addresses
// and offsets; mappings only inside a reservation and never overlapping;
// unmapping whole mappings; access set on whole mapped ranges.
#include "gate.h"
#include "memory.h"

#include <unistd.h>

using namespace fc;

namespace {

bool valid_prop(const CUmemAllocationProp* prop) {
  return prop && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
         prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && valid_device(prop->location.id);
}

constexpr unsigned kKnownHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR |
                                       CU_MEM_HANDLE_TYPE_WIN32 | CU_MEM_HANDLE_TYPE_WIN32_KMT |
                                       CU_MEM_HANDLE_TYPE_FABRIC;

}  // namespace

FC_EXPORT CUresult cuMemGetAllocationGranularity(size_t* granularity,
                                                 const CUmemAllocationProp* prop,
                                                 CUmemAllocationGranularity_flags option) {
  FC_ENTER("cuMemGetAllocationGranularity");
  FC_REQUIRE_INIT();
  if (!granularity || !valid_prop(prop)) return CUDA_ERROR_INVALID_VALUE;
  if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
    return CUDA_ERROR_INVALID_VALUE;
  *granularity = kGranularity;
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                               const CUmemAllocationProp* prop, unsigned long long flags) {
  FC_ENTER("cuMemCreate");
  FC_REQUIRE_INIT();
  if (!handle || !prop || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && !valid_device(prop->location.id))
    return CUDA_ERROR_INVALID_DEVICE;
  if (!valid_prop(prop) || size == 0 || size % kGranularity) return CUDA_ERROR_INVALID_VALUE;
  if (prop->requestedHandleTypes & ~kKnownHandleTypes) return CUDA_ERROR_INVALID_VALUE;
  if (prop->requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return CUDA_ERROR_NOT_SUPPORTED;
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  uint64_t id = 0;
  if (CUresult r = new_allocation(AllocKind::kVmm, size, prop->location.id, &id)) return r;
  Allocation* a = find_alloc(id);
  a->prop = *prop;
  a->handle_refs = 1;
  *handle = id;
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  FC_ENTER("cuMemRelease");
  FC_REQUIRE_INIT();
  std::lock_guard<std::mutex> l(driver().mu);
  Allocation* a = find_alloc(handle);
  if (!a || a->handle_refs <= 0 || driver_block(a)) return CUDA_ERROR_INVALID_VALUE;
  --a->handle_refs;
  maybe_destroy(handle);
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                       CUdeviceptr addr, unsigned long long flags) {
  FC_ENTER("cuMemAddressReserve");
  FC_REQUIRE_INIT();
  if (!ptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (alignment & (alignment - 1)) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(driver().mu);
  uintptr_t va = 0;
  if (CUresult r = reserve_va(size, alignment, addr, false, false, &va)) return r;
  *ptr = va;
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  FC_ENTER("cuMemAddressFree");
  FC_REQUIRE_INIT();
  std::lock_guard<std::mutex> l(driver().mu);
  auto& rs = driver().reservations;
  auto it = rs.find(ptr);
  if (it == rs.end() || it->second.internal) return CUDA_ERROR_INVALID_VALUE;
  return free_va(ptr, size);
}

FC_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                            CUmemGenericAllocationHandle handle, unsigned long long flags) {
  FC_ENTER("cuMemMap");
  FC_REQUIRE_INIT();
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(driver().mu);
  Allocation* a = find_alloc(handle);
  if (!a || a->handle_refs <= 0) return CUDA_ERROR_INVALID_HANDLE;
  auto& rs = driver().reservations;
  auto r = rs.upper_bound(ptr);
  if (r != rs.begin() && std::prev(r)->second.internal) return CUDA_ERROR_INVALID_VALUE;
  return map_range(ptr, size, offset, handle);
}

FC_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  FC_ENTER("cuMemUnmap");
  FC_REQUIRE_INIT();
  std::lock_guard<std::mutex> l(driver().mu);
  Mapping* m = find_mapping(ptr, nullptr);
  if (m && driver_block(find_alloc(m->alloc))) return CUDA_ERROR_INVALID_VALUE;
  return unmap_range(ptr, size);
}

FC_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                                  size_t count) {
  FC_ENTER("cuMemSetAccess");
  FC_REQUIRE_INIT();
  if (!desc || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(desc[i].location.id)) return CUDA_ERROR_INVALID_DEVICE;
    if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      return CUDA_ERROR_INVALID_VALUE;
  }
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  // The range must consist of whole, contiguous mappings.
  uintptr_t p = ptr;
  auto it = d.mappings.find(ptr);
  while (p < ptr + size) {
    if (it == d.mappings.end() || it->first != p) return CUDA_ERROR_INVALID_VALUE;
    p += it->second.size;
    ++it;
  }
  if (p != ptr + size) return CUDA_ERROR_INVALID_VALUE;
  // A cuMemAlloc block and a legacy IPC open are no VMM mappings: refused,
  // whatever the size (measured on an H100, driver 580.159.04:
  // tests/gpu/probes/alloc_sizes.cpp ctx_attrs and ipc_attrs).
  for (it = d.mappings.find(ptr); it != d.mappings.end() && it->first < ptr + size; ++it)
    if (driver_block(find_alloc(it->second.alloc))) return CUDA_ERROR_INVALID_VALUE;
  for (it = d.mappings.find(ptr); it != d.mappings.end() && it->first < ptr + size; ++it) {
    for (size_t i = 0; i < count; ++i)
      it->second.access[desc[i].location.id] = static_cast<unsigned char>(desc[i].flags);
    apply_access(it->first, it->second);
  }
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location,
                                  CUdeviceptr ptr) {
  FC_ENTER("cuMemGetAccess");
  FC_REQUIRE_INIT();
  if (!flags || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE)
    return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(location->id)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> l(driver().mu);
  // Past a cuMemAlloc block's bytes, in the rest of its granule: no memory,
  // as a freed block's address (measured on an H100: alloc_sizes.cpp
  // ctx_attrs, the forty-seventh session).
  Mapping* m = find_known(ptr, nullptr, nullptr);
  if (!m) return CUDA_ERROR_INVALID_VALUE;
  // A cuMemAlloc block and a legacy IPC open: no VMM access flags, 0
  // (measured as for cuMemSetAccess; their ACCESS_FLAGS pointer attribute
  // is the device's access all the same).
  *flags = driver_block(find_alloc(m->alloc)) ? 0 : m->access[location->id];
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  FC_ENTER("cuMemRetainAllocationHandle");
  FC_REQUIRE_INIT();
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(driver().mu);
  Mapping* m = find_mapping(reinterpret_cast<uintptr_t>(addr), nullptr);
  if (!m) return CUDA_ERROR_INVALID_VALUE;
  Allocation* a = find_alloc(m->alloc);
  if (!a || driver_block(a)) return CUDA_ERROR_INVALID_VALUE;
  ++a->handle_refs;
  *handle = a->id;
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                          CUmemGenericAllocationHandle handle) {
  FC_ENTER("cuMemGetAllocationPropertiesFromHandle");
  FC_REQUIRE_INIT();
  if (!prop) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(driver().mu);
  Allocation* a = find_alloc(handle);
  if (!a || a->handle_refs <= 0 || a->kind == AllocKind::kMulticast)
    return CUDA_ERROR_INVALID_VALUE;
  *prop = a->prop;
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuMemExportToShareableHandle(void* shareableHandle,
                                                CUmemGenericAllocationHandle handle,
                                                CUmemAllocationHandleType handleType,
                                                unsigned long long flags) {
  FC_ENTER("cuMemExportToShareableHandle");
  FC_REQUIRE_INIT();
  if (!shareableHandle || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(driver().mu);
  Allocation* a = find_alloc(handle);
  if (!a || a->handle_refs <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  if (!(a->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    return CUDA_ERROR_INVALID_VALUE;
  if (a->fd < 0) return CUDA_ERROR_INVALID_HANDLE;
  int fd = dup(a->fd);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(shareableHandle) = fd;
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                                  void* osHandle,
                                                  CUmemAllocationHandleType shHandleType) {
  FC_ENTER("cuMemImportFromShareableHandle");
  FC_REQUIRE_INIT();
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  int fd = static_cast<int>(reinterpret_cast<intptr_t>(osHandle));
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(driver().mu);
  uint64_t id = 0;
  bool reused = false;
  if (CUresult r = adopt_allocation(fd, AllocKind::kVmm, &id, &reused)) return r;
  ++find_alloc(id)->handle_refs;
  *handle = id;
  return CUDA_SUCCESS;
}
