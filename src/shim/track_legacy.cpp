// Tracking of legacy allocations and IPC: cuMemAlloc/cuMemFree served by
// exportable VMM allocations, cuIpcGetMemHandle/OpenMemHandle/CloseMemHandle.
// Contract and locks: track.h; state: track_state.h; helpers: track_internal.h.
#include "shim/track.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "shim/captures.h"
#include "shim/real_driver.h"
#include "shim/track_internal.h"

namespace cusnap::shim::track {

// Legacy IPC. While tracking is active, cuMemAlloc is served by an exportable
// allocation (POSIX-fd handle type) mapped at a reserved address, so an IPC
// handle can name the allocation and an opener can import it through the
// creator's peer socket and map it at an address of its own reservation.

namespace {

/// During a capture, cuMemAlloc and cuMemFree fail STREAM_CAPTURE_UNSUPPORTED
/// and invalidate the capture in GLOBAL and THREAD_LOCAL mode, while the calls
/// that serve and release a block here are allowed in every mode
/// (capture-sync-h200.log). The driver's own answer decides: a small
/// allocation of its own, freed at once (both are allowed or refused
/// together). CUDA_SUCCESS when they are allowed.
CUresult capture_allows_alloc() noexcept {
  auto alloc = REAL(cuMemAlloc_v2);
  auto free_real = REAL(cuMemFree_v2);
  if (!alloc || !free_real) return CUDA_SUCCESS;
  CUdeviceptr probe = 0;
  if (CUresult r = alloc(&probe, 1); r != CUDA_SUCCESS) return r;
  free_real(probe);
  return CUDA_SUCCESS;
}

}  // namespace

CUresult mem_alloc(decltype(&::cuMemAlloc_v2) real, CUdeviceptr* dptr, size_t bytes) noexcept {
  if (!active() || !legacy_vmm()) return real(dptr, bytes);
  if (!dptr || bytes == 0) return real(dptr, bytes);
  if (captures::any())
    if (CUresult r = capture_allows_alloc(); r != CUDA_SUCCESS) return r;
  CUdevice dev = 0;
  auto get_dev = REAL(cuCtxGetDevice);
  auto gran = REAL(cuMemGetAllocationGranularity);
  auto create = REAL(cuMemCreate);
  auto reserve = REAL(cuMemAddressReserve);
  auto map = REAL(cuMemMap);
  auto access = REAL(cuMemSetAccess);
  auto unmap = REAL(cuMemUnmap);
  auto release = REAL(cuMemRelease);
  auto addr_free = REAL(cuMemAddressFree);
  if (!get_dev || !gran || !create || !reserve || !map || !access || !unmap || !release ||
      !addr_free)
    return real(dptr, bytes);
  CUresult r = get_dev(&dev);
  if (r != CUDA_SUCCESS) return r;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t g = 0;
  if (gran(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || g == 0)
    return real(dptr, bytes);
  const size_t size = (bytes + g - 1) / g * g;
  CUmemGenericAllocationHandle d = 0;
  if ((r = create(&d, size, &prop, 0)) != CUDA_SUCCESS) return r;
  CUdeviceptr addr = 0;
  if ((r = reserve(&addr, size, 0, 0, 0)) != CUDA_SUCCESS) {
    release(d);
    return r;
  }
  CUmemAccessDesc desc{};
  desc.location = prop.location;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if ((r = map(addr, size, 0, d, 0)) != CUDA_SUCCESS) {
    addr_free(addr, size);
    release(d);
    return r;
  }
  if ((r = access(addr, size, &desc, 1)) != CUDA_SUCCESS) {
    unmap(addr, size);
    addr_free(addr, size);
    release(d);
    return r;
  }
  State& s = state();
  try {
    Lock l(s.mu);
    uint64_t id = add_created(s, d, size, prop);
    Alloc& a = s.allocs[id];
    a.legacy = true;
    a.pins = 1;
    a.mappings = 1;
    Mapping m;
    m.size = size;
    m.alloc = id;
    union_access(&m.access, desc);
    s.ranges.emplace(addr, std::move(m));
    s.legacy_blocks.emplace(addr, id);
  } catch (...) {
    unmap(addr, size);
    addr_free(addr, size);
    release(d);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  // Devices with peer access to this one reach the block as they would the driver's.
  try {
    r = grant_peers(s, addr);
  } catch (...) {
    r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (r != CUDA_SUCCESS) {
    mem_free(REAL(cuMemFree_v2), addr);
    return r;
  }
  *dptr = addr;
  return CUDA_SUCCESS;
}

namespace {

/// cuMemFree of a block: the driver's for one that is not the shim's.
CUresult free_block(State& s, decltype(&::cuMemFree_v2) real, CUdeviceptr dptr) {
  uint64_t id = 0, size = 0;
  std::vector<CUmemGenericAllocationHandle> rel;
  std::vector<ListedFd> fds;
  bool ours = false;
  {
    Lock l(s.mu);
    auto b = s.legacy_blocks.find(dptr);
    if (b != s.legacy_blocks.end()) {
      ours = true;
      id = b->second;
      s.legacy_blocks.erase(b);
      maybe_shrink(s.legacy_blocks);
      auto m = s.ranges.find(dptr);
      if (m != s.ranges.end()) {
        size = m->second.size;
        s.ranges.erase(m);
      }
    }
  }
  if (!ours) return real(dptr);
  // cuMemFree synchronizes with the device before the memory goes.
  if (auto sync = REAL(cuCtxSynchronize)) sync();
  REAL(cuMemUnmap)(dptr, size);
  REAL(cuMemAddressFree)(dptr, size);
  {
    Lock l(s.mu);
    auto a = s.allocs.find(id);
    if (a != s.allocs.end()) {
      if (a->second.mappings) a->second.mappings--;
      if (a->second.pins) a->second.pins--;
      settle(s, id, &rel, &fds);
    }
  }
  finish(rel, &fds);
  return CUDA_SUCCESS;
}

}  // namespace

CUresult mem_free(decltype(&::cuMemFree_v2) real, CUdeviceptr dptr) noexcept {
  const NoCancel no_cancel;  // closes the export cache's descriptor (track_internal.h)
  if (!tracking_on() || !active()) return real(dptr);
  // The tables grow and shrink here (allocation): never an exception out.
  try {
    State& s = state();
    // A free synchronizes the context first, as cuMemFree does; during a
    // capture that would fail and invalidate the capture (captures.h), so
    // the block stays until the first free after the capture, where the
    // capture's mode allows a free at all.
    if (captures::any()) {
      bool ours = false;
      {
        Lock l(s.mu);
        ours = s.legacy_blocks.count(dptr) > 0;
      }
      if (ours)
        if (CUresult r = capture_allows_alloc(); r != CUDA_SUCCESS) return r;
      {
        Lock l(s.mu);
        if (s.legacy_blocks.count(dptr)) {
          auto& d = s.deferred_frees;
          if (std::find(d.begin(), d.end(), dptr) != d.end()) return CUDA_ERROR_INVALID_VALUE;
          d.push_back(dptr);
          return CUDA_SUCCESS;
        }
      }
      return real(dptr);
    }
    std::vector<uint64_t> deferred;
    {
      Lock l(s.mu);
      deferred.swap(s.deferred_frees);
    }
    for (uint64_t p : deferred) free_block(s, real, p);
    return free_block(s, real, dptr);
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

CUresult ipc_get(decltype(&::cuIpcGetMemHandle) real, CUipcMemHandle* h,
                 CUdeviceptr dptr) noexcept {
  const NoCancel no_cancel;  // close (track_internal.h)
  if (!active()) return real(h, dptr);
  if (!h) return CUDA_ERROR_INVALID_VALUE;
  State& s = state();
  try {
    uint64_t id;
    Alloc a;
    {
      Lock l(s.mu);
      auto m = containing(s, dptr);
      if (m == s.ranges.end() || !s.legacy_blocks.count(m->first)) return real(h, dptr);
      id = m->second.alloc;
      a = s.allocs[id];
    }
    note_sharing_call(s);
    if (CUresult r = ensure_cached(s, id, a.driver); r != CUDA_SUCCESS) return r;
    proto::IpcHandleBlob b{};
    std::memcpy(b.magic, proto::kIpcMagic, sizeof(b.magic));
    b.creator_pid = a.key.pid;
    b.creator_start = a.key.start;
    b.allocation = a.key.id;
    b.size = a.size;
    static_assert(sizeof(b) == sizeof(CUipcMemHandle));
    std::memcpy(h, &b, sizeof(b));
    return CUDA_SUCCESS;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

CUresult ipc_open(decltype(&::cuIpcOpenMemHandle_v2) real, CUdeviceptr* dptr, CUipcMemHandle h,
                  unsigned int flags) noexcept {
  const NoCancel no_cancel;  // the fetch, close, log (track_internal.h)
  if (!active()) return real(dptr, h, flags);
  if (!dptr) return CUDA_ERROR_INVALID_VALUE;
  proto::IpcHandleBlob b;
  std::memcpy(&b, &h, sizeof(b));
  State& s = state();
  note_sharing_call(s);
  try {
    if (std::memcmp(b.magic, proto::kIpcMagic, sizeof(b.magic)) != 0) {
      CUresult r = real(dptr, h, flags);
      if (r == CUDA_SUCCESS) {
        Lock l(s.mu);
        s.foreign_total++;
        s.foreign_alive++;
        s.ipc.push_back({nullptr, 0, *dptr, 0, 1});
      }
      return r;
    }
    if (b.creator_pid == s.pid && b.creator_start == s.start_time)
      return CUDA_ERROR_INVALID_CONTEXT;
    if (b.creator_pid <= 0 || b.allocation == 0 || b.size == 0) return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx = nullptr;
    CUdevice dev = 0;
    if (CUresult r = REAL(cuCtxGetCurrent)(&ctx); r != CUDA_SUCCESS) return r;
    if (CUresult r = REAL(cuCtxGetDevice)(&dev); r != CUDA_SUCCESS) return r;
    AllocKey key{b.creator_pid, b.creator_start, b.allocation};
    {
      Lock l(s.mu);
      auto k = s.by_key.find(key);
      if (k != s.by_key.end())
        for (auto& o : s.ipc)
          if (o.ctx == ctx && o.alloc == k->second) {
            o.opens++;
            *dptr = o.address;
            return CUDA_SUCCESS;
          }
    }
    proto::Ticket t{};
    t.creator_pid = b.creator_pid;
    t.creator_start = b.creator_start;
    t.allocation = b.allocation;
    t.bytes = b.size;
    std::snprintf(t.socket, sizeof(t.socket), "%s", peer_socket_of(s, key).c_str());
    uint64_t id = 0;
    if (CUresult r = import_ticket(s, t, true, &id); r != CUDA_SUCCESS) return r;
    CUmemGenericAllocationHandle d;
    {
      Lock l(s.mu);
      d = s.allocs[id].driver;
    }
    CUdeviceptr addr = 0;
    CUmemAccessDesc desc{};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = dev;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUresult r = REAL(cuMemAddressReserve)(&addr, b.size, 0, 0, 0);
    if (r == CUDA_SUCCESS) {
      r = REAL(cuMemMap)(addr, b.size, 0, d, 0);
      if (r == CUDA_SUCCESS) {
        r = REAL(cuMemSetAccess)(addr, b.size, &desc, 1);
        if (r != CUDA_SUCCESS) REAL(cuMemUnmap)(addr, b.size);
      }
      if (r != CUDA_SUCCESS) REAL(cuMemAddressFree)(addr, b.size);
    }
    std::vector<CUmemGenericAllocationHandle> rel;
    std::vector<ListedFd> fds;
    {
      Lock l(s.mu);
      Alloc& a = s.allocs[id];
      if (r != CUDA_SUCCESS) {
        if (a.pins) a.pins--;
        settle(s, id, &rel, &fds);
      } else {
        a.legacy = true;
        a.mappings++;
        Mapping m;
        m.size = b.size;
        m.alloc = id;
        union_access(&m.access, desc);
        s.ranges.emplace(addr, std::move(m));
        s.ipc.push_back({ctx, id, addr, b.size, 1});
        *dptr = addr;
      }
    }
    finish(rel, &fds);
    return r;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

CUresult ipc_close(decltype(&::cuIpcCloseMemHandle) real, CUdeviceptr dptr) noexcept {
  const NoCancel no_cancel;  // closes the export cache's descriptor (track_internal.h)
  if (!active()) return real(dptr);
  // The tables grow and shrink here (allocation): never an exception out.
  try {
    State& s = state();
    IpcOpen o;
    auto find = [&] {
      auto it = s.ipc.begin();
      for (; it != s.ipc.end(); ++it)
        if (it->address == dptr) break;
      return it;
    };
    bool foreign = false;
    {
      Lock l(s.mu);
      auto it = find();
      if (it == s.ipc.end()) return real(dptr);
      foreign = it->alloc == 0;  // a foreign open: the driver's own mapping
      if (!foreign && --it->opens > 0) return CUDA_SUCCESS;
      if (!foreign) {
        o = *it;
        s.ipc.erase(it);
        s.ranges.erase(o.address);
      }
    }
    if (foreign) {
      // The driver's close runs outside the table lock (it may wait on the
      // device); the record is counted down after it succeeded.
      CUresult r = real(dptr);
      if (r != CUDA_SUCCESS) return r;
      Lock l(s.mu);
      auto it = find();
      if (it != s.ipc.end() && it->alloc == 0 && --it->opens == 0) {
        s.ipc.erase(it);
        if (s.foreign_alive) s.foreign_alive--;
      }
      return r;
    }
    REAL(cuMemUnmap)(o.address, o.size);
    REAL(cuMemAddressFree)(o.address, o.size);
    std::vector<CUmemGenericAllocationHandle> rel;
    std::vector<ListedFd> fds;
    {
      Lock l(s.mu);
      auto a = s.allocs.find(o.alloc);
      if (a != s.allocs.end()) {
        if (a->second.mappings) a->second.mappings--;
        if (a->second.pins) a->second.pins--;
        settle(s, o.alloc, &rel, &fds);
      }
    }
    finish(rel, &fds);
    return CUDA_SUCCESS;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

}  // namespace cusnap::shim::track
