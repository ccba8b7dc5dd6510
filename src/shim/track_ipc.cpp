// Legacy IPC: cuIpcGetMemHandle of a block the shim serves (a handle naming
// its allocation), cuIpcOpenMemHandle (an import through the creator's peer
// socket, mapped at a reservation of the opener's), cuIpcCloseMemHandle.
// Contract and locks: track.h; state: track_state.h; helpers: track_internal.h.
#include "shim/track.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "shim/captures.h"
#include "shim/real_driver.h"
#include "shim/track_internal.h"

namespace cusnap::shim::track {

CUresult ipc_get(decltype(&::cuIpcGetMemHandle) real, CUipcMemHandle* h,
                 CUdeviceptr dptr) noexcept {
  const NoCancel no_cancel;  // close (track_internal.h)
  if (!active()) return real(h, dptr);
  if (!h) return CUDA_ERROR_INVALID_VALUE;
  State& s = state();
  try {
    uint64_t id = 0;
    uint64_t asked = 0;
    Alloc a;
    bool driver_block = false;
    {
      Lock l(s.mu);
      ServedBlock block;
      const Served where = served_at_locked(s, dptr, &block);
      // Past the bytes asked the driver knows no block (measured on an
      // H100: tests/gpu/probes/alloc_sizes.cpp tail).
      if (where == Served::kTail) return CUDA_ERROR_INVALID_VALUE;
      if (where == Served::kYes) {
        id = block.alloc;
        asked = block.asked.bytes;
        a = s.allocs.at(id);
      } else if (range_containing(s.driver_blocks, dptr, [](const State::DriverBlock& b) {
                   return b.size;
                 }) != s.driver_blocks.end()) {
        driver_block = true;
      } else {
        return real(h, dptr);
      }
    }
    note_sharing_call(s);
    if (driver_block) {
      // The driver's handle of a block left to the driver, counted
      // (ShimRecords::driver_ipc_exports): its opener cannot be checkpointed.
      const CUresult r = real(h, dptr);
      if (r == CUDA_SUCCESS) {
        Lock l(s.mu);
        s.driver_ipc_exports++;
      }
      return r;
    }
    if (CUresult r = ensure_cached(s, id, a.driver); r != CUDA_SUCCESS) return r;
    proto::IpcHandleBlob b{};
    std::memcpy(b.magic, proto::kIpcMagic, sizeof(b.magic));
    b.creator_pid = a.key.pid;
    b.creator_start = a.key.start;
    b.allocation = a.key.id;
    b.size = a.size;
    b.asked = asked;
    static_assert(sizeof(b) == sizeof(CUipcMemHandle));
    std::memcpy(h, &b, sizeof(b));
    return CUDA_SUCCESS;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

namespace {

/// Where the shim's handle key is open already, as seen from context ctx of
/// device dev.
enum class InContexts {
  kNone,     ///< nowhere on this device
  kOwn,      ///< in ctx: counted once more, *dptr its address
  kRefused,  ///< in another live context of the device
  kOther,    ///< in another context of the device not known to be alive
};

/// The driver refuses a second open of a handle in another live context of
/// the device (measured on an H200: tests/gpu/probes/context_ipc.cpp). A
/// context is known alive when the shim saw it created, or when it is the
/// device's active primary (primary, nullptr when not asked); a record whose
/// context went where the shim did not see it refuses nothing. s.mu held.
InContexts open_of(State& s, uint64_t alloc, CUcontext ctx, CUdevice dev, CUcontext primary,
                   CUdeviceptr* dptr) {
  for (auto& o : s.ipc)
    if (o.alloc == alloc && o.ctx == ctx) {
      o.opens++;
      *dptr = o.address;
      return InContexts::kOwn;
    }
  InContexts out = InContexts::kNone;
  for (const auto& o : s.ipc) {
    if (o.alloc != alloc || o.dev != dev) continue;
    if ((primary && o.ctx == primary) ||
        std::find(s.contexts.begin(), s.contexts.end(), o.ctx) != s.contexts.end())
      return InContexts::kRefused;
    out = InContexts::kOther;
  }
  return out;
}

/// open_of of the allocation find(s) names (its local id; 0: none, so
/// kNone), asking for the device's primary context only when a record of
/// another context is left to judge (outside s.mu: a retain and release).
/// On kNone or kOther, then(s) runs under the hold of s.mu the answer was
/// given under (it may throw).
template <class Find, class Then>
InContexts open_checked(State& s, Find find, CUcontext ctx, CUdevice dev, CUdeviceptr* dptr,
                        Then then) {
  CUcontext primary = nullptr;
  for (bool asked = false;; asked = true) {
    {
      Lock l(s.mu);
      const uint64_t id = find(s);
      const InContexts in = id ? open_of(s, id, ctx, dev, primary, dptr) : InContexts::kNone;
      if (in != InContexts::kOther || asked) {
        if (in == InContexts::kNone || in == InContexts::kOther) then(s);
        return in;
      }
    }
    primary = active_primary(dev);  // nullptr when none is live
  }
}

}  // namespace

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
        CUcontext ctx = nullptr;  // the driver closes the open with it (track_contexts.cpp)
        if (auto get_cur = REAL(cuCtxGetCurrent)) get_cur(&ctx);
        Lock l(s.mu);
        s.foreign_total++;
        s.foreign_alive++;
        s.ipc.push_back({ctx, 0, *dptr, 0, 1});
      }
      return r;
    }
    if (b.creator_pid == s.pid && b.creator_start == s.start_time)
      return CUDA_ERROR_INVALID_CONTEXT;
    if (b.creator_pid <= 0 || b.allocation == 0 || b.size == 0 || b.asked > b.size)
      return CUDA_ERROR_INVALID_VALUE;
    // The open is the bytes the exporter asked, as on the driver (measured
    // on an H100: tests/gpu/probes/alloc_sizes.cpp ipc_tail): the queries
    // answer, and copies past them are refused, as for a served block.
    const uint64_t asked = b.asked ? b.asked : b.size;
    CUcontext ctx = nullptr;
    CUdevice dev = 0;
    if (CUresult r = REAL(cuCtxGetCurrent)(&ctx); r != CUDA_SUCCESS) return r;
    if (CUresult r = REAL(cuCtxGetDevice)(&dev); r != CUDA_SUCCESS) return r;
    AllocKey key{b.creator_pid, b.creator_start, b.allocation};
    auto by_key = [&key](State& st) {
      auto k = st.by_key.find(key);
      return k == st.by_key.end() ? uint64_t{0} : k->second;
    };
    switch (open_checked(s, by_key, ctx, dev, dptr, [](State&) {})) {
      case InContexts::kOwn:
        return CUDA_SUCCESS;
      case InContexts::kRefused:
        return CUDA_ERROR_INVALID_HANDLE;
      case InContexts::kNone:
      case InContexts::kOther:
        break;
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
      d = s.allocs.at(id).driver;  // pinned since the import
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
    // Another thread's open of the handle may have landed while this one
    // mapped it: checked again as the open is recorded.
    bool unmap = false;  // mapped, not recorded
    if (r == CUDA_SUCCESS) {
      unmap = true;
      auto record = [&](State& st) {
        Alloc& a = st.allocs.at(id);  // pinned since the import
        Mapping m;
        m.size = b.size;
        m.alloc = id;
        m.asked = BlockAsked{BlockAsked::Kind::kOpened, ctx, asked};
        union_access(&m.access, desc);
        auto at = st.ranges.emplace(addr, std::move(m)).first;  // throws: nothing recorded
        const size_t listed = st.ipc.size();
        try {
          st.ipc.push_back({ctx, id, addr, b.size, 1, dev});
          set_tail(st, addr, asked, b.size);
        } catch (...) {
          if (st.ipc.size() > listed) st.ipc.pop_back();
          st.ranges.erase(at);
          throw;
        }
        a.legacy = true;
        a.mappings++;
        unmap = false;
      };
      try {
        switch (open_checked(
            s, [id](State&) { return id; }, ctx, dev, dptr, record)) {
          case InContexts::kNone:
          case InContexts::kOther:  // recorded: the import's pin stays until the close
            *dptr = addr;
            return CUDA_SUCCESS;
          case InContexts::kOwn:  // another thread's open stands: this mapping goes
            break;
          case InContexts::kRefused:  // the driver opens a handle in one context of a device
            r = CUDA_ERROR_INVALID_HANDLE;
            break;
        }
      } catch (...) {  // not recorded (no memory): the open fails whole
        r = CUDA_ERROR_OUT_OF_MEMORY;
      }
    }
    if (unmap) {
      REAL(cuMemUnmap)(addr, b.size);
      REAL(cuMemAddressFree)(addr, b.size);
    }
    std::vector<CUmemGenericAllocationHandle> rel;
    std::vector<ListedFd> fds;
    {
      Lock l(s.mu);
      if (auto a = s.allocs.find(id); a != s.allocs.end() && a->second.pins) a->second.pins--;
      settle(s, id, &rel, &fds);
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
        drop_tail(s, o.address);
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
    drop_block(s, o.address, o.alloc, o.size);
    return CUDA_SUCCESS;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

}  // namespace cusnap::shim::track
