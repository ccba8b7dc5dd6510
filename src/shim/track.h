// Tracking of shared device memory (DESIGN.md §3; docs/shim.md "Tracking").
//
// Active when the process runs under cusnap ($CUSNAP_RUNTIME_DIR names the job's
// runtime directory) unless $CUSNAP_SHIM_TRACK=0; otherwise every function
// here forwards to the real driver unchanged. Each takes the real function
// (never null: the wrapper failed closed before) and the application's
// arguments, and returns a CUresult; nothing throws out of here.
//
// State and locks (track_state.h): State::mu (the main lock) guards the tables and
// is held only for table work, never across a driver call, and never by the
// listener threads' descriptor path; State::cache_mu guards the export cache
// (allocation id -> the real descriptor), the only thing the peer listener
// reads; State::tails_mu guards the copy check's table of blocks with a
// tail, which every copy and memset reads (shared) with no other lock. Lock
// order: mu before cache_mu, then the fork table's lock (fork_table.h);
// tails_mu last, nothing taken under it (a fork does not take it: a forked
// child renews it). State::reap_mu and State::access_mu (held across driver
// calls; renewed in a forked child too) come before mu. All are taken inside
// the gate.
#pragma once

#include <vector>

#include "shim/entries.h"

namespace cusnap::shim::track {

/// The first CUDA activity of a process (cuInit, any tracked call, a
/// cuGetProcAddress resolution): starts tracking when enabled (sockets,
/// listener threads), and in a forked child drops the inherited records.
void note_activity() noexcept;
/// Whether tracking is active in this process (after note_activity).
bool active() noexcept;

using PfnInit = CUresult(CUDAAPI*)(unsigned int);
CUresult init(PfnInit real, unsigned int flags) noexcept;

CUresult mem_create(decltype(&::cuMemCreate) real, CUmemGenericAllocationHandle* handle,
                    size_t size, const CUmemAllocationProp* prop,
                    unsigned long long flags) noexcept;
CUresult mem_release(decltype(&::cuMemRelease) real, CUmemGenericAllocationHandle handle) noexcept;
CUresult mem_export(decltype(&::cuMemExportToShareableHandle) real, void* shareable,
                    CUmemGenericAllocationHandle handle, CUmemAllocationHandleType type,
                    unsigned long long flags) noexcept;
CUresult mem_import(decltype(&::cuMemImportFromShareableHandle) real,
                    CUmemGenericAllocationHandle* handle, void* os_handle,
                    CUmemAllocationHandleType type) noexcept;
CUresult mem_retain(decltype(&::cuMemRetainAllocationHandle) real,
                    CUmemGenericAllocationHandle* handle, void* addr) noexcept;
CUresult mem_map(decltype(&::cuMemMap) real, CUdeviceptr ptr, size_t size, size_t offset,
                 CUmemGenericAllocationHandle handle, unsigned long long flags) noexcept;
CUresult mem_unmap(decltype(&::cuMemUnmap) real, CUdeviceptr ptr, size_t size) noexcept;
CUresult mem_set_access(decltype(&::cuMemSetAccess) real, CUdeviceptr ptr, size_t size,
                        const CUmemAccessDesc* desc, size_t count) noexcept;
CUresult mem_get_props(decltype(&::cuMemGetAllocationPropertiesFromHandle) real,
                       CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) noexcept;

CUresult mem_alloc(decltype(&::cuMemAlloc_v2) real, CUdeviceptr* dptr, size_t bytes) noexcept;
CUresult mem_free(decltype(&::cuMemFree_v2) real, CUdeviceptr dptr) noexcept;
/// cuMemFreeAsync (ptsz: its per-thread-stream form) of a block the shim
/// serves: the driver refuses a VMM-mapped address there, so the shim
/// records an event on the stream and frees the block once it completed
/// (track_legacy.cpp), returning at once. Blocks that are not the shim's go
/// to the driver.
CUresult mem_free_async(decltype(&::cuMemFreeAsync) real, CUdeviceptr dptr, CUstream stream,
                        bool ptsz) noexcept;
/// What goes with a context (track_contexts.cpp): a block the shim served
/// in it, a legacy IPC open made in it, a block left to the driver there, a
/// free in stream order whose event is the context's.
struct ContextMemory {
  enum Kind : uint8_t { kServedBlock, kIpcOpen, kDriverBlock, kPendingFree };
  uint64_t addr = 0;
  uint64_t id = 0;  ///< its allocation's id; 0 for a driver block or a foreign IPC open
  Kind kind = kServedBlock;
};
/// A context about to go and what goes with it.
struct ContextGoing {
  CUcontext ctx = nullptr;
  std::vector<ContextMemory> memory;
  bool empty() const { return memory.empty(); }
};
/// Keeps the frees in stream order from being reaped while it lives: held
/// around a context's destroy and context_gone, so that no event of the
/// context is queried once the driver destroyed it. Holds nothing where the
/// shim tracks nothing (no free is pending there).
class ReapHold {
 public:
  ReapHold() noexcept;
  ~ReapHold();
  ReapHold(const ReapHold&) = delete;
  ReapHold& operator=(const ReapHold&) = delete;

 private:
  bool held_ = false;
};
/// What goes with context ctx, taken before the context goes.
ContextGoing memory_of(CUcontext ctx) noexcept;
/// Its context is gone (cuCtxDestroy; a primary context's reset or last
/// release): what of it is still there is freed, as the driver frees a
/// context's cuMemAlloc blocks and closes its IPC opens with it (the shim's
/// VMM memory would stay).
void context_gone(const ContextGoing& going) noexcept;
/// The primary context of device dev when it is active (nullptr otherwise),
/// without retaining it: what a reset or release is about to take.
CUcontext active_primary(CUdevice dev) noexcept;
/// The pointer queries inside a block the shim serves answer as for the
/// driver's cuMemAlloc block (measured: served-block-h100.log): legacy-IPC
/// capable, no shareable handle types, the size asked for, the context it
/// was allocated in. Inside a legacy IPC open of the shim's, as for the
/// driver's open (alloc_sizes.cpp ipc_attrs): the exporter's size asked, the
/// context it was opened in. The rest is the driver's answer for the
/// mapping. Past the bytes asked (the rest of the mapping) they answer as
/// for an address the driver does not know, before the driver is asked
/// (which would write the mapping's values into the caller's variables).
CUresult pointer_get_attr(decltype(&::cuPointerGetAttribute) real, void* data,
                          CUpointer_attribute attr, CUdeviceptr ptr) noexcept;
CUresult pointer_get_attrs(decltype(&::cuPointerGetAttributes) real, unsigned int n,
                           CUpointer_attribute* attrs, void** data, CUdeviceptr ptr) noexcept;
CUresult mem_get_range(decltype(&::cuMemGetAddressRange_v2) real, CUdeviceptr* base, size_t* size,
                       CUdeviceptr ptr) noexcept;
/// Whether a copy or memset of the bytes [p, p + n) reaches past the bytes
/// asked of a block the shim serves, or of a legacy IPC open of the shim's
/// (the exporter's bytes asked): it starts in the rest of the mapping or
/// crosses the block's end, which the driver refuses for its own block and
/// open (INVALID_VALUE; measured on an H100: tests/gpu/probes/alloc_sizes.cpp
/// tail, ipc_tail). While none has such a tail (sizes of whole granules, as
/// PyTorch's caching allocator asks), a few atomic loads; otherwise a lookup
/// in the copy check's table under its own lock. n == 0: false.
bool past_block(CUdeviceptr p, size_t n) noexcept;
/// cuMemGetAccess inside a block the shim serves or a legacy IPC open of the
/// shim's: 0, as the driver answers for its own cuMemAlloc block and open,
/// which are no VMM mappings; in the rest of its mapping, past the bytes
/// asked, INVALID_VALUE, as for no memory (measured on an H100:
/// tests/gpu/probes/alloc_sizes.cpp ctx_attrs, ipc_attrs). Anything else:
/// the driver's answer.
CUresult mem_get_access(decltype(&::cuMemGetAccess) real, unsigned long long* flags,
                        const CUmemLocation* location, CUdeviceptr ptr) noexcept;
/// cuPointerSetAttribute(SYNC_MEMOPS) inside a block the shim serves or a
/// legacy IPC open of the shim's: the driver refuses it for VMM memory
/// (NOT_SUPPORTED), so the shim sets the block's (or the open's) context's
/// CU_CTX_SYNC_MEMOPS instead, the driver's way to the same guarantee for
/// such memory (every synchronous memory operation of the context
/// synchronizes), and records the value on the block, which the pointer
/// queries read back as the driver's block attribute reads (with any
/// context current). Anything else goes to the driver.
CUresult pointer_set_attr(decltype(&::cuPointerSetAttribute) real, const void* value,
                          CUpointer_attribute attr, CUdeviceptr ptr) noexcept;
/// Peer access: a cuMemAlloc block served by a VMM mapping gets access for
/// every device whose context enabled peer access to the block's device.
CUresult ctx_enable_peer(decltype(&::cuCtxEnablePeerAccess) real, CUcontext peer,
                         unsigned int flags) noexcept;
CUresult ctx_disable_peer(decltype(&::cuCtxDisablePeerAccess) real, CUcontext peer) noexcept;
CUresult ipc_get(decltype(&::cuIpcGetMemHandle) real, CUipcMemHandle* h, CUdeviceptr dptr) noexcept;
CUresult ipc_open(decltype(&::cuIpcOpenMemHandle_v2) real, CUdeviceptr* dptr, CUipcMemHandle h,
                  unsigned int flags) noexcept;
CUresult ipc_close(decltype(&::cuIpcCloseMemHandle) real, CUdeviceptr dptr) noexcept;

CUresult mc_create(decltype(&::cuMulticastCreate) real, CUmemGenericAllocationHandle* mc,
                   const CUmulticastObjectProp* prop) noexcept;
CUresult mc_add_device(decltype(&::cuMulticastAddDevice) real, CUmemGenericAllocationHandle mc,
                       CUdevice dev) noexcept;
/// Both bind ABIs: dev < 0 with real_v1 (CUDA < 13.1), dev >= 0 with real_v2.
using PfnBindMemV1 = CUresult(CUDAAPI*)(CUmemGenericAllocationHandle, size_t,
                                        CUmemGenericAllocationHandle, size_t, size_t,
                                        unsigned long long);
using PfnBindMemV2 = CUresult(CUDAAPI*)(CUmemGenericAllocationHandle, CUdevice, size_t,
                                        CUmemGenericAllocationHandle, size_t, size_t,
                                        unsigned long long);
using PfnBindAddrV1 = CUresult(CUDAAPI*)(CUmemGenericAllocationHandle, size_t, CUdeviceptr, size_t,
                                         unsigned long long);
using PfnBindAddrV2 = CUresult(CUDAAPI*)(CUmemGenericAllocationHandle, CUdevice, size_t,
                                         CUdeviceptr, size_t, unsigned long long);
CUresult mc_bind_mem(PfnBindMemV1 v1, PfnBindMemV2 v2, CUmemGenericAllocationHandle mc,
                     CUdevice dev, size_t mc_offset, CUmemGenericAllocationHandle mem,
                     size_t mem_offset, size_t size, unsigned long long flags) noexcept;
CUresult mc_bind_addr(PfnBindAddrV1 v1, PfnBindAddrV2 v2, CUmemGenericAllocationHandle mc,
                      CUdevice dev, size_t mc_offset, CUdeviceptr ptr, size_t size,
                      unsigned long long flags) noexcept;
CUresult mc_unbind(decltype(&::cuMulticastUnbind) real, CUmemGenericAllocationHandle mc,
                   CUdevice dev, size_t mc_offset, size_t size) noexcept;

/// A context the application created (alive) or is about to destroy: the
/// checkpoint's drain synchronizes every created context besides the
/// primary ones. A no-op while tracking is off.
void note_context(CUcontext ctx, bool alive) noexcept;

/// pthread_atfork handlers (build_info.cpp registers them).
void atfork_prepare() noexcept;
void atfork_parent() noexcept;
void atfork_child() noexcept;

}  // namespace cusnap::shim::track
