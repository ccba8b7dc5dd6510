// Tracking of legacy allocations: cuMemAlloc, cuMemFree and cuMemFreeAsync
// served by exportable VMM allocations (legacy IPC: track_ipc.cpp; the
// pointer queries: track_queries.cpp; what goes with a context:
// track_contexts.cpp).
// Contract and locks: track.h; state: track_state.h; helpers: track_internal.h.
#include "shim/track.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>

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

bool take_block(State& s, CUdeviceptr dptr, uint64_t* id, uint64_t* size, int32_t* dev) {
  auto b = s.legacy_blocks.find(dptr);
  if (b == s.legacy_blocks.end()) return false;
  *id = b->second;
  s.legacy_blocks.erase(b);
  maybe_shrink(s.legacy_blocks);
  auto m = s.ranges.find(dptr);
  drop_tail(s, dptr);
  if (m != s.ranges.end()) {
    *size = m->second.size;
    s.ranges.erase(m);
  }
  auto a = s.allocs.find(*id);
  if (a != s.allocs.end()) *dev = a->second.device;
  return true;
}

bool take_if_same(State& s, CUdeviceptr dptr, uint64_t id, uint64_t* size) {
  auto b = s.legacy_blocks.find(dptr);
  if (b == s.legacy_blocks.end() || b->second != id) return false;
  uint64_t taken = 0;
  int32_t dev = 0;
  return take_block(s, dptr, &taken, size, &dev);
}

CUresult drop_block(State& s, CUdeviceptr dptr, uint64_t id, uint64_t size) {
  CUresult r;
  {
    // Not while a peer grant or revocation that names the address is under
    // way: freed, the address may be another block's by its call.
    Lock busy(s.access_mu);
    r = REAL(cuMemUnmap)(dptr, size);
    const CUresult freed = REAL(cuMemAddressFree)(dptr, size);
    if (r == CUDA_SUCCESS) r = freed;
  }
  std::vector<CUmemGenericAllocationHandle> rel;
  std::vector<ListedFd> fds;
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
  return r;
}

namespace {

/// Serves cuMemAlloc with an exportable allocation (POSIX-fd handle type) of
/// the current context's device, rounded up to the granularity and mapped
/// read-write at a reservation of its own, recorded as a block. On any
/// failure it undoes what it did and returns the error; the caller then
/// leaves the allocation to the driver.
CUresult serve_block(CUdeviceptr* dptr, size_t bytes, const char** failed) noexcept {
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
  *failed = "a VMM entry point of the driver";
  if (!get_dev || !gran || !create || !reserve || !map || !access || !unmap || !release ||
      !addr_free)
    return CUDA_ERROR_NOT_SUPPORTED;
  *failed = "cuCtxGetDevice";
  CUresult r = get_dev(&dev);
  if (r != CUDA_SUCCESS) return r;
  CUcontext ctx = nullptr;
  if (auto get_cur = REAL(cuCtxGetCurrent)) get_cur(&ctx);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  // The driver's cuMemAlloc block may be a GPUDirect RDMA buffer (an RDMA
  // network adapter reads and writes it: NCCL's and MPI's transports over
  // InfiniBand); a VMM allocation only when created so, where the device
  // supports it (NCCL's own cuMem allocations do the same). Without the flag
  // the served block reported IS_GPU_DIRECT_RDMA_CAPABLE 0 where the
  // driver's reports 1 (served-block-h100.log). A restore creates the
  // allocation again with the same properties.
  if (auto attr = REAL(cuDeviceGetAttribute)) {
    int rdma = 0;
    if (attr(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev) ==
            CUDA_SUCCESS &&
        rdma)
      prop.allocFlags.gpuDirectRDMACapable = 1;
  }
  size_t g = 0;
  *failed = "cuMemGetAllocationGranularity";
  if ((r = gran(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)) != CUDA_SUCCESS) return r;
  if (g == 0 || bytes > SIZE_MAX - (g - 1)) return CUDA_ERROR_INVALID_VALUE;
  const size_t size = (bytes + g - 1) / g * g;
  CUmemGenericAllocationHandle d = 0;
  *failed = "cuMemCreate";
  r = create(&d, size, &prop, 0);
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_OUT_OF_MEMORY && prop.allocFlags.gpuDirectRDMACapable) {
    prop.allocFlags.gpuDirectRDMACapable = 0;  // refused with the flag: a block all the same
    r = create(&d, size, &prop, 0);
  }
  if (r != CUDA_SUCCESS) return r;
  CUdeviceptr addr = 0;
  *failed = "cuMemAddressReserve";
  if ((r = reserve(&addr, size, 0, 0, 0)) != CUDA_SUCCESS) {
    release(d);
    return r;
  }
  CUmemAccessDesc desc{};
  desc.location = prop.location;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  *failed = "cuMemMap";
  if ((r = map(addr, size, 0, d, 0)) != CUDA_SUCCESS) {
    addr_free(addr, size);
    release(d);
    return r;
  }
  *failed = "cuMemSetAccess";
  if ((r = access(addr, size, &desc, 1)) != CUDA_SUCCESS) {
    unmap(addr, size);
    addr_free(addr, size);
    release(d);
    return r;
  }
  State& s = state();
  *failed = "the shim's tables (out of memory)";
  uint64_t id = 0;
  try {
    Lock l(s.mu);
    id = s.next_alloc;  // add_created's, known before it records anything
    add_created(s, d, size, prop);
    Alloc& a = s.allocs[id];
    a.legacy = true;
    a.pins = 1;
    a.mappings = 1;
    Mapping m;
    m.size = size;
    m.alloc = id;
    m.asked = BlockAsked{BlockAsked::Kind::kServed, ctx, bytes};
    union_access(&m.access, desc);
    s.ranges.emplace(addr, std::move(m));
    s.legacy_blocks.emplace(addr, id);
    set_tail(s, addr, bytes, size);
  } catch (...) {
    {
      Lock l(s.mu);
      drop_tail(s, addr);
      auto b = s.legacy_blocks.find(addr);
      if (b != s.legacy_blocks.end() && b->second == id) s.legacy_blocks.erase(b);
      auto m = s.ranges.find(addr);
      if (m != s.ranges.end() && m->second.alloc == id) s.ranges.erase(m);
      auto a = s.allocs.find(id);
      if (a != s.allocs.end() && a->second.driver == d) {
        s.by_key.erase(a->second.key);
        s.allocs.erase(a);
      }
    }
    {
      Lock busy(s.access_mu);  // as drop_block: a grant may have named the block
      unmap(addr, size);
      addr_free(addr, size);
    }
    release(d);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  // Devices with peer access to this one reach the block as they would the driver's.
  *failed = "the peer grant (cuMemSetAccess)";
  try {
    r = grant_peers(s, addr);
  } catch (...) {
    r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (r != CUDA_SUCCESS) {
    // Nothing ran on the block: no synchronize, as a free would.
    try {
      uint64_t got = 0;
      int32_t on = 0;
      bool ours;
      {
        Lock l(s.mu);
        ours = take_block(s, addr, &id, &got, &on);
      }
      if (ours) drop_block(s, addr, id, got);
    } catch (...) {
    }
    return r;
  }
  *dptr = addr;
  return CUDA_SUCCESS;
}

/// cuCtxSynchronize of ctx, made current for it: nothing where it cannot be
/// made current (a context destroyed meanwhile took its work).
std::optional<CUresult> sync_context(CUcontext ctx) {
  auto sync = REAL(cuCtxSynchronize);
  auto push = REAL(cuCtxPushCurrent_v2);
  auto pop = REAL(cuCtxPopCurrent_v2);
  if (!sync || !push || !pop || push(ctx) != CUDA_SUCCESS) return std::nullopt;
  const CUresult r = sync();
  CUcontext popped = nullptr;
  pop(&popped);
  return r;
}

/// Waits, before a block's memory goes, for the device work that may still
/// use it, as cuMemFree does, and returns what the synchronize returns (a
/// sticky error of an earlier kernel is the free's answer, as the driver's).
/// The context the block was served in first, when it is not the current
/// one and still there (a created context the application has not
/// destroyed, or the device's active primary context: a recorded handle may
/// name a context gone, or one that got the handle back): a block of a
/// created context freed with the primary context current was unmapped under
/// the created context's kernels before. Then the current context when it is
/// on the block's device (the driver's own free synchronizes there too);
/// else that device's primary context, when active and not synchronized
/// already (a runtime application that frees a block of another device than
/// its current one); else the current context, if any. The first error.
CUresult sync_device_of_block(int32_t dev, CUcontext block_ctx, bool created) {
  auto sync = REAL(cuCtxSynchronize);
  if (!sync) return CUDA_SUCCESS;
  CUcontext cur = nullptr;
  if (auto get_cur = REAL(cuCtxGetCurrent); !get_cur || get_cur(&cur) != CUDA_SUCCESS)
    cur = nullptr;
  CUdevice cur_dev = -1;
  auto get_dev = REAL(cuCtxGetDevice);
  const bool cur_on_dev = cur && get_dev && get_dev(&cur_dev) == CUDA_SUCCESS && cur_dev == dev;
  CUresult first = CUDA_SUCCESS;
  bool primary_synced = false;
  if (block_ctx && block_ctx != cur) {
    primary_synced = !created && block_ctx == active_primary(dev);
    if (created || primary_synced) first = sync_context(block_ctx).value_or(CUDA_SUCCESS);
  }
  CUresult r = CUDA_SUCCESS;
  if (cur_on_dev) {
    r = sync();
  } else if (!primary_synced) {
    // The device's primary context, retained for the synchronize.
    auto state_of = REAL(cuDevicePrimaryCtxGetState);
    auto retain = REAL(cuDevicePrimaryCtxRetain);
    auto release = REAL(cuDevicePrimaryCtxRelease_v2);
    unsigned int flags = 0;
    int active = 0;
    CUcontext primary = nullptr;
    std::optional<CUresult> on_primary;
    if (state_of && retain && release && state_of(dev, &flags, &active) == CUDA_SUCCESS && active &&
        retain(&primary, dev) == CUDA_SUCCESS) {
      on_primary = sync_context(primary);
      release(dev);
    }
    r = on_primary ? *on_primary : cur ? sync() : CUDA_SUCCESS;
  }
  return first != CUDA_SUCCESS ? first : r;
}

/// What of a free's synchronize is the free's answer. A capture's refusal
/// of the synchronize is not: the driver's own cuMemFree is allowed beside
/// a RELAXED capture, where cuCtxSynchronize is refused in every mode
/// (capture-sync-h200.log), so that refusal comes of the shim's way of
/// freeing (a capture the shim saw is deferred, above; one it did not, say
/// on the default stream of a thread that exited capturing, reaches here).
/// Anything else (a sticky error of an earlier kernel) the driver's free
/// reports too.
CUresult answer_of_sync(CUresult r) {
  switch (r) {
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
    case CUDA_ERROR_STREAM_CAPTURE_MERGE:
    case CUDA_ERROR_STREAM_CAPTURE_UNMATCHED:
    case CUDA_ERROR_STREAM_CAPTURE_UNJOINED:
    case CUDA_ERROR_STREAM_CAPTURE_ISOLATION:
    case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT:
    case CUDA_ERROR_CAPTURED_EVENT:
    case CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD:
      return CUDA_SUCCESS;
    default:
      return r;
  }
}

}  // namespace

namespace {
void reap_pending(State& s, bool wait = false);  // below, with the frees
}  // namespace

CUresult mem_alloc(decltype(&::cuMemAlloc_v2) real, CUdeviceptr* dptr, size_t bytes) noexcept {
  if (!active() || !legacy_vmm()) return real(dptr, bytes);
  if (!dptr || bytes == 0) return real(dptr, bytes);
  if (captures::any())
    if (CUresult r = capture_allows_alloc(); r != CUDA_SUCCESS) return r;
  try {
    reap_pending(state());  // blocks freed in stream order whose stream got there
  } catch (...) {
  }
  // Where the shim cannot serve the block (the rounding to the granularity
  // tips a nearly full device over; a device without POSIX-fd handles), the
  // driver's own cuMemAlloc may: the block is then the driver's, untracked,
  // as with CUSNAP_SHIM_LEGACY_VMM=0 (its IPC handles are the driver's, and
  // count as foreign imports where opened).
  const char* failed = "";
  const CUresult r = serve_block(dptr, bytes, &failed);
  if (r == CUDA_SUCCESS) return r;
  char line[160];
  std::snprintf(line, sizeof line, "cuMemAlloc of %zu bytes left to the driver: %s gave %d", bytes,
                failed, static_cast<int>(r));
  log(line);
  const CUresult got = real(dptr, bytes);
  if (got != CUDA_SUCCESS) return got;
  // Recorded, so that an IPC handle of it is counted where it is handed out
  // and a checkpoint refused for its importer says where it came from. A
  // block not recorded (no memory for the table) is the driver's all the same.
  try {
    State& s = state();
    CUcontext ctx = nullptr;
    if (auto get_cur = REAL(cuCtxGetCurrent)) get_cur(&ctx);
    Lock l(s.mu);
    s.driver_blocks[*dptr] = {bytes, ctx};
    if (!s.driver_block_why[0])
      std::snprintf(s.driver_block_why, sizeof s.driver_block_why, "%s gave %d", failed,
                    static_cast<int>(r));
  } catch (...) {
  }
  return got;
}

namespace {

/// The driver's free (free_real: its cuMemFree or cuMemFreeAsync) of a
/// block that is not the shim's, forgotten as one left to the driver before
/// it is freed (another thread's cuMemAlloc may get the address back as soon
/// as it is, and record it), and recorded again when the free fails.
template <typename FreeReal>
CUresult free_driver_block(State& s, FreeReal free_real, CUdeviceptr dptr) {
  std::optional<State::DriverBlock> was;
  {
    Lock l(s.mu);
    if (auto b = s.driver_blocks.find(dptr); b != s.driver_blocks.end()) {
      was = b->second;
      s.driver_blocks.erase(b);
    }
  }
  const CUresult r = free_real(dptr);
  if (r != CUDA_SUCCESS && was) {
    Lock l(s.mu);
    s.driver_blocks.emplace(dptr, *was);
  }
  return r;
}

/// Takes the shim's block at dptr out of the tables and drops it, sync
/// waiting between for the work that may still use it: sync(device,
/// context the block was served in, whether that is a created context still
/// alive) returns the synchronize's answer. The first error, as the
/// driver's cuMemFree reports it (the block is released all the same);
/// nothing when the shim does not serve dptr.
template <typename Sync>
std::optional<CUresult> take_and_drop(State& s, CUdeviceptr dptr, Sync sync) {
  uint64_t id = 0, size = 0;
  int32_t dev = 0;
  CUcontext ctx = nullptr;
  bool created = false;  // ctx is a context the application created, alive
  {
    Lock l(s.mu);
    if (auto m = s.ranges.find(dptr); m != s.ranges.end()) ctx = m->second.asked.ctx;
    created = std::find(s.contexts.begin(), s.contexts.end(), ctx) != s.contexts.end();
    if (!take_block(s, dptr, &id, &size, &dev)) return std::nullopt;
  }
  const CUresult synced = sync(dev, ctx, created);
  const CUresult dropped = drop_block(s, dptr, id, size);
  return synced != CUDA_SUCCESS ? synced : dropped;
}

/// cuMemFree of a block: the driver's for one that is not the shim's.
CUresult free_block(State& s, decltype(&::cuMemFree_v2) real, CUdeviceptr dptr) {
  if (auto r = take_and_drop(s, dptr, [](int32_t dev, CUcontext ctx, bool created) {
        return answer_of_sync(sync_device_of_block(dev, ctx, created));
      }))
    return *r;
  return free_driver_block(s, real, dptr);
}

/// Frees the blocks whose free a capture deferred (no capture under way).
void free_deferred(State& s, decltype(&::cuMemFree_v2) real) {
  std::vector<uint64_t> deferred;
  {
    Lock l(s.mu);
    deferred.swap(s.deferred_frees);
  }
  for (uint64_t p : deferred) free_block(s, real, p);
}

/// Defers the free of the shim's block at dptr to the first free after the
/// captures under way (captures.h): CUDA_SUCCESS, or INVALID_VALUE for a
/// block not the shim's any more or deferred already (a second free).
CUresult defer_free(State& s, CUdeviceptr dptr) {
  Lock l(s.mu);
  if (!s.legacy_blocks.count(dptr)) return CUDA_ERROR_INVALID_VALUE;
  auto& d = s.deferred_frees;
  if (std::find(d.begin(), d.end(), dptr) != d.end()) return CUDA_ERROR_INVALID_VALUE;
  d.push_back(dptr);
  return CUDA_SUCCESS;
}

/// Whether a stream's synchronize failed for want of a usable stream or
/// context (the driver's cuMemFreeAsync refuses these and frees nothing),
/// rather than with a sticky error of earlier work (cuMemFree's answer).
bool refuses_stream(CUresult r) {
  return r == CUDA_ERROR_INVALID_HANDLE || r == CUDA_ERROR_INVALID_VALUE ||
         r == CUDA_ERROR_INVALID_CONTEXT || r == CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

/// Whether the block at addr waits in pending_frees (s.mu held): freed
/// already, as far as the application is concerned.
bool pending(const State& s, uint64_t addr) {
  for (const auto& p : s.pending_frees)
    if (p.addr == addr) return true;
  return false;
}

/// Frees the blocks of pending_frees whose event has completed (or failed: a
/// context gone bad, whose work is over), and destroys their events. The
/// events are queried without s.mu, from a copy of the list; the list itself
/// stays whole meanwhile, so that a context destroyed by another thread
/// takes its own entries (context_gone) and a second free of a block still
/// pending is refused. A completed entry is taken out only if it is still
/// there: one taken by context_gone or another reaper meanwhile is theirs,
/// event included.
/// One reaper at a time (s.reap_mu): a second one, or one while a context
/// goes, leaves the work to the next allocation or free, or waits when
/// wait is set (a checkpoint's drain).
void reap_pending(State& s, bool wait) {
  if (s.pending_count.load(std::memory_order_acquire) == 0) return;
  auto query = REAL(cuEventQuery);
  auto destroy = REAL(cuEventDestroy_v2);
  if (!query || !destroy) return;
  std::unique_lock<std::mutex> reaping(s.reap_mu, std::defer_lock);
  if (wait)
    reaping.lock();
  else if (!reaping.try_lock())
    return;
  std::vector<State::PendingFree> all;
  {
    Lock l(s.mu);
    all = s.pending_frees;
  }
  std::vector<State::PendingFree> done;
  for (const auto& p : all)
    if (query(p.event) != CUDA_ERROR_NOT_READY) done.push_back(p);
  for (const auto& p : done) {
    uint64_t size = 0;
    bool ours = false, taken = false;
    {
      Lock l(s.mu);
      auto& list = s.pending_frees;
      auto it = std::find_if(list.begin(), list.end(), [&](const State::PendingFree& f) {
        return f.event == p.event && f.addr == p.addr && f.id == p.id;
      });
      if (it != list.end()) {
        ours = true;
        list.erase(it);
        s.pending_count.store(list.size(), std::memory_order_release);
        taken = take_if_same(s, p.addr, p.id, &size);
      }
    }
    if (!ours) continue;
    if (taken) drop_block(s, p.addr, p.id, size);
    destroy(p.event);
  }
}

/// cuMemFreeAsync of the shim's block at dptr without a capture under way:
/// an event recorded on the stream marks where the stream reaches the free,
/// and the block goes once it has completed (reap_pending). The call returns
/// at once, as the driver's. CUDA_ERROR_NOT_SUPPORTED where no event could
/// be made (the caller then waits for the stream instead); the driver's
/// refusal of the stream otherwise.
CUresult free_in_stream_order(State& s, CUdeviceptr dptr, CUstream stream) {
  auto create = REAL(cuEventCreate);
  auto record = REAL(cuEventRecord);
  auto destroy = REAL(cuEventDestroy_v2);
  if (!create || !record || !destroy) return CUDA_ERROR_NOT_SUPPORTED;
  CUevent ev = nullptr;
  CUcontext ctx = nullptr;
  if (auto get_cur = REAL(cuCtxGetCurrent)) get_cur(&ctx);
  if (create(&ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return CUDA_ERROR_NOT_SUPPORTED;
  if (CUresult r = record(ev, stream); r != CUDA_SUCCESS) {
    destroy(ev);
    return refuses_stream(r) ? r : CUDA_ERROR_NOT_SUPPORTED;
  }
  bool queued = false;
  {
    Lock l(s.mu);
    auto b = s.legacy_blocks.find(dptr);
    if (b != s.legacy_blocks.end() && !pending(s, dptr)) {
      s.pending_frees.push_back({dptr, b->second, ev, ctx});
      s.pending_count.store(s.pending_frees.size(), std::memory_order_release);
      queued = true;
    }
  }
  if (!queued) {  // freed meanwhile by another thread
    destroy(ev);
    return CUDA_ERROR_INVALID_VALUE;
  }
  reap_pending(s);
  return CUDA_SUCCESS;
}

}  // namespace

void settle_frees(State& s) noexcept {
  const NoCancel no_cancel;  // as mem_free
  try {
    // The drain synchronized every context just before: a deferred block
    // goes without another synchronize (which, were the gate opened again
    // meanwhile, could meet a capture the application began and invalidate
    // it).
    std::vector<uint64_t> deferred;
    {
      Lock l(s.mu);
      deferred.swap(s.deferred_frees);
    }
    for (uint64_t p : deferred)
      take_and_drop(s, p, [](int32_t, CUcontext, bool) { return CUDA_SUCCESS; });
    reap_pending(s, true);
  } catch (...) {
  }
}

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
      if (ours) return defer_free(s, dptr);
      return free_driver_block(s, real, dptr);
    }
    {
      Lock l(s.mu);
      if (pending(s, dptr)) return CUDA_ERROR_INVALID_VALUE;  // freed already (cuMemFreeAsync)
    }
    free_deferred(s, real);
    reap_pending(s);
    return free_block(s, real, dptr);
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

CUresult mem_free_async(decltype(&::cuMemFreeAsync) real, CUdeviceptr dptr, CUstream stream,
                        bool ptsz) noexcept {
  const NoCancel no_cancel;  // as mem_free
  if (!tracking_on() || !active()) return real(dptr, stream);
  try {
    State& s = state();
    bool ours = false;
    {
      Lock l(s.mu);
      ours = s.legacy_blocks.count(dptr) > 0;
    }
    if (!ours)
      return free_driver_block(
          s, [&](CUdeviceptr p) { return real(p, stream); }, dptr);
    {
      Lock l(s.mu);
      if (pending(s, dptr)) return CUDA_ERROR_INVALID_VALUE;  // freed already
    }
    // The driver frees a cuMemAlloc block here in stream order (measured:
    // gone once the stream reaches the free), and refuses the shim's
    // VMM-mapped address (INVALID_VALUE, the block left mapped). The shim
    // frees the block once an event recorded on the stream has completed.
    // During a capture the event would join the graph: the free is
    // deferred, as cuMemFree's, which the driver allows here in every
    // capture mode.
    if (captures::any()) return defer_free(s, dptr);
    const bool per_thread = ptsz && stream == nullptr;
    const CUstream on = per_thread ? CU_STREAM_PER_THREAD : stream;
    if (auto free_real = REAL(cuMemFree_v2)) free_deferred(s, free_real);
    if (CUresult r = free_in_stream_order(s, dptr, on); r != CUDA_ERROR_NOT_SUPPORTED) return r;
    // No event: wait for the stream, then free the block (the host held).
    auto sync = REAL(cuStreamSynchronize);
    const CUresult synced = sync ? sync(on) : CUDA_SUCCESS;
    if (refuses_stream(synced)) return synced;
    const auto r =
        take_and_drop(s, dptr, [&](int32_t, CUcontext, bool) { return answer_of_sync(synced); });
    return r ? *r : CUDA_ERROR_INVALID_VALUE;  // freed meanwhile, a deferred free among them
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

}  // namespace cusnap::shim::track
