// Legacy IPC over the memfd mechanism. The 64-byte handle names the creator's
// pid and allocation id; the opener asks the creator's control socket for the
// memfd (SCM_RIGHTS) and maps it at an address it chooses.
#include "control.h"
#include "gate.h"
#include "memory.h"

#include <unistd.h>

#include <cstring>

using namespace fc;

namespace {

constexpr uint32_t kIpcMagic = 0x66634950;  // "fcIP"

struct IpcHandle {
  uint32_t magic;
  int32_t pid;
  uint64_t id;
  uint64_t size;       ///< the block's mapping, whole granules
  uint64_t requested;  ///< the bytes asked of it: what an open of it is
};
static_assert(sizeof(IpcHandle) <= CU_IPC_HANDLE_SIZE);

/// An open of h that already exists where context c (valid) would open it
/// (Driver::mu held). One in c: a reference more, its address in *pdptr,
/// CUDA_SUCCESS. One in another live context of c's device:
/// CUDA_ERROR_INVALID_HANDLE, as on the driver, which lets one context per
/// device open a handle (measured on an H200, driver 580.159.04,
/// tests/gpu/probes/context_ipc.cpp). Neither (none, or only in contexts of
/// other devices): CUDA_ERROR_NOT_FOUND, and the caller opens it anew.
CUresult existing_open(const IpcHandle& h, const Context* c, CUdeviceptr* pdptr) {
  Driver& d = driver();
  for (auto& [va, o] : d.ipc_opens) {
    if (o.creator != h.pid || o.creator_id != h.id) continue;
    if (o.owner == c) {
      ++o.refs;
      *pdptr = va;
      return CUDA_SUCCESS;
    }
    // A context's opens are closed when it goes (free_context_blocks).
    auto* other = const_cast<Context*>(static_cast<const Context*>(o.owner));
    if (d.contexts.count(other) && other->dev == c->dev) return CUDA_ERROR_INVALID_HANDLE;
  }
  return CUDA_ERROR_NOT_FOUND;
}

}  // namespace

FC_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  FC_ENTER("cuIpcGetMemHandle");
  FC_REQUIRE_INIT();
  if (!pHandle) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(driver().mu);
  // Past the block's bytes the address is unknown (measured on an H100:
  // tests/gpu/probes/alloc_sizes.cpp tail).
  Mapping* m = find_known(dptr, nullptr, nullptr);
  if (!m) return CUDA_ERROR_INVALID_VALUE;
  Allocation* a = find_alloc(m->alloc);
  if (!a || a->kind != AllocKind::kLegacy) return CUDA_ERROR_INVALID_VALUE;
  IpcHandle h{kIpcMagic, static_cast<int32_t>(getpid()), a->id, a->size, a->requested};
  memset(pHandle, 0, sizeof *pHandle);
  memcpy(pHandle->reserved, &h, sizeof h);
  return CUDA_SUCCESS;
}

static CUresult ipc_open(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int flags) {
  FC_REQUIRE_INIT();
  if (!pdptr || (flags & ~static_cast<unsigned>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)))
    return CUDA_ERROR_INVALID_VALUE;
  IpcHandle h;
  memcpy(&h, handle.reserved, sizeof h);
  if (h.magic != kIpcMagic || h.pid <= 0 || h.size == 0 || h.size % kGranularity ||
      h.requested == 0 || h.requested > h.size)
    return CUDA_ERROR_INVALID_VALUE;
  if (h.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT;
  Driver& d = driver();
  {
    std::lock_guard<std::mutex> l(d.mu);
    Context* c = current_ctx();
    if (!valid_ctx(reinterpret_cast<CUcontext>(c))) return CUDA_ERROR_INVALID_CONTEXT;
    if (CUresult r = existing_open(h, c, pdptr); r != CUDA_ERROR_NOT_FOUND) return r;
  }
  // Ask the creator for the memfd without holding our own lock.
  CtlRequest req{};
  req.magic = kCtlMagic;
  req.op = CtlOp::kGetIpcFd;
  req.arg = h.id;
  CtlReply reply{};
  int fd = -1;
  if (ctl_call(h.pid, req, &reply, &fd) != CUDA_SUCCESS || reply.result != CUDA_SUCCESS || fd < 0) {
    if (fd >= 0) close(fd);
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::lock_guard<std::mutex> l(d.mu);
  // The lock was let go meanwhile: the context may be gone, or have opened h.
  Context* c = current_ctx();
  CUresult r = valid_ctx(reinterpret_cast<CUcontext>(c)) ? existing_open(h, c, pdptr)
                                                         : CUDA_ERROR_INVALID_CONTEXT;
  if (r != CUDA_ERROR_NOT_FOUND) {
    close(fd);
    return r;
  }
  uint64_t id = 0;
  bool reused = false;
  r = adopt_allocation(fd, AllocKind::kIpcImport, &id, &reused);
  close(fd);
  if (r != CUDA_SUCCESS) return r;
  Allocation* a = find_alloc(id);
  if (reused && a->kind != AllocKind::kIpcImport) return CUDA_ERROR_INVALID_VALUE;
  // The open is the bytes the exporter asked, the rest of its mapping
  // unknown, as on the driver (measured on an H100, driver 580.159.04:
  // tests/gpu/probes/alloc_sizes.cpp ipc_tail).
  a->requested = h.requested;
  uintptr_t va = 0;
  if ((r = reserve_va(a->size, kGranularity, 0, false, true, &va)) != CUDA_SUCCESS ||
      (r = map_range(va, a->size, 0, id)) != CUDA_SUCCESS) {
    if (va) free_va(va, a->size);
    maybe_destroy(id);
    return r;
  }
  Mapping& m = d.mappings[va];
  for (size_t i = 0; i < d.devices.size(); ++i) m.access[i] = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  apply_access(va, m);
  d.ipc_opens[va] = IpcOpen{1, h.pid, h.id, c};
  *pdptr = va;
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle,
                                         unsigned int Flags) {
  FC_ENTER("cuIpcOpenMemHandle");
  return ipc_open(pdptr, handle, Flags);
}

FC_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle,
                                      unsigned int Flags) {
  FC_ENTER("cuIpcOpenMemHandle");
  return ipc_open(pdptr, handle, Flags);
}

FC_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  FC_ENTER("cuIpcCloseMemHandle");
  FC_REQUIRE_INIT();
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  auto it = d.ipc_opens.find(dptr);
  if (it == d.ipc_opens.end()) return CUDA_ERROR_INVALID_VALUE;
  if (--it->second.refs > 0) return CUDA_SUCCESS;
  d.ipc_opens.erase(it);
  Mapping* m = find_mapping(dptr, nullptr);
  if (!m) return CUDA_ERROR_INVALID_VALUE;
  size_t size = m->size;
  unmap_range(dptr, size);
  free_va(dptr, size);
  return CUDA_SUCCESS;
}
