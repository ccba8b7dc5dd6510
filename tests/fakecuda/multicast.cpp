// Multicast objects, only when FAKECUDA_MULTICAST=1 (otherwise every call is
// CUDA_ERROR_NOT_SUPPORTED and the device attribute reads 0). A simple model:
// the object is an allocation with its own memfd (mapping its handle maps
// those bytes); devices and bindings are recorded and checked, no data flows
// between the object and bound memory. Unlike a real object's bytes (its
// members'), these do not outlive the object: the shim's teardown and rebuild
// at a checkpoint start them afresh, zero.
#include "gate.h"
#include "memory.h"

using namespace fc;

/// CUDA 13.1 device-explicit bind forms (declared here while headers are 13.0).
FC_EXPORT CUresult cuMulticastBindMem_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
                                         size_t mcOffset, CUmemGenericAllocationHandle memHandle,
                                         size_t memOffset, size_t size, unsigned long long flags);
FC_EXPORT CUresult cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
                                          size_t mcOffset, CUdeviceptr memptr, size_t size,
                                          unsigned long long flags);

namespace {

#define FC_REQUIRE_MULTICAST()                                \
  do {                                                        \
    FC_REQUIRE_INIT();                                        \
    if (!driver().multicast) return CUDA_ERROR_NOT_SUPPORTED; \
  } while (0)

/// Precondition: Driver::mu held.
Allocation* find_mc(uint64_t handle) {
  Allocation* a = find_alloc(handle);
  return (a && a->kind == AllocKind::kMulticast && a->handle_refs > 0) ? a : nullptr;
}

bool has_device(const Allocation& mc, CUdevice dev) {
  for (CUdevice d : mc.mc_devices)
    if (d == dev) return true;
  return false;
}

bool overlaps(const Allocation& mc, CUdevice dev, size_t off, size_t size) {
  for (const McBinding& b : mc.mc_bindings)
    if (b.dev == dev && off < b.mc_offset + b.size && b.mc_offset < off + size) return true;
  return false;
}

/// Checks a bind's common arguments. Precondition: Driver::mu held.
CUresult check_bind(Allocation* mc, CUdevice dev, size_t mc_offset, size_t size,
                    unsigned long long flags) {
  if (!mc) return CUDA_ERROR_INVALID_HANDLE;
  if (flags != 0 || size == 0 || size % kGranularity || mc_offset % kGranularity)
    return CUDA_ERROR_INVALID_VALUE;
  if (mc_offset > mc->size || size > mc->size - mc_offset) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (!has_device(*mc, dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (overlaps(*mc, dev, mc_offset, size)) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

CUresult bind_mem(uint64_t mc_handle, CUdevice dev, size_t mc_offset, uint64_t mem,
                  size_t mem_offset, size_t size, unsigned long long flags) {
  std::lock_guard<std::mutex> l(driver().mu);
  Allocation* mc = find_mc(mc_handle);
  if (CUresult r = check_bind(mc, dev, mc_offset, size, flags)) return r;
  Allocation* a = find_alloc(mem);
  if (!a || a->kind != AllocKind::kVmm || a->handle_refs <= 0) return CUDA_ERROR_INVALID_HANDLE;
  if (mem_offset % kGranularity || mem_offset > a->size || size > a->size - mem_offset)
    return CUDA_ERROR_INVALID_VALUE;
  mc->mc_bindings.push_back(McBinding{dev, mc_offset, mem, 0, mem_offset, size});
  return CUDA_SUCCESS;
}

CUresult bind_addr(uint64_t mc_handle, CUdevice dev, size_t mc_offset, CUdeviceptr ptr, size_t size,
                   unsigned long long flags) {
  std::lock_guard<std::mutex> l(driver().mu);
  Allocation* mc = find_mc(mc_handle);
  if (CUresult r = check_bind(mc, dev, mc_offset, size, flags)) return r;
  if (ptr % kGranularity) return CUDA_ERROR_INVALID_VALUE;
  for (uintptr_t p = ptr; p < ptr + size;) {
    uintptr_t base = 0;
    Mapping* m = find_mapping(p, &base);
    if (!m) return CUDA_ERROR_INVALID_VALUE;
    p = base + m->size;
  }
  mc->mc_bindings.push_back(McBinding{dev, mc_offset, 0, ptr, 0, size});
  return CUDA_SUCCESS;
}

/// The device of the calling thread's context, for the 13.0 bind forms.
CUresult current_device(CUdevice* dev) {
  std::lock_guard<std::mutex> l(driver().mu);
  Context* c = current_ctx();
  if (!valid_ctx(reinterpret_cast<CUcontext>(c))) return CUDA_ERROR_INVALID_CONTEXT;
  *dev = c->dev;
  return CUDA_SUCCESS;
}

}  // namespace

FC_EXPORT CUresult cuMulticastGetGranularity(size_t* granularity, const CUmulticastObjectProp* prop,
                                             CUmulticastGranularity_flags option) {
  FC_ENTER("cuMulticastGetGranularity");
  FC_REQUIRE_MULTICAST();
  if (!granularity || !prop) return CUDA_ERROR_INVALID_VALUE;
  if (option != CU_MULTICAST_GRANULARITY_MINIMUM && option != CU_MULTICAST_GRANULARITY_RECOMMENDED)
    return CUDA_ERROR_INVALID_VALUE;
  *granularity = kGranularity;
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuMulticastCreate(CUmemGenericAllocationHandle* mcHandle,
                                     const CUmulticastObjectProp* prop) {
  FC_ENTER("cuMulticastCreate");
  FC_REQUIRE_MULTICAST();
  if (!mcHandle || !prop || prop->flags != 0 || prop->size == 0 || prop->size % kGranularity)
    return CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  if (prop->numDevices == 0 || prop->numDevices > d.devices.size()) return CUDA_ERROR_INVALID_VALUE;
  if (prop->handleTypes & ~static_cast<unsigned long long>(
                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_FABRIC))
    return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(d.mu);
  uint64_t id = 0;
  if (CUresult r = new_allocation(AllocKind::kMulticast, prop->size, 0, &id)) return r;
  Allocation* a = find_alloc(id);
  a->handle_refs = 1;
  a->mc_num_devices = prop->numDevices;
  a->prop.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(prop->handleTypes);
  *mcHandle = id;
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuMulticastAddDevice(CUmemGenericAllocationHandle mcHandle, CUdevice dev) {
  FC_ENTER("cuMulticastAddDevice");
  FC_REQUIRE_MULTICAST();
  std::lock_guard<std::mutex> l(driver().mu);
  Allocation* mc = find_mc(mcHandle);
  if (!mc) return CUDA_ERROR_INVALID_HANDLE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (has_device(*mc, dev) || mc->mc_devices.size() >= mc->mc_num_devices)
    return CUDA_ERROR_INVALID_VALUE;
  mc->mc_devices.push_back(dev);
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
                                      CUmemGenericAllocationHandle memHandle, size_t memOffset,
                                      size_t size, unsigned long long flags) {
  FC_ENTER("cuMulticastBindMem");
  FC_REQUIRE_MULTICAST();
  CUdevice dev = 0;
  if (CUresult r = current_device(&dev)) return r;
  return bind_mem(mcHandle, dev, mcOffset, memHandle, memOffset, size, flags);
}

FC_EXPORT CUresult cuMulticastBindMem_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
                                         size_t mcOffset, CUmemGenericAllocationHandle memHandle,
                                         size_t memOffset, size_t size, unsigned long long flags) {
  FC_ENTER("cuMulticastBindMem");
  FC_REQUIRE_MULTICAST();
  return bind_mem(mcHandle, dev, mcOffset, memHandle, memOffset, size, flags);
}

FC_EXPORT CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
                                       CUdeviceptr memptr, size_t size, unsigned long long flags) {
  FC_ENTER("cuMulticastBindAddr");
  FC_REQUIRE_MULTICAST();
  CUdevice dev = 0;
  if (CUresult r = current_device(&dev)) return r;
  return bind_addr(mcHandle, dev, mcOffset, memptr, size, flags);
}

FC_EXPORT CUresult cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
                                          size_t mcOffset, CUdeviceptr memptr, size_t size,
                                          unsigned long long flags) {
  FC_ENTER("cuMulticastBindAddr");
  FC_REQUIRE_MULTICAST();
  return bind_addr(mcHandle, dev, mcOffset, memptr, size, flags);
}

FC_EXPORT CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
                                     size_t mcOffset, size_t size) {
  FC_ENTER("cuMulticastUnbind");
  FC_REQUIRE_MULTICAST();
  std::lock_guard<std::mutex> l(driver().mu);
  Allocation* mc = find_mc(mcHandle);
  if (!mc) return CUDA_ERROR_INVALID_HANDLE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  auto& bs = mc->mc_bindings;
  for (auto it = bs.begin(); it != bs.end(); ++it) {
    if (it->dev == dev && it->mc_offset == mcOffset && it->size == size) {
      bs.erase(it);
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_VALUE;
}
