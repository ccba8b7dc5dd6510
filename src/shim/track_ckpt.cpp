// The checkpoint of shared memory, shim side (docs/shim.md "Checkpoint").
//
// The coordinator drives these over the control socket while the gate is
// closed, so no application thread is inside the driver or can enter it; they
// run on the control listener's thread and call the real driver directly.
//   drain      every context this process uses finishes its device work
//   save       the bytes of one allocation created here go into a file
//   release    imported allocations (then, in a second round, the created
//              ones that were saved) are unmapped and released; the address
//              reservations, logical handles and records stay
//   load       a released created allocation is created again with its
//              properties, filled from its file, mapped at every recorded
//              address with the recorded access, and exported again
//   reimport   every released imported allocation is imported again from its
//              creator (peer socket) and mapped as before
// After load and reimport the records equal those before release, so the
// coordinator's final inspection can compare them. Multicast objects (torn
// down by release, built again by reimport): track_ckpt_multicast.cpp.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include "shim/captures.h"
#include "shim/fork_table.h"
#include "shim/real_driver.h"
#include "shim/track_ckpt_internal.h"
#include "shim/track_copy.h"
#include "shim/track_internal.h"
#include "shim/track_state.h"

namespace cusnap::shim::track {

proto::Done ok_done(uint64_t bytes) {
  proto::Done d;
  d.ok = true;
  d.bytes = bytes;
  return d;
}

proto::Done fail(const std::string& what, int32_t code) {
  proto::Done d;
  d.error = what;
  d.code = code;
  return d;
}

namespace {

/// A second, private mapping of an allocation with read-write access for its
/// device, for the bulk copies; unmapped and unreserved by the destructor.
class TempMapping {
 public:
  CUresult map(CUmemGenericAllocationHandle h, uint64_t size, int32_t dev, std::string* err) {
    size_ = size;
    CUresult r = REAL(cuMemAddressReserve)(&va_, size, 0, 0, 0);
    if (r != CUDA_SUCCESS) {
      va_ = 0;
      *err = driver_error("cuMemAddressReserve", r);
      return r;
    }
    if ((r = REAL(cuMemMap)(va_, size, 0, h, 0)) != CUDA_SUCCESS) {
      *err = driver_error("cuMemMap", r);
      return r;
    }
    mapped_ = true;
    CUmemAccessDesc d{};
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = dev;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if ((r = REAL(cuMemSetAccess)(va_, size, &d, 1)) != CUDA_SUCCESS)
      *err = driver_error("cuMemSetAccess", r);
    return r;
  }
  ~TempMapping() {
    if (mapped_) REAL(cuMemUnmap)(va_, size_);
    if (va_) REAL(cuMemAddressFree)(va_, size_);
  }
  CUdeviceptr address() const { return va_; }

 private:
  CUdeviceptr va_ = 0;
  uint64_t size_ = 0;
  bool mapped_ = false;
};

/// The mappings of allocation id (s.mu held).
std::vector<RangeCopy> ranges_of(const State& s, uint64_t id) {
  std::vector<RangeCopy> out;
  for (auto& [addr, m] : s.ranges)
    if (m.alloc == id) out.push_back({addr, m.size, m.offset, m.access});
  return out;
}

/// Releases the driver handle a half-finished release left behind.
void drop_driver_handle(State& s, uint64_t id, CUmemGenericAllocationHandle d) {
  REAL(cuMemRelease)(d);
  Lock l(s.mu);
  auto it = s.allocs.find(id);
  if (it != s.allocs.end()) it->second.driver_held = false;
}

/// A copy of allocation id, which must have been created here, and its ranges.
bool created_here(State& s, uint64_t id, Alloc* a, std::vector<RangeCopy>* ranges,
                  std::string* err) {
  Lock l(s.mu);
  auto it = s.allocs.find(id);
  if (it == s.allocs.end()) {
    *err = "no allocation " + std::to_string(id);
    return false;
  }
  *a = it->second;
  if (a->origin != Alloc::Origin::kCreated) {
    *err = "allocation " + std::to_string(id) + " was not created here";
    return false;
  }
  *ranges = ranges_of(s, id);
  return true;
}

/// A driver handle for allocation a (its own, or a retained one when the
/// application released every handle and only mappings keep it).
CUresult handle_of(const Alloc& a, const std::vector<RangeCopy>& ranges,
                   CUmemGenericAllocationHandle* h, bool* temporary, std::string* err) {
  *temporary = false;
  if (a.driver_held) {
    *h = a.driver;
    return CUDA_SUCCESS;
  }
  if (ranges.empty()) {
    *err = "no handle and no mapping left";
    return CUDA_ERROR_INVALID_HANDLE;
  }
  CUresult r = REAL(cuMemRetainAllocationHandle)(
      h, reinterpret_cast<void*>(static_cast<uintptr_t>(ranges.front().address)));
  if (r != CUDA_SUCCESS) *err = driver_error("cuMemRetainAllocationHandle", r);
  *temporary = r == CUDA_SUCCESS;
  return r;
}

}  // namespace

std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

CUresult map_ranges(CUmemGenericAllocationHandle d, const std::vector<RangeCopy>& ranges,
                    std::string* err) {
  size_t done = 0;
  CUresult r = CUDA_SUCCESS;
  for (; done < ranges.size(); ++done) {
    const RangeCopy& m = ranges[done];
    if ((r = REAL(cuMemMap)(m.address, m.size, m.offset, d, 0)) != CUDA_SUCCESS) {
      *err = driver_error("cuMemMap", r) + " at " + hex(m.address);
      break;
    }
    std::vector<CUmemAccessDesc> desc;
    for (auto& a : m.access) {
      if (a.flags == 0) continue;
      CUmemAccessDesc x{};
      x.location.type = static_cast<CUmemLocationType>(a.type);
      x.location.id = a.id;
      x.flags = static_cast<CUmemAccess_flags>(a.flags);
      desc.push_back(x);
    }
    if (!desc.empty() &&
        (r = REAL(cuMemSetAccess)(m.address, m.size, desc.data(), desc.size())) != CUDA_SUCCESS) {
      *err = driver_error("cuMemSetAccess", r);
      REAL(cuMemUnmap)(m.address, m.size);
      break;
    }
  }
  if (r != CUDA_SUCCESS)
    for (size_t i = 0; i < done; ++i) REAL(cuMemUnmap)(ranges[i].address, ranges[i].size);
  return r;
}

std::string driver_error(const char* call, CUresult r) {
  const char* name = nullptr;
  if (auto f = REAL(cuGetErrorName)) f(r, &name);
  return std::string(call) + " failed: " + (name ? name : "CUDA error " + std::to_string(r));
}

proto::Done drain(State& s, const std::function<bool()>& go_on) noexcept {
  try {
    // Checked before each synchronize: a drain given up on (the gate open
    // again) must not synchronize the running application's contexts.
    auto given_up = [&] { return go_on && !go_on(); };
    const char* kGivenUp = "the drain was given up (the gate opened)";
    // Synchronizing a context while one of its streams captures fails and
    // invalidates the capture (captures.h): the workload's graph would be
    // lost. Refused instead, with EBUSY: the coordinator opens the gates so
    // that the capture can end, and tries again (shared_prepare).
    if (captures::any())
      return fail(
          "a CUDA stream capture (a CUDA graph being recorded) is under way in this process; "
          "synchronizing its device now would invalidate it, so the device work is not drained: "
          "try again once the capture has ended",
          EBUSY);
    std::set<CUcontext> contexts;
    {
      Lock l(s.mu);
      for (auto& o : s.ipc)
        if (o.ctx) contexts.insert(o.ctx);
      contexts.insert(s.contexts.begin(), s.contexts.end());
    }
    int n = 0;
    if (auto count = REAL(cuDeviceGetCount); !count || count(&n) != CUDA_SUCCESS) n = 0;
    auto state_of = REAL(cuDevicePrimaryCtxGetState);
    auto sync = REAL(cuCtxSynchronize);
    if (!sync) return fail("the driver has no cuCtxSynchronize");
    for (int dev = 0; dev < n; ++dev) {
      unsigned int flags = 0;
      int active = 0;
      if (!state_of || state_of(dev, &flags, &active) != CUDA_SUCCESS || !active) continue;
      if (given_up()) return fail(kGivenUp, ECANCELED);
      DeviceContext ctx(dev);
      if (ctx.result() != CUDA_SUCCESS)
        return fail("device " + std::to_string(dev) + ": " +
                    driver_error("cuDevicePrimaryCtxRetain", ctx.result()));
      if (CUresult r = sync(); r != CUDA_SUCCESS)
        return fail("device " + std::to_string(dev) + ": " + driver_error("cuCtxSynchronize", r));
    }
    auto set = REAL(cuCtxSetCurrent);
    for (CUcontext c : contexts) {
      if (given_up()) return fail(kGivenUp, ECANCELED);
      if (!set || set(c) != CUDA_SUCCESS) continue;  // a context destroyed since
      CUresult r = sync();
      set(nullptr);
      if (r != CUDA_SUCCESS) return fail(driver_error("cuCtxSynchronize", r));
    }
    // The device work is done: the blocks freed in stream order are free
    // now, and go before the records are listed and saved (a deferred free
    // synchronizes its device: not once the drain was given up).
    if (given_up()) return fail(kGivenUp, ECANCELED);
    settle_frees(s);
    return ok_done();
  } catch (...) {
    return fail("out of memory");
  }
}

proto::Done save_allocation(State& s, uint64_t id, const std::vector<int>& fds) noexcept {
  try {
    Alloc a;
    std::vector<RangeCopy> ranges;
    std::string err;
    if (!created_here(s, id, &a, &ranges, &err)) return fail(err);
    if (a.released) return fail("allocation " + std::to_string(id) + " is released");
    DeviceContext ctx(a.device);
    if (ctx.result() != CUDA_SUCCESS)
      return fail(driver_error("cuDevicePrimaryCtxRetain", ctx.result()));
    CUmemGenericAllocationHandle h = 0;
    bool temporary = false;
    if (handle_of(a, ranges, &h, &temporary, &err) != CUDA_SUCCESS) return fail(err);
    CUresult r;
    {
      TempMapping tm;
      r = tm.map(h, a.size, a.device, &err);
      if (r == CUDA_SUCCESS) r = copy_to_fds(tm.address(), a.size, fds, &err);
    }
    if (temporary) REAL(cuMemRelease)(h);
    if (r != CUDA_SUCCESS) return fail("allocation " + std::to_string(id) + ": " + err);
    for (int fd : fds)
      if (::fsync(fd) != 0 && errno != EINVAL && errno != EROFS)
        return fail(std::string("fsync of the saved bytes: ") + std::strerror(errno));
    Lock l(s.mu);
    auto it = s.allocs.find(id);
    if (it != s.allocs.end()) it->second.saved = true;
    return ok_done(a.size);
  } catch (...) {
    return fail("out of memory");
  }
}

bool shared_released(State& s) noexcept {
  Lock l(s.mu);
  if (s.mc_released && !s.multicast.empty()) return true;
  for (const auto& [id, a] : s.allocs)
    if (a.released) return true;
  return false;
}

proto::Done release_shared(State& s, const std::string& origin) noexcept {
  try {
    const bool imported = origin == "imported";
    if (!imported && origin != "created") return fail("unknown origin '" + origin + "'");
    // Multicast objects go before the created memory bound into them.
    if (!imported) {
      proto::Done d = teardown_multicast(s);
      if (!d.ok) return d;
    }
    struct Work {
      uint64_t id;
      CUmemGenericAllocationHandle driver;
      bool held;
      std::vector<RangeCopy> ranges;
    };
    std::vector<Work> work;
    {
      Lock l(s.mu);
      for (auto& [id, a] : s.allocs) {
        if (a.released) continue;
        if (imported ? a.origin != Alloc::Origin::kImported
                     : (a.origin != Alloc::Origin::kCreated || !a.saved))
          continue;
        work.push_back({id, a.driver, a.driver_held, ranges_of(s, id)});
        // Marked first: a failure half way leaves it for load/reimport to finish.
        a.released = true;
        a.held_before = a.driver_held;
      }
    }
    for (const Work& w : work) {
      for (const RangeCopy& m : w.ranges)
        if (CUresult r = REAL(cuMemUnmap)(m.address, m.size); r != CUDA_SUCCESS)
          return fail("allocation " + std::to_string(w.id) + ": " + driver_error("cuMemUnmap", r));
      if (w.held)
        if (CUresult r = REAL(cuMemRelease)(w.driver); r != CUDA_SUCCESS)
          return fail("allocation " + std::to_string(w.id) + ": " +
                      driver_error("cuMemRelease", r));
      ListedFd cached;  // out of the cache into the fork table, then closed
      {
        Lock l(s.mu);
        auto it = s.allocs.find(w.id);
        if (it != s.allocs.end()) it->second.driver_held = false;
        Lock c(s.cache_mu);
        auto ci = s.cache.find(w.id);
        if (ci != s.cache.end()) {
          cached = list_held(ci->second);
          s.cache.erase(ci);
          s.cache_meta.erase(w.id);
        }
      }
      cached.reset();
    }
    return ok_done();
  } catch (...) {
    return fail("out of memory");
  }
}

proto::Done load_allocation(State& s, uint64_t id, const std::vector<int>& fds) noexcept {
  try {
    Alloc a;
    std::vector<RangeCopy> ranges;
    std::string err;
    if (!created_here(s, id, &a, &ranges, &err)) return fail(err);
    if (!a.released) return ok_done(a.size);  // loaded already (a repeated rebuild)
    DeviceContext ctx(a.device);
    if (ctx.result() != CUDA_SUCCESS)
      return fail(driver_error("cuDevicePrimaryCtxRetain", ctx.result()));
    // What a release that stopped half way left goes first: its mappings and
    // its driver handle (the bytes come back from the saved copy).
    for (const RangeCopy& m : ranges) REAL(cuMemUnmap)(m.address, m.size);
    if (a.driver_held) drop_driver_handle(s, id, a.driver);
    CUmemGenericAllocationHandle d = 0;
    CUresult r = REAL(cuMemCreate)(&d, a.size, &a.prop, 0);
    if (r != CUDA_SUCCESS)
      return fail("allocation " + std::to_string(id) + ": " + driver_error("cuMemCreate", r));
    {
      TempMapping tm;
      r = tm.map(d, a.size, a.device, &err);
      if (r == CUDA_SUCCESS) r = copy_from_fds(fds, tm.address(), a.size, &err);
    }
    if (r == CUDA_SUCCESS) r = map_ranges(d, ranges, &err);
    int exported = -1;
    if (r == CUDA_SUCCESS && a.exported) {
      r = REAL(cuMemExportToShareableHandle)(&exported, d, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                             0);
      if (r != CUDA_SUCCESS) {
        err = driver_error("cuMemExportToShareableHandle", r);
        for (const RangeCopy& m : ranges) REAL(cuMemUnmap)(m.address, m.size);
      }
    }
    // In the fork table until it enters the cache, at a high number; the one
    // it replaces leaves the cache into the table until it is closed.
    ListedFd listed, replaced;
    if (exported >= 0) list_new(exported, &listed);
    if (r != CUDA_SUCCESS) {
      REAL(cuMemRelease)(d);
      return fail("allocation " + std::to_string(id) + ": " + err);
    }
    bool keep = true;
    {
      Lock l(s.mu);
      auto it = s.allocs.find(id);
      if (it != s.allocs.end()) {
        Alloc& x = it->second;
        x.driver = d;
        x.released = false;
        x.saved = false;
        x.driver_held = x.held_before;
        x.generation++;
        keep = x.held_before;
        if (listed.ours()) {
          // The new allocation's descriptor replaces whatever a release that
          // stopped half way left in the cache: importers must get this one.
          Lock c(s.cache_mu);
          auto [it, inserted] = s.cache.try_emplace(id, HeldFd::of(listed.get()));
          if (!inserted) {
            replaced = list_held(it->second);
            it->second = HeldFd::of(listed.get());
          }
          listed.release();  // the cache's now
          s.cache_meta[id] = {x.generation, x.size};
        }
      }
    }
    replaced.reset();
    listed.reset();
    // Only mappings held it before: they hold it again.
    if (!keep) REAL(cuMemRelease)(d);
    return ok_done(a.size);
  } catch (...) {
    return fail("out of memory");
  }
}

proto::Done reimport_shared(State& s) noexcept {
  try {
    std::vector<std::pair<uint64_t, Alloc>> work;
    {
      Lock l(s.mu);
      for (auto& [id, a] : s.allocs)
        if (a.released && a.origin == Alloc::Origin::kImported) work.emplace_back(id, a);
    }
    for (auto& [id, a] : work) {
      std::vector<RangeCopy> ranges;
      {
        Lock l(s.mu);
        ranges = ranges_of(s, id);
      }
      for (const RangeCopy& m : ranges) REAL(cuMemUnmap)(m.address, m.size);
      if (a.driver_held) drop_driver_handle(s, id, a.driver);
      proto::Ticket t{};
      t.creator_pid = a.key.pid;
      t.creator_start = a.key.start;
      t.allocation = a.key.id;
      t.bytes = a.size;
      std::snprintf(t.socket, sizeof(t.socket), "%s",
                    proto::shim_peer_socket(s.runtime_dir, a.key.pid).c_str());
      std::string err;
      uint64_t generation = 0;
      CUmemGenericAllocationHandle d = 0;
      CUresult r = CUDA_ERROR_NOT_SUPPORTED;
      if (!fetch_descriptor(t, &err, &generation, [&](int fd) {
            r = REAL(cuMemImportFromShareableHandle)(
                &d, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
          }))
        return fail("allocation " + std::to_string(id) + " of process " +
                    std::to_string(a.key.pid) + ": fetching its descriptor: " + err);
      if (r != CUDA_SUCCESS)
        return fail("allocation " + std::to_string(id) + ": " +
                    driver_error("cuMemImportFromShareableHandle", r));
      if ((r = map_ranges(d, ranges, &err)) != CUDA_SUCCESS) {
        REAL(cuMemRelease)(d);
        return fail("allocation " + std::to_string(id) + ": " + err);
      }
      bool keep = true;
      {
        Lock l(s.mu);
        auto it = s.allocs.find(id);
        if (it != s.allocs.end()) {
          it->second.driver = d;
          it->second.generation = generation;
          it->second.released = false;
          it->second.driver_held = it->second.held_before;
          keep = it->second.held_before;
        }
      }
      if (!keep) REAL(cuMemRelease)(d);
    }
    return rebuild_multicast(s);
  } catch (...) {
    return fail("out of memory");
  }
}

}  // namespace cusnap::shim::track
