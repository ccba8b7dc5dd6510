// The pointer queries of a block the shim serves for cuMemAlloc
// (cuPointerGetAttribute, cuPointerGetAttributes, cuMemGetAddressRange,
// cuPointerSetAttribute): answered as for the driver's cuMemAlloc block, the
// block being a VMM mapping underneath (measured: served-block-h100.log).
// The mapping is whole 2 MiB granules, the driver's block the bytes asked:
// an address past them is one the driver does not know (measured on an
// H200: tests/gpu/probes/alloc_sizes.cpp), and is answered so. The same for
// the shim's open of another process's block from its IPC handle, which is
// the bytes the exporter asked on the driver (alloc_sizes.cpp ipc_tail).
// Contract and locks: track.h; state: track_state.h; helpers: track_internal.h.
#include "shim/track.h"

#include <shared_mutex>

#include "shim/real_driver.h"
#include "shim/track_internal.h"

namespace cusnap::shim::track {

namespace {

/// served_at_locked, taking s.mu.
Served served_at(CUdeviceptr ptr, BlockAsked* asked) {
  if (!active()) return Served::kNo;
  State& s = state();
  Lock l(s.mu);
  ServedBlock b;
  const Served where = served_at_locked(s, ptr, &b);
  *asked = b.asked;
  return where;
}

/// The driver's answer in cuPointerGetAttributes for an address it does not
/// know (measured): 0 in each attribute, the device ordinal -2. Widths as
/// cuda.h gives them; for the flags it gives none for (a boolean, a bitmask)
/// the driver had written 0, 1 or 3 for the mapping: the lowest byte holds
/// it, in any width.
void as_unknown(CUpointer_attribute attr, void* data) {
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      *static_cast<void**>(data) = nullptr;
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
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
      *static_cast<unsigned long long*>(data) = 0;
      break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned*>(data) = 0;
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = -2;
      break;
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
      *static_cast<CUDA_POINTER_ATTRIBUTE_P2P_TOKENS*>(data) = {};
      break;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_MAPPED:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
      *static_cast<unsigned char*>(data) = 0;
      break;
    default:
      break;
  }
}

/// Rewrites the driver's answer for the shim's mapping (in *data) into its
/// answer for the block or open asked (measured on an H100:
/// served-block-h100.log; tests/gpu/probes/alloc_sizes.cpp ipc_tail and
/// ipc_attrs): its size the bytes asked, its context the one it was served
/// or opened in (the mapping has none). A served block is also legacy-IPC
/// capable and has no shareable handle type: the driver wrote 0 and 1 (the
/// POSIX descriptor) for the mapping, in the width the caller's variable
/// has, so only their lowest byte changes and any width reads 1 and 0. An
/// open answers those as the mapping does. SYNC_MEMOPS, 0 for the mapping,
/// is what the application set (in its lowest byte likewise).
void as_asked_block(CUpointer_attribute attr, void* data, const BlockAsked& asked) {
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<size_t*>(data) = asked.bytes;
      break;
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      if (asked.ctx) *static_cast<CUcontext*>(data) = asked.ctx;
      break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      if (asked.kind == BlockAsked::Kind::kServed) *static_cast<unsigned char*>(data) = 1;
      break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      if (asked.kind == BlockAsked::Kind::kServed) *static_cast<unsigned char*>(data) = 0;
      break;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:  // the mapping's is 0
      *static_cast<unsigned char*>(data) = asked.sync_memops;
      break;
    default:
      break;
  }
}

}  // namespace

Served served_at_locked(State& s, CUdeviceptr ptr, ServedBlock* block) {
  auto m = containing(s, ptr);
  if (m == s.ranges.end() || m->second.asked.kind == BlockAsked::Kind::kNone) return Served::kNo;
  block->alloc = m->second.alloc;
  block->offset = ptr - m->first;
  block->asked = m->second.asked;
  if (block->offset >= block->asked.bytes) return Served::kTail;
  return block->asked.kind == BlockAsked::Kind::kOpened ? Served::kOpened : Served::kYes;
}

void set_tail(State& s, uint64_t addr, uint64_t asked, uint64_t size) {
  if (asked >= size) return;
  std::unique_lock<WriterFirstLock> l(s.tails_mu);
  s.tails[addr] = State::Tail{addr + asked, addr + size};
  s.tailed_blocks.store(s.tails.size(), std::memory_order_relaxed);
}

void drop_tail(State& s, uint64_t addr) noexcept {
  if (s.tailed_blocks.load(std::memory_order_relaxed) == 0) return;
  std::unique_lock<WriterFirstLock> l(s.tails_mu);
  s.tails.erase(addr);
  s.tailed_blocks.store(s.tails.size(), std::memory_order_relaxed);
}

bool past_block(CUdeviceptr p, size_t n) noexcept {
  if (n == 0 || !active()) return false;  // a forked child drops the parent's blocks first
  State& s = state();
  if (s.tailed_blocks.load(std::memory_order_relaxed) == 0) return false;
  try {
    std::shared_lock<WriterFirstLock> l(s.tails_mu);
    auto t = s.tails.upper_bound(p);
    if (t == s.tails.begin()) return false;
    --t;  // the last block at or below p
    const State::Tail& tail = t->second;
    if (p >= tail.end) return false;  // not in its mapping: the driver's to answer
    return p >= tail.asked_end || n > tail.asked_end - p;
  } catch (...) {  // the driver's answer stands
  }
  return false;
}

CUresult pointer_get_attr(decltype(&::cuPointerGetAttribute) real, void* data,
                          CUpointer_attribute attr, CUdeviceptr ptr) noexcept {
  BlockAsked asked;
  Served where = Served::kNo;
  try {
    where = served_at(ptr, &asked);
  } catch (...) {  // the driver's answer stands
  }
  if (where == Served::kTail) return CUDA_ERROR_INVALID_VALUE;  // as for no CUDA pointer
  const CUresult r = real(data, attr, ptr);
  if (r == CUDA_SUCCESS && data && (where == Served::kYes || where == Served::kOpened))
    as_asked_block(attr, data, asked);
  return r;
}

CUresult pointer_get_attrs(decltype(&::cuPointerGetAttributes) real, unsigned int n,
                           CUpointer_attribute* attrs, void** data, CUdeviceptr ptr) noexcept {
  const CUresult r = real(n, attrs, data, ptr);
  if (r != CUDA_SUCCESS || !attrs || !data) return r;
  try {
    BlockAsked asked;
    const Served where = served_at(ptr, &asked);
    if (where == Served::kNo) return r;
    for (unsigned int i = 0; i < n; ++i) {
      if (!data[i]) continue;
      if (where == Served::kTail)
        as_unknown(attrs[i], data[i]);
      else
        as_asked_block(attrs[i], data[i], asked);
    }
  } catch (...) {
  }
  return r;
}

CUresult mem_get_range(decltype(&::cuMemGetAddressRange_v2) real, CUdeviceptr* pbase, size_t* psize,
                       CUdeviceptr ptr) noexcept {
  BlockAsked asked;
  Served where = Served::kNo;
  try {
    where = served_at(ptr, &asked);
  } catch (...) {
  }
  if (where == Served::kTail) {  // as for an address of no memory: the driver
    if (pbase) *pbase = 0;       // writes 0 into both variables (measured on
    if (psize) *psize = 0;       // an H100: tests/gpu/probes/alloc_sizes.cpp)
    return CUDA_ERROR_NOT_FOUND;
  }
  const CUresult r = real(pbase, psize, ptr);
  if (r == CUDA_SUCCESS && psize && (where == Served::kYes || where == Served::kOpened))
    *psize = asked.bytes;
  return r;
}

CUresult mem_get_access(decltype(&::cuMemGetAccess) real, unsigned long long* flags,
                        const CUmemLocation* location, CUdeviceptr ptr) noexcept {
  Served where = Served::kNo;
  try {
    BlockAsked asked;
    where = served_at(ptr, &asked);
  } catch (...) {  // the driver's answer stands
  }
  if (where == Served::kTail) {
    // No memory, as for a freed block's address: the driver checks the
    // arguments, then refuses (measured on an H100). The mapping's flags
    // are not written into the caller's variable.
    unsigned long long scratch = 0;
    const CUresult r = real(flags ? &scratch : nullptr, location, ptr);
    return r == CUDA_SUCCESS ? CUDA_ERROR_INVALID_VALUE : r;
  }
  const CUresult r = real(flags, location, ptr);
  if (r == CUDA_SUCCESS && flags && where != Served::kNo) *flags = 0;
  return r;
}

CUresult pointer_set_attr(decltype(&::cuPointerSetAttribute) real, const void* value,
                          CUpointer_attribute attr, CUdeviceptr ptr) noexcept {
  if (attr != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS || !value || !active()) {
    return real(value, attr, ptr);
  }
  try {
    BlockAsked asked;
    const Served where = served_at(ptr, &asked);
    if (where == Served::kNo) return real(value, attr, ptr);
    if (where == Served::kTail) return CUDA_ERROR_INVALID_VALUE;  // as for no CUDA pointer
    // The driver's cuMemAlloc block takes the attribute (measured:
    // served-block-h100.log), and so does its IPC open (alloc_sizes.cpp
    // ipc_attrs, on an H100), that MPI and UCX transports set before an RDMA
    // adapter reads the block, so that a synchronous copy into it has landed
    // when it returns. On the driver it is the block's own attribute, no
    // context's flag (alloc_sizes.cpp ctx_attrs); for VMM memory the driver
    // offers only the context's flag, set here on the block's context, or
    // the open's (pushed when another is current). The block's record keeps
    // what was set, which the queries read back. The flag covers every
    // block of the context, so a 0 (the attribute cleared) leaves it: the
    // guarantee stays, stronger than asked.
    const bool on = *static_cast<const unsigned*>(value) != 0;
    auto record = [&s = state(), ptr, on] {
      Lock l(s.mu);
      auto m = containing(s, ptr);
      if (m != s.ranges.end() && m->second.asked.kind != BlockAsked::Kind::kNone)
        m->second.asked.sync_memops = on;
    };
    if (!on) {
      record();
      return CUDA_SUCCESS;
    }
    auto get_flags = REAL(cuCtxGetFlags);
    auto set_flags = REAL(cuCtxSetFlags);
    auto push = REAL(cuCtxPushCurrent_v2);
    auto pop = REAL(cuCtxPopCurrent_v2);
    if (!get_flags || !set_flags) return real(value, attr, ptr);  // a driver older than 12.1
    const bool pushed = asked.ctx && push && pop && push(asked.ctx) == CUDA_SUCCESS;
    unsigned flags = 0;
    CUresult r = get_flags(&flags);
    if (r == CUDA_SUCCESS && !(flags & CU_CTX_SYNC_MEMOPS))
      r = set_flags(flags | CU_CTX_SYNC_MEMOPS);
    if (pushed) {
      CUcontext popped = nullptr;
      pop(&popped);
    }
    if (r == CUDA_SUCCESS) record();
    return r;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

}  // namespace cusnap::shim::track
