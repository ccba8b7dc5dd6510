// Tracking of legacy allocations and IPC: cuMemAlloc/cuMemFree served by
// exportable VMM allocations, cuIpcGetMemHandle/OpenMemHandle/CloseMemHandle.
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

/// Takes the cuMemAlloc block at dptr out of the tables (s.mu held): the id,
/// size and device of its allocation; false when the shim does not serve it.
bool take_block(State& s, CUdeviceptr dptr, uint64_t* id, uint64_t* size, int32_t* dev) {
  auto b = s.legacy_blocks.find(dptr);
  if (b == s.legacy_blocks.end()) return false;
  *id = b->second;
  s.legacy_blocks.erase(b);
  maybe_shrink(s.legacy_blocks);
  s.block_asked.erase(dptr);
  auto m = s.ranges.find(dptr);
  if (m != s.ranges.end()) {
    *size = m->second.size;
    s.ranges.erase(m);
  }
  auto a = s.allocs.find(*id);
  if (a != s.allocs.end()) *dev = a->second.device;
  return true;
}

/// Unmaps a block take_block took out of the tables, frees its reservation
/// and releases its allocation once nothing else holds it. The first error
/// of the driver's; what can be released is released all the same.
CUresult drop_block(State& s, CUdeviceptr dptr, uint64_t id, uint64_t size) {
  CUresult r = REAL(cuMemUnmap)(dptr, size);
  const CUresult freed = REAL(cuMemAddressFree)(dptr, size);
  if (r == CUDA_SUCCESS) r = freed;
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
  if ((r = create(&d, size, &prop, 0)) != CUDA_SUCCESS) return r;
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
    union_access(&m.access, desc);
    s.ranges.emplace(addr, std::move(m));
    s.legacy_blocks.emplace(addr, id);
    s.block_asked[addr] = State::BlockAsked{ctx, bytes};
  } catch (...) {
    {
      Lock l(s.mu);
      s.block_asked.erase(addr);
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
    unmap(addr, size);
    addr_free(addr, size);
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

/// Waits, before a block's memory goes, for the device work that may still
/// use it, as cuMemFree does, and returns what the synchronize returns (a
/// sticky error of an earlier kernel is the free's answer, as the driver's).
/// The shim records the block's device, not the context it was made in:
/// the current context when it is on that device (the driver's own free
/// synchronizes there too); else that device's primary context, when
/// active (a runtime application that frees a block of another device than
/// its current one); else the current context, if any.
CUresult sync_device_of_block(int32_t dev) {
  auto sync = REAL(cuCtxSynchronize);
  auto get_cur = REAL(cuCtxGetCurrent);
  auto get_dev = REAL(cuCtxGetDevice);
  if (!sync) return CUDA_SUCCESS;
  CUcontext cur = nullptr;
  const bool has_cur = get_cur && get_cur(&cur) == CUDA_SUCCESS && cur;
  CUdevice cur_dev = 0;
  if (has_cur && get_dev && get_dev(&cur_dev) == CUDA_SUCCESS && cur_dev == dev) return sync();
  auto state_of = REAL(cuDevicePrimaryCtxGetState);
  auto retain = REAL(cuDevicePrimaryCtxRetain);
  auto release = REAL(cuDevicePrimaryCtxRelease_v2);
  auto push = REAL(cuCtxPushCurrent_v2);
  auto pop = REAL(cuCtxPopCurrent_v2);
  unsigned int flags = 0;
  int active = 0;
  CUcontext primary = nullptr;
  if (state_of && retain && release && push && pop &&
      state_of(dev, &flags, &active) == CUDA_SUCCESS && active &&
      retain(&primary, dev) == CUDA_SUCCESS) {
    const bool pushed = push(primary) == CUDA_SUCCESS;
    CUresult r = CUDA_SUCCESS;
    if (pushed) {
      r = sync();
      CUcontext popped = nullptr;
      pop(&popped);
    }
    release(dev);
    if (pushed) return r;
  }
  return has_cur ? sync() : CUDA_SUCCESS;
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

CUresult mem_alloc(decltype(&::cuMemAlloc_v2) real, CUdeviceptr* dptr, size_t bytes) noexcept {
  if (!active() || !legacy_vmm()) return real(dptr, bytes);
  if (!dptr || bytes == 0) return real(dptr, bytes);
  if (captures::any())
    if (CUresult r = capture_allows_alloc(); r != CUDA_SUCCESS) return r;
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
    Lock l(s.mu);
    s.driver_blocks[*dptr] = bytes;
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
  uint64_t size = 0;
  {
    Lock l(s.mu);
    if (auto b = s.driver_blocks.find(dptr); b != s.driver_blocks.end()) {
      size = b->second;
      s.driver_blocks.erase(b);
    }
  }
  const CUresult r = free_real(dptr);
  if (r != CUDA_SUCCESS && size != 0) {
    Lock l(s.mu);
    s.driver_blocks.emplace(dptr, size);
  }
  return r;
}

/// cuMemFree of a block: the driver's for one that is not the shim's.
CUresult free_block(State& s, decltype(&::cuMemFree_v2) real, CUdeviceptr dptr) {
  uint64_t id = 0, size = 0;
  int32_t dev = 0;
  bool ours = false;
  {
    Lock l(s.mu);
    ours = take_block(s, dptr, &id, &size, &dev);
  }
  if (!ours) return free_driver_block(s, real, dptr);
  // The first error, as the driver's cuMemFree reports it; the block is
  // released all the same.
  const CUresult synced = answer_of_sync(sync_device_of_block(dev));
  const CUresult dropped = drop_block(s, dptr, id, size);
  return synced != CUDA_SUCCESS ? synced : dropped;
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
      if (ours) return defer_free(s, dptr);
      return free_driver_block(s, real, dptr);
    }
    free_deferred(s, real);
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
    // The driver frees a cuMemAlloc block here in stream order (measured:
    // gone once the stream reaches the free), and refuses the shim's
    // VMM-mapped address (INVALID_VALUE, the block left mapped). The shim
    // waits for the stream instead, then frees the block: the same order,
    // the host held meanwhile. A synchronize during a capture would fail
    // and invalidate it (captures.h): the free is deferred, as cuMemFree's,
    // which the driver allows here in every capture mode.
    if (captures::any()) return defer_free(s, dptr);
    auto sync = REAL(cuStreamSynchronize);
    const bool per_thread = ptsz && stream == nullptr;
    const CUresult synced = sync ? sync(per_thread ? CU_STREAM_PER_THREAD : stream) : CUDA_SUCCESS;
    if (refuses_stream(synced)) return synced;
    if (auto free_real = REAL(cuMemFree_v2)) free_deferred(s, free_real);
    uint64_t id = 0, size = 0;
    int32_t dev = 0;
    bool taken = false;
    {
      Lock l(s.mu);
      taken = take_block(s, dptr, &id, &size, &dev);
    }
    if (!taken) return CUDA_ERROR_INVALID_VALUE;  // freed meanwhile, a deferred free among them
    const CUresult dropped = drop_block(s, dptr, id, size);
    const CUresult answer = answer_of_sync(synced);
    return answer != CUDA_SUCCESS ? answer : dropped;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

void context_gone(CUcontext ctx) noexcept {
  const NoCancel no_cancel;  // as mem_free
  if (!ctx || !tracking_on() || !active()) return;
  try {
    State& s = state();
    struct Gone {
      uint64_t addr, id, size;
    };
    std::vector<Gone> gone;
    {
      Lock l(s.mu);
      std::vector<uint64_t> addrs;
      for (const auto& [addr, asked] : s.block_asked)
        if (asked.ctx == ctx) addrs.push_back(addr);
      for (uint64_t addr : addrs) {
        Gone g{addr, 0, 0};
        int32_t dev = 0;
        if (take_block(s, addr, &g.id, &g.size, &dev)) gone.push_back(g);
        auto& d = s.deferred_frees;
        d.erase(std::remove(d.begin(), d.end(), addr), d.end());
      }
    }
    // No synchronize: the context's work went with it.
    for (const Gone& g : gone) drop_block(s, g.addr, g.id, g.size);
  } catch (...) {
  }
}

CUcontext active_primary(CUdevice dev) noexcept {
  auto state_of = REAL(cuDevicePrimaryCtxGetState);
  auto retain = REAL(cuDevicePrimaryCtxRetain);
  auto release = REAL(cuDevicePrimaryCtxRelease_v2);
  if (!tracking_on() || !state_of || !retain || !release) return nullptr;
  unsigned flags = 0;
  int on = 0;
  CUcontext ctx = nullptr;
  if (state_of(dev, &flags, &on) != CUDA_SUCCESS || !on) return nullptr;
  if (retain(&ctx, dev) != CUDA_SUCCESS) return nullptr;
  release(dev);  // active before the retain: this release does not destroy it
  return ctx;
}

namespace {

/// The block the shim serves that holds ptr: its base and what was asked of
/// it; false for any other address.
bool served_at(CUdeviceptr ptr, uint64_t* base, State::BlockAsked* asked) {
  if (!active()) return false;
  State& s = state();
  Lock l(s.mu);
  auto m = containing(s, ptr);
  if (m == s.ranges.end()) return false;
  auto b = s.block_asked.find(m->first);
  if (b == s.block_asked.end()) return false;
  *base = m->first;
  *asked = b->second;
  return true;
}

/// Rewrites the driver's answer for the mapping (in *data) into its answer
/// for a cuMemAlloc block. The driver wrote 0 for IS_LEGACY_CUDA_IPC_CAPABLE
/// and 1 (the POSIX descriptor) for ALLOWED_HANDLE_TYPES, in the width the
/// caller's variable has: only their lowest byte changes, so any width reads
/// 1 and 0.
void as_driver_block(CUpointer_attribute attr, void* data, const State::BlockAsked& asked) {
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      *static_cast<unsigned char*>(data) = 1;
      break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      *static_cast<unsigned char*>(data) = 0;
      break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<size_t*>(data) = asked.bytes;
      break;
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      if (asked.ctx) *static_cast<CUcontext*>(data) = asked.ctx;
      break;
    default:
      break;
  }
}

}  // namespace

CUresult pointer_get_attr(decltype(&::cuPointerGetAttribute) real, void* data,
                          CUpointer_attribute attr, CUdeviceptr ptr) noexcept {
  const CUresult r = real(data, attr, ptr);
  if (r != CUDA_SUCCESS || !data) return r;
  try {
    uint64_t base = 0;
    State::BlockAsked asked;
    if (served_at(ptr, &base, &asked)) as_driver_block(attr, data, asked);
  } catch (...) {  // the driver's answer stands
  }
  return r;
}

CUresult pointer_get_attrs(decltype(&::cuPointerGetAttributes) real, unsigned int n,
                           CUpointer_attribute* attrs, void** data, CUdeviceptr ptr) noexcept {
  const CUresult r = real(n, attrs, data, ptr);
  if (r != CUDA_SUCCESS || !attrs || !data) return r;
  try {
    uint64_t base = 0;
    State::BlockAsked asked;
    if (!served_at(ptr, &base, &asked)) return r;
    for (unsigned int i = 0; i < n; ++i)
      if (data[i]) as_driver_block(attrs[i], data[i], asked);
  } catch (...) {
  }
  return r;
}

CUresult mem_get_range(decltype(&::cuMemGetAddressRange_v2) real, CUdeviceptr* pbase, size_t* psize,
                       CUdeviceptr ptr) noexcept {
  const CUresult r = real(pbase, psize, ptr);
  if (r != CUDA_SUCCESS || !psize) return r;
  try {
    uint64_t base = 0;
    State::BlockAsked asked;
    if (served_at(ptr, &base, &asked)) *psize = asked.bytes;
  } catch (...) {
  }
  return r;
}

CUresult pointer_set_attr(decltype(&::cuPointerSetAttribute) real, const void* value,
                          CUpointer_attribute attr, CUdeviceptr ptr) noexcept {
  if (attr != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS || !value || !active()) {
    return real(value, attr, ptr);
  }
  try {
    State& s = state();
    {
      Lock l(s.mu);
      auto m = containing(s, ptr);
      if (m == s.ranges.end() || !s.legacy_blocks.count(m->first)) return real(value, attr, ptr);
    }
    // The driver's cuMemAlloc block takes the attribute (measured:
    // served-block-h100.log) that MPI and UCX transports set before an RDMA
    // adapter reads the block, so that a synchronous copy into it has landed
    // when it returns; for VMM memory the driver offers the context's flag.
    // The flag covers every block of the context, so a 0 (the attribute
    // cleared) leaves it: the guarantee stays, stronger than asked.
    if (*static_cast<const unsigned*>(value) == 0) return CUDA_SUCCESS;
    auto get_flags = REAL(cuCtxGetFlags);
    auto set_flags = REAL(cuCtxSetFlags);
    if (!get_flags || !set_flags) return real(value, attr, ptr);  // a driver older than 12.1
    unsigned flags = 0;
    if (CUresult r = get_flags(&flags); r != CUDA_SUCCESS) return r;
    if (flags & CU_CTX_SYNC_MEMOPS) return CUDA_SUCCESS;
    return set_flags(flags | CU_CTX_SYNC_MEMOPS);
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
    bool driver_block = false;
    {
      Lock l(s.mu);
      auto m = containing(s, dptr);
      if (m != s.ranges.end() && s.legacy_blocks.count(m->first)) {
        id = m->second.alloc;
        a = s.allocs[id];
      } else if (range_containing(s.driver_blocks, dptr, [](uint64_t size) { return size; }) !=
                 s.driver_blocks.end()) {
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
