// The checkpoint of multicast objects (track_ckpt.cpp): release_shared tears
// every one down before the created memory bound into it is released, and
// reimport_shared creates them again once all the memory is back, so that
// the application's handles and mappings stay valid.
#include <map>
#include <string>
#include <vector>

#include "shim/real_driver.h"
#include "shim/track_ckpt_internal.h"
#include "shim/track_state.h"

namespace cusnap::shim::track {

namespace {

/// The mappings of multicast object h, by the application's handle (s.mu held).
std::vector<RangeCopy> multicast_ranges_of(const State& s, uint64_t h) {
  std::vector<RangeCopy> out;
  for (auto& [addr, m] : s.ranges)
    if (m.multicast == h) out.push_back({addr, m.size, m.offset, m.access});
  return out;
}

}  // namespace

proto::Done teardown_multicast(State& s) {
  struct Work {
    CUmemGenericAllocationHandle driver;
    proto::MulticastRecord rec;
    std::vector<RangeCopy> maps;
  };
  std::vector<Work> work;
  {
    Lock l(s.mu);
    if (s.mc_released) return ok_done();
    for (auto& [h, rec] : s.multicast) {
      auto t = s.mc_driver.find(h);
      work.push_back({t == s.mc_driver.end() ? h : t->second, rec, multicast_ranges_of(s, h)});
    }
    s.mc_released = true;
  }
  for (const Work& w : work) {
    const std::string who = "multicast object " + hex(w.rec.handle) + ": ";
    DeviceContext ctx(w.rec.devices.empty() ? 0 : w.rec.devices.front());
    for (const RangeCopy& m : w.maps)
      if (CUresult r = REAL(cuMemUnmap)(m.address, m.size); r != CUDA_SUCCESS)
        return fail(who + driver_error("cuMemUnmap", r));
    for (const auto& b : w.rec.bindings) {
      const int32_t dev = b.device < 0 ? 0 : b.device;
      DeviceContext bind_ctx(dev);
      if (CUresult r = REAL(cuMulticastUnbind)(w.driver, dev, b.mc_offset, b.size);
          r != CUDA_SUCCESS)
        return fail(who + driver_error("cuMulticastUnbind", r));
    }
    if (CUresult r = REAL(cuMemRelease)(w.driver); r != CUDA_SUCCESS)
      return fail(who + driver_error("cuMemRelease", r));
  }
  return ok_done();
}

proto::Done rebuild_multicast(State& s) {
  std::vector<proto::MulticastRecord> recs;
  std::map<uint64_t, std::vector<RangeCopy>> maps;
  std::map<uint64_t, CUmemGenericAllocationHandle> members;
  {
    Lock l(s.mu);
    if (!s.mc_released) return ok_done();
    for (auto& [h, rec] : s.multicast) {
      recs.push_back(rec);
      maps[h] = multicast_ranges_of(s, h);
      for (auto& b : rec.bindings) {
        auto a = s.allocs.find(b.allocation);
        if (b.address == 0 && a != s.allocs.end()) members[b.allocation] = a->second.driver;
      }
    }
  }
  auto bind_mem_v1 = REAL(cuMulticastBindMem);
  auto bind_mem_v2 = REAL(cuMulticastBindMem_v2);
  auto bind_addr_v1 = REAL(cuMulticastBindAddr);
  auto bind_addr_v2 = REAL(cuMulticastBindAddr_v2);
  for (const auto& rec : recs) {
    const std::string who = "multicast object " + hex(rec.handle) + ": ";
    DeviceContext ctx(rec.devices.empty() ? 0 : rec.devices.front());
    CUmulticastObjectProp prop{};
    prop.numDevices = rec.num_devices;
    prop.size = rec.size;
    prop.handleTypes = rec.flags;
    CUmemGenericAllocationHandle mc = 0;
    if (CUresult r = REAL(cuMulticastCreate)(&mc, &prop); r != CUDA_SUCCESS)
      return fail(who + driver_error("cuMulticastCreate", r));
    for (int32_t dev : rec.devices)
      if (CUresult r = REAL(cuMulticastAddDevice)(mc, dev); r != CUDA_SUCCESS)
        return fail(who + driver_error("cuMulticastAddDevice", r));
    for (const auto& b : rec.bindings) {
      // The 13.0 ABI binds on the current context's device: the member's.
      DeviceContext bind_ctx(b.device < 0 ? 0 : b.device);
      CUresult r;
      if (b.address == 0) {
        auto m = members.find(b.allocation);
        if (m == members.end()) return fail(who + "a bound allocation is gone");
        r = b.abi == 2
                ? (bind_mem_v2
                       ? bind_mem_v2(mc, b.device, b.mc_offset, m->second, b.mem_offset, b.size, 0)
                       : CUDA_ERROR_NOT_SUPPORTED)
                : bind_mem_v1(mc, b.mc_offset, m->second, b.mem_offset, b.size, 0);
      } else {
        r = b.abi == 2
                ? (bind_addr_v2 ? bind_addr_v2(mc, b.device, b.mc_offset, b.address, b.size, 0)
                                : CUDA_ERROR_NOT_SUPPORTED)
                : bind_addr_v1(mc, b.mc_offset, b.address, b.size, 0);
      }
      if (r != CUDA_SUCCESS) return fail(who + driver_error("cuMulticastBind", r));
    }
    std::string err;
    if (map_ranges(mc, maps[rec.handle], &err) != CUDA_SUCCESS) return fail(who + err);
    Lock l(s.mu);
    if (mc == rec.handle)
      s.mc_driver.erase(rec.handle);
    else
      s.mc_driver[rec.handle] = mc;
  }
  note_mc_translation();
  Lock l(s.mu);
  s.mc_released = false;
  return ok_done();
}

}  // namespace cusnap::shim::track
