// Tracking of multicast objects: their devices, bindings and handles (the
// application's, translated to the driver's once a checkpoint rebuilt them).
// Contract and locks: track.h; state: track_state.h; helpers: track_internal.h.
#include "shim/track.h"

#include "shim/real_driver.h"
#include "shim/track_internal.h"

namespace cusnap::shim::track {

namespace {
/// Set once a checkpoint rebuilt a multicast object: only then do multicast
/// handles need translating (and the lock for it).
std::atomic<bool> g_mc_translated{false};
}  // namespace

CUmemGenericAllocationHandle mc_driver_handle(State& s, CUmemGenericAllocationHandle h) noexcept {
  if (!g_mc_translated.load(std::memory_order_acquire)) return h;
  Lock l(s.mu);
  auto it = s.mc_driver.find(h);
  return it == s.mc_driver.end() ? h : it->second;
}

void note_mc_translation() noexcept {
  g_mc_translated.store(true, std::memory_order_release);
}

void mc_forget(State& s, CUmemGenericAllocationHandle h) noexcept {
  if (s.multicast.erase(h)) maybe_shrink(s.multicast);
  if (s.mc_driver.erase(h)) maybe_shrink(s.mc_driver);
}

// Multicast: records objects, devices, bindings and mappings; member handles
// are translated to the driver's for the bind calls.

CUresult mc_create(decltype(&::cuMulticastCreate) real, CUmemGenericAllocationHandle* mc,
                   const CUmulticastObjectProp* prop) noexcept {
  if (active()) note_sharing_call(state());
  CUresult r = real(mc, prop);
  if (r != CUDA_SUCCESS || !active()) return r;
  try {
    State& s = state();
    Lock l(s.mu);
    proto::MulticastRecord m;
    m.handle = *mc;
    m.size = prop->size;
    m.num_devices = prop->numDevices;
    m.flags = prop->handleTypes;
    s.multicast[*mc] = std::move(m);
  } catch (...) {
  }
  return r;
}

CUresult mc_add_device(decltype(&::cuMulticastAddDevice) real, CUmemGenericAllocationHandle mc,
                       CUdevice dev) noexcept {
  if (active()) note_sharing_call(state());
  CUresult r = real(mc_driver_handle(state(), mc), dev);
  if (r != CUDA_SUCCESS || !active()) return r;
  try {
    State& s = state();
    Lock l(s.mu);
    auto it = s.multicast.find(mc);
    if (it != s.multicast.end()) it->second.devices.push_back(dev);
  } catch (...) {
  }
  return r;
}

CUresult mc_bind_mem(PfnBindMemV1 v1, PfnBindMemV2 v2, CUmemGenericAllocationHandle mc,
                     CUdevice dev, size_t mc_offset, CUmemGenericAllocationHandle mem,
                     size_t mem_offset, size_t size, unsigned long long flags) noexcept {
  const CUmemGenericAllocationHandle mcd = mc_driver_handle(state(), mc);
  auto call = [&](CUmemGenericAllocationHandle m) {
    return v2 ? v2(mcd, dev, mc_offset, m, mem_offset, size, flags)
              : v1(mcd, mc_offset, m, mem_offset, size, flags);
  };
  if (!is_logical(mem) && !tracking_on()) return call(mem);
  if (!active()) return is_logical(mem) ? CUDA_ERROR_INVALID_HANDLE : call(mem);
  State& s = state();
  try {
    uint64_t id = 0;
    int32_t member_dev = -1;
    CUmemGenericAllocationHandle d = mem;
    if (is_logical(mem)) {
      Lock l(s.mu);
      auto it = s.handles.find(mem);
      if (it == s.handles.end()) return CUDA_ERROR_INVALID_HANDLE;
      id = it->second;
      d = s.allocs[id].driver;
      member_dev = s.allocs[id].device;
    } else if (CUmemAllocationProp p{};
               !v2 && REAL(cuMemGetAllocationPropertiesFromHandle)(&p, d) == CUDA_SUCCESS) {
      member_dev = p.location.id;
    }
    CUresult r = call(d);
    if (r != CUDA_SUCCESS) return r;
    Lock l(s.mu);
    auto it = s.multicast.find(mc);
    if (it != s.multicast.end()) {
      proto::McBindingRecord b;
      // The v1 ABI binds on the member's own device.
      b.device = v2 ? dev : member_dev;
      b.abi = v2 ? 2 : 1;
      b.mc_offset = mc_offset;
      b.allocation = id;
      b.mem_offset = mem_offset;
      b.size = size;
      it->second.bindings.push_back(b);
    }
    return CUDA_SUCCESS;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

CUresult mc_bind_addr(PfnBindAddrV1 v1, PfnBindAddrV2 v2, CUmemGenericAllocationHandle mc,
                      CUdevice dev, size_t mc_offset, CUdeviceptr ptr, size_t size,
                      unsigned long long flags) noexcept {
  const CUmemGenericAllocationHandle mcd = mc_driver_handle(state(), mc);
  CUresult r =
      v2 ? v2(mcd, dev, mc_offset, ptr, size, flags) : v1(mcd, mc_offset, ptr, size, flags);
  if (r != CUDA_SUCCESS || !active()) return r;
  try {
    State& s = state();
    Lock l(s.mu);
    auto it = s.multicast.find(mc);
    if (it != s.multicast.end()) {
      proto::McBindingRecord b;
      b.device = v2 ? dev : -1;
      b.abi = v2 ? 2 : 1;
      b.mc_offset = mc_offset;
      b.address = ptr;
      b.size = size;
      auto m = containing(s, ptr);
      if (m != s.ranges.end()) {
        b.allocation = m->second.alloc;
        auto a = s.allocs.find(b.allocation);
        if (!v2 && a != s.allocs.end()) b.device = a->second.device;
      }
      it->second.bindings.push_back(b);
    }
  } catch (...) {
  }
  return r;
}

CUresult mc_unbind(decltype(&::cuMulticastUnbind) real, CUmemGenericAllocationHandle mc,
                   CUdevice dev, size_t mc_offset, size_t size) noexcept {
  CUresult r = real(mc_driver_handle(state(), mc), dev, mc_offset, size);
  if (r != CUDA_SUCCESS || !active()) return r;
  State& s = state();
  Lock l(s.mu);
  auto it = s.multicast.find(mc);
  if (it != s.multicast.end()) {
    auto& v = it->second.bindings;
    for (auto b = v.begin(); b != v.end();)
      if (b->mc_offset == mc_offset && (b->device == dev || b->device == -1))
        b = v.erase(b);
      else
        ++b;
  }
  return r;
}

}  // namespace cusnap::shim::track
