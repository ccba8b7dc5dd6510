// The pointer queries of a block the shim serves for cuMemAlloc
// (cuPointerGetAttribute, cuPointerGetAttributes, cuMemGetAddressRange,
// cuPointerSetAttribute): answered as for the driver's cuMemAlloc block, the
// block being a VMM mapping underneath (measured: served-block-h100.log).
// Contract and locks: track.h; state: track_state.h; helpers: track_internal.h.
#include "shim/track.h"

#include "shim/real_driver.h"
#include "shim/track_internal.h"

namespace cusnap::shim::track {

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
    uint64_t base = 0;
    State::BlockAsked asked;
    if (!served_at(ptr, &base, &asked)) return real(value, attr, ptr);
    // The driver's cuMemAlloc block takes the attribute (measured:
    // served-block-h100.log) that MPI and UCX transports set before an RDMA
    // adapter reads the block, so that a synchronous copy into it has landed
    // when it returns; for VMM memory the driver offers the context's flag,
    // set here on the block's context (pushed when another is current). The
    // flag covers every block of the context, so a 0 (the attribute cleared)
    // leaves it: the guarantee stays, stronger than asked.
    if (*static_cast<const unsigned*>(value) == 0) return CUDA_SUCCESS;
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
    return r;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

}  // namespace cusnap::shim::track
