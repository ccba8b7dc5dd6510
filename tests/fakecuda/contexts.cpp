// Primary contexts, created contexts and the per-thread context stack.
#include "gate.h"
#include "memory.h"
#include "state.h"

#include <algorithm>

using namespace fc;

namespace {

CUresult ctx_create(CUcontext* pctx, unsigned flags, CUdevice dev) {
  FC_REQUIRE_INIT();
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  auto* c = new Context;
  c->dev = dev;
  c->flags = flags;
  c->id = d.next_ctx_id++;
  d.contexts.insert(c);
  ctx_stack().push_back(reinterpret_cast<CUcontext>(c));
  *pctx = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}

/// Removes ctx from this thread's stack (other threads keep a dangling entry,
/// as with the real driver, and get CUDA_ERROR_INVALID_CONTEXT from it).
void drop_from_stack(CUcontext ctx) {
  auto& st = ctx_stack();
  st.erase(std::remove(st.begin(), st.end(), ctx), st.end());
}

CUresult ctx_destroy(CUcontext ctx) {
  FC_REQUIRE_INIT();
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  if (!valid_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  auto* c = reinterpret_cast<Context*>(ctx);
  if (c->primary) return CUDA_ERROR_INVALID_CONTEXT;
  d.contexts.erase(c);
  free_context_blocks(c);
  for (auto it = d.peer_access.begin(); it != d.peer_access.end();)
    it = (it->first == c || it->second == c) ? d.peer_access.erase(it) : std::next(it);
  drop_from_stack(ctx);
  delete c;
  return CUDA_SUCCESS;
}

CUresult ctx_push(CUcontext ctx) {
  FC_REQUIRE_INIT();
  std::lock_guard<std::mutex> l(driver().mu);
  if (!valid_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  ctx_stack().push_back(ctx);
  return CUDA_SUCCESS;
}

CUresult ctx_pop(CUcontext* pctx) {
  FC_REQUIRE_INIT();
  auto& st = ctx_stack();
  if (st.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx) *pctx = st.back();
  st.pop_back();
  return CUDA_SUCCESS;
}

CUresult primary_release(CUdevice dev) {
  FC_REQUIRE_INIT();
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  Context* p = d.primary[dev];
  if (p->primary_refs <= 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--p->primary_refs == 0) free_context_blocks(p);  // the last release destroys it
  return CUDA_SUCCESS;
}

CUresult primary_set_flags(CUdevice dev, unsigned flags) {
  FC_REQUIRE_INIT();
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (flags & ~0xffu) return CUDA_ERROR_INVALID_VALUE;
  d.primary[dev]->flags = flags;
  return CUDA_SUCCESS;
}

CUresult primary_reset(CUdevice dev) {
  FC_REQUIRE_INIT();
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  d.primary[dev]->primary_refs = 0;
  d.primary[dev]->flags = 0;
  free_context_blocks(d.primary[dev]);  // "destroy all allocations
  return CUDA_SUCCESS;
}

CUresult ctx_get_device(CUdevice* device, CUcontext ctx) {
  FC_REQUIRE_INIT();
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(driver().mu);
  if (!ctx) ctx = reinterpret_cast<CUcontext>(current_ctx());
  if (!valid_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  *device = reinterpret_cast<Context*>(ctx)->dev;
  return CUDA_SUCCESS;
}

/// Waits for the context's asynchronous kernels (kernels.cpp), every stream.
CUresult ctx_sync(CUcontext ctx) {
  FC_REQUIRE_INIT();
  return ctx_synchronize(ctx);
}

}  // namespace

FC_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  FC_ENTER("cuDevicePrimaryCtxRetain");
  FC_REQUIRE_INIT();
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  ++d.primary[dev]->primary_refs;
  *pctx = reinterpret_cast<CUcontext>(d.primary[dev]);
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  FC_ENTER("cuDevicePrimaryCtxRelease");
  return primary_release(dev);
}
FC_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  FC_ENTER("cuDevicePrimaryCtxRelease");
  return primary_release(dev);
}
FC_EXPORT CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
  FC_ENTER("cuDevicePrimaryCtxSetFlags");
  return primary_set_flags(dev, flags);
}
FC_EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
  FC_ENTER("cuDevicePrimaryCtxSetFlags");
  return primary_set_flags(dev, flags);
}
FC_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  FC_ENTER("cuDevicePrimaryCtxReset");
  return primary_reset(dev);
}
FC_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  FC_ENTER("cuDevicePrimaryCtxReset");
  return primary_reset(dev);
}

FC_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  FC_ENTER("cuDevicePrimaryCtxGetState");
  FC_REQUIRE_INIT();
  if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *flags = d.primary[dev]->flags;
  *active = d.primary[dev]->primary_refs > 0 ? 1 : 0;
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuCtxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  FC_ENTER("cuCtxCreate");
  return ctx_create(pctx, flags, dev);
}
FC_EXPORT CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  FC_ENTER("cuCtxCreate");
  return ctx_create(pctx, flags, dev);
}
FC_EXPORT CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* paramsArray, int numParams,
                                  unsigned int flags, CUdevice dev) {
  FC_ENTER("cuCtxCreate");
  if (numParams < 0 || (numParams > 0 && !paramsArray)) return CUDA_ERROR_INVALID_VALUE;
  return ctx_create(pctx, flags, dev);
}
FC_EXPORT CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* ctxCreateParams,
                                  unsigned int flags, CUdevice dev) {
  FC_ENTER("cuCtxCreate");
  if (ctxCreateParams && (ctxCreateParams->execAffinityParams || ctxCreateParams->cigParams))
    return CUDA_ERROR_NOT_SUPPORTED;
  return ctx_create(pctx, flags, dev);
}

FC_EXPORT CUresult cuCtxDestroy(CUcontext ctx) {
  FC_ENTER("cuCtxDestroy");
  return ctx_destroy(ctx);
}
FC_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
  FC_ENTER("cuCtxDestroy");
  return ctx_destroy(ctx);
}
FC_EXPORT CUresult cuCtxPushCurrent(CUcontext ctx) {
  FC_ENTER("cuCtxPushCurrent");
  return ctx_push(ctx);
}
FC_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  FC_ENTER("cuCtxPushCurrent");
  return ctx_push(ctx);
}
FC_EXPORT CUresult cuCtxPopCurrent(CUcontext* pctx) {
  FC_ENTER("cuCtxPopCurrent");
  return ctx_pop(pctx);
}
FC_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
  FC_ENTER("cuCtxPopCurrent");
  return ctx_pop(pctx);
}

FC_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  FC_ENTER("cuCtxSetCurrent");
  FC_REQUIRE_INIT();
  auto& st = ctx_stack();
  if (!ctx) {
    if (!st.empty()) st.pop_back();
    return CUDA_SUCCESS;
  }
  std::lock_guard<std::mutex> l(driver().mu);
  if (!valid_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (st.empty())
    st.push_back(ctx);
  else
    st.back() = ctx;
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuCtxGetCurrent(CUcontext* pctx) {
  FC_ENTER("cuCtxGetCurrent");
  FC_REQUIRE_INIT();
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  auto& st = ctx_stack();
  *pctx = st.empty() ? nullptr : st.back();
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuCtxGetDevice(CUdevice* device) {
  FC_ENTER("cuCtxGetDevice");
  return ctx_get_device(device, nullptr);
}
FC_EXPORT CUresult cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  FC_ENTER("cuCtxGetDevice");
  return ctx_get_device(device, ctx);
}

FC_EXPORT CUresult cuCtxGetFlags(unsigned int* flags) {
  FC_ENTER("cuCtxGetFlags");
  FC_REQUIRE_INIT();
  if (!flags) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(driver().mu);
  Context* c = current_ctx();
  if (!valid_ctx(reinterpret_cast<CUcontext>(c))) return CUDA_ERROR_INVALID_CONTEXT;
  *flags = c->flags;
  return CUDA_SUCCESS;
}

/// cuCtxSetFlags: the current context's flags, overwritten (the scheduling
/// flags and CU_CTX_SYNC_MEMOPS, as the driver documents).
FC_EXPORT CUresult cuCtxSetFlags(unsigned int flags) {
  FC_ENTER("cuCtxSetFlags");
  FC_REQUIRE_INIT();
  constexpr unsigned kKnown = CU_CTX_SCHED_MASK | CU_CTX_MAP_HOST | CU_CTX_LMEM_RESIZE_TO_MAX |
                              CU_CTX_COREDUMP_ENABLE | CU_CTX_USER_COREDUMP_ENABLE |
                              CU_CTX_SYNC_MEMOPS;
  if (flags & ~kKnown) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(driver().mu);
  Context* c = current_ctx();
  if (!valid_ctx(reinterpret_cast<CUcontext>(c))) return CUDA_ERROR_INVALID_CONTEXT;
  c->flags = flags;
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuCtxGetId(CUcontext ctx, unsigned long long* ctxId) {
  FC_ENTER("cuCtxGetId");
  FC_REQUIRE_INIT();
  if (!ctxId) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(driver().mu);
  if (!ctx) ctx = reinterpret_cast<CUcontext>(current_ctx());
  if (!valid_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  *ctxId = reinterpret_cast<Context*>(ctx)->id;
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int* version) {
  FC_ENTER("cuCtxGetApiVersion");
  FC_REQUIRE_INIT();
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(driver().mu);
  if (!ctx) ctx = reinterpret_cast<CUcontext>(current_ctx());
  if (!valid_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  *version = 3020;
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuCtxSynchronize(void) {
  FC_ENTER("cuCtxSynchronize");
  return ctx_sync(nullptr);
}
FC_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  FC_ENTER("cuCtxSynchronize");
  return ctx_sync(ctx);
}

FC_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags) {
  FC_ENTER("cuCtxEnablePeerAccess");
  FC_REQUIRE_INIT();
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  Context* c = current_ctx();
  if (!valid_ctx(reinterpret_cast<CUcontext>(c)) || !valid_ctx(peerContext))
    return CUDA_ERROR_INVALID_CONTEXT;
  auto* peer = reinterpret_cast<Context*>(peerContext);
  if (peer->dev == c->dev) return CUDA_ERROR_INVALID_DEVICE;
  if (!d.peer_access.insert({c, peer}).second) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuCtxDisablePeerAccess(CUcontext peerContext) {
  FC_ENTER("cuCtxDisablePeerAccess");
  FC_REQUIRE_INIT();
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  Context* c = current_ctx();
  if (!valid_ctx(reinterpret_cast<CUcontext>(c)) || !valid_ctx(peerContext))
    return CUDA_ERROR_INVALID_CONTEXT;
  if (!d.peer_access.erase({c, reinterpret_cast<Context*>(peerContext)}))
    return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
  return CUDA_SUCCESS;
}

// The profiler API (cudaProfiler.h). The driver's cuProfilerStart/Stop act on
// the current context: none (or a destroyed one) is CUDA_ERROR_INVALID_CONTEXT.
// Nothing is profiled here; starting twice or stopping while stopped succeeds,
// as on the driver.
namespace {
CUresult profiler_toggle() {
  FC_REQUIRE_INIT();
  std::lock_guard<std::mutex> l(driver().mu);
  if (!valid_ctx(reinterpret_cast<CUcontext>(current_ctx()))) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS;
}
}  // namespace

FC_EXPORT CUresult cuProfilerStart(void) {
  FC_ENTER("cuProfilerStart");
  return profiler_toggle();
}
FC_EXPORT CUresult cuProfilerStop(void) {
  FC_ENTER("cuProfilerStop");
  return profiler_toggle();
}
/// Deprecated; the CUDA 13 driver documents CUDA_ERROR_NOT_SUPPORTED as its only
/// result, so the simulated one answers that too (as a traced, gated call).
FC_EXPORT CUresult cuProfilerInitialize(const char*, const char*, CUoutput_mode) {
  FC_ENTER("cuProfilerInitialize");
  return CUDA_ERROR_NOT_SUPPORTED;
}
