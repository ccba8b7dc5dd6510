// Streams (synchronous: every operation completes before its call returns),
// events, and modules whose functions do nothing when launched.
#include "gate.h"
#include "state.h"

#include <chrono>

using namespace fc;

namespace {

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

CUresult stream_create(CUstream* ph, unsigned flags, int priority) {
  FC_REQUIRE_INIT();
  if (!ph || (flags & ~1u)) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  Context* c = current_ctx();
  if (!valid_ctx(reinterpret_cast<CUcontext>(c))) return CUDA_ERROR_INVALID_CONTEXT;
  auto* s = new Stream;
  s->ctx = reinterpret_cast<CUcontext>(c);
  s->flags = flags;
  s->priority = priority;
  d.streams.insert(s);
  *ph = reinterpret_cast<CUstream>(s);
  return CUDA_SUCCESS;
}

CUresult stream_destroy(CUstream h) {
  FC_REQUIRE_INIT();
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  auto* s = reinterpret_cast<Stream*>(h);
  if (!h || !d.streams.count(s)) return CUDA_ERROR_INVALID_HANDLE;
  d.streams.erase(s);
  delete s;
  return CUDA_SUCCESS;
}

CUresult stream_check(CUstream h) {
  FC_REQUIRE_INIT();
  std::lock_guard<std::mutex> l(driver().mu);
  return valid_stream(h) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult event_destroy(CUevent h) {
  FC_REQUIRE_INIT();
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  auto* e = reinterpret_cast<Event*>(h);
  if (!h || !d.events.count(e)) return CUDA_ERROR_INVALID_HANDLE;
  d.events.erase(e);
  delete e;
  return CUDA_SUCCESS;
}

CUresult event_record(CUevent h, CUstream s) {
  FC_REQUIRE_INIT();
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  auto* e = reinterpret_cast<Event*>(h);
  if (!h || !d.events.count(e) || !valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
  e->recorded = true;
  e->time_ms = now_ms();
  return CUDA_SUCCESS;
}

CUresult elapsed(float* ms, CUevent a, CUevent b) {
  FC_REQUIRE_INIT();
  if (!ms) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  auto *ea = reinterpret_cast<Event*>(a), *eb = reinterpret_cast<Event*>(b);
  if (!a || !b || !d.events.count(ea) || !d.events.count(eb)) return CUDA_ERROR_INVALID_HANDLE;
  if ((ea->flags | eb->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
  if (!ea->recorded || !eb->recorded) return CUDA_ERROR_NOT_READY;
  *ms = static_cast<float>(eb->time_ms - ea->time_ms);
  return CUDA_SUCCESS;
}

CUresult module_load(CUmodule* m, const void* image) {
  FC_REQUIRE_INIT();
  if (!m || !image) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  if (!valid_ctx(reinterpret_cast<CUcontext>(current_ctx()))) return CUDA_ERROR_INVALID_CONTEXT;
  auto* mod = new Module;
  d.modules.insert(mod);
  *m = reinterpret_cast<CUmodule>(mod);
  return CUDA_SUCCESS;
}

CUresult launch(CUfunction f, CUstream s) {
  FC_REQUIRE_INIT();
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  if (!f || !d.functions.count(reinterpret_cast<Function*>(f))) return CUDA_ERROR_INVALID_HANDLE;
  if (!valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
  return CUDA_SUCCESS;
}

}  // namespace

FC_EXPORT CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  FC_ENTER("cuStreamCreate");
  return stream_create(phStream, Flags, 0);
}
FC_EXPORT CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags,
                                              int priority) {
  FC_ENTER("cuStreamCreateWithPriority");
  return stream_create(phStream, flags, priority);
}
FC_EXPORT CUresult cuStreamDestroy(CUstream hStream) {
  FC_ENTER("cuStreamDestroy");
  return stream_destroy(hStream);
}
FC_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
  FC_ENTER("cuStreamDestroy");
  return stream_destroy(hStream);
}
FC_EXPORT CUresult cuStreamSynchronize(CUstream hStream) {
  FC_ENTER("cuStreamSynchronize");
  return stream_check(hStream);
}
FC_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream) {
  FC_ENTER("cuStreamSynchronize");
  return stream_check(hStream);
}
FC_EXPORT CUresult cuStreamQuery(CUstream hStream) {
  FC_ENTER("cuStreamQuery");
  return stream_check(hStream);
}
FC_EXPORT CUresult cuStreamQuery_ptsz(CUstream hStream) {
  FC_ENTER("cuStreamQuery");
  return stream_check(hStream);
}

FC_EXPORT CUresult cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  FC_ENTER("cuEventCreate");
  FC_REQUIRE_INIT();
  if (!phEvent || (Flags & ~0xfu)) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  if (!valid_ctx(reinterpret_cast<CUcontext>(current_ctx()))) return CUDA_ERROR_INVALID_CONTEXT;
  auto* e = new Event;
  e->flags = Flags;
  d.events.insert(e);
  *phEvent = reinterpret_cast<CUevent>(e);
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuEventDestroy(CUevent hEvent) {
  FC_ENTER("cuEventDestroy");
  return event_destroy(hEvent);
}
FC_EXPORT CUresult cuEventDestroy_v2(CUevent hEvent) {
  FC_ENTER("cuEventDestroy");
  return event_destroy(hEvent);
}
FC_EXPORT CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
  FC_ENTER("cuEventRecord");
  return event_record(hEvent, hStream);
}
FC_EXPORT CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) {
  FC_ENTER("cuEventRecord");
  return event_record(hEvent, hStream);
}
FC_EXPORT CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int) {
  FC_ENTER("cuEventRecordWithFlags");
  return event_record(hEvent, hStream);
}
FC_EXPORT CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int) {
  FC_ENTER("cuEventRecordWithFlags");
  return event_record(hEvent, hStream);
}
FC_EXPORT CUresult cuEventQuery(CUevent hEvent) {
  FC_ENTER("cuEventQuery");
  FC_REQUIRE_INIT();
  std::lock_guard<std::mutex> l(driver().mu);
  return driver().events.count(reinterpret_cast<Event*>(hEvent)) ? CUDA_SUCCESS
                                                                 : CUDA_ERROR_INVALID_HANDLE;
}
FC_EXPORT CUresult cuEventSynchronize(CUevent hEvent) {
  FC_ENTER("cuEventSynchronize");
  FC_REQUIRE_INIT();
  std::lock_guard<std::mutex> l(driver().mu);
  return driver().events.count(reinterpret_cast<Event*>(hEvent)) ? CUDA_SUCCESS
                                                                 : CUDA_ERROR_INVALID_HANDLE;
}
FC_EXPORT CUresult cuEventElapsedTime(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  FC_ENTER("cuEventElapsedTime");
  return elapsed(pMilliseconds, hStart, hEnd);
}
FC_EXPORT CUresult cuEventElapsedTime_v2(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  FC_ENTER("cuEventElapsedTime");
  return elapsed(pMilliseconds, hStart, hEnd);
}

FC_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  FC_ENTER("cuModuleLoadData");
  return module_load(module, image);
}
FC_EXPORT CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int,
                                      CUjit_option*, void**) {
  FC_ENTER("cuModuleLoadDataEx");
  return module_load(module, image);
}
FC_EXPORT CUresult cuModuleLoadFatBinary(CUmodule* module, const void* fatCubin) {
  FC_ENTER("cuModuleLoadFatBinary");
  return module_load(module, fatCubin);
}
FC_EXPORT CUresult cuModuleUnload(CUmodule hmod) {
  FC_ENTER("cuModuleUnload");
  FC_REQUIRE_INIT();
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  auto* m = reinterpret_cast<Module*>(hmod);
  if (!hmod || !d.modules.count(m)) return CUDA_ERROR_INVALID_HANDLE;
  for (auto it = d.functions.begin(); it != d.functions.end();) {
    if ((*it)->module == hmod) {
      delete *it;
      it = d.functions.erase(it);
    } else {
      ++it;
    }
  }
  d.modules.erase(m);
  delete m;
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  FC_ENTER("cuModuleGetFunction");
  FC_REQUIRE_INIT();
  if (!hfunc || !name) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  if (!hmod || !d.modules.count(reinterpret_cast<Module*>(hmod))) return CUDA_ERROR_INVALID_HANDLE;
  auto* f = new Function;
  f->module = hmod;
  d.functions.insert(f);
  *hfunc = reinterpret_cast<CUfunction>(f);
  return CUDA_SUCCESS;
}

#define FC_LAUNCH_PARAMS                                                              \
  CUfunction f, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, \
      unsigned int, unsigned int, CUstream hStream, void **, void **
FC_EXPORT CUresult cuLaunchKernel(FC_LAUNCH_PARAMS) {
  FC_ENTER("cuLaunchKernel");
  return launch(f, hStream);
}
FC_EXPORT CUresult cuLaunchKernel_ptsz(FC_LAUNCH_PARAMS) {
  FC_ENTER("cuLaunchKernel");
  return launch(f, hStream);
}

FC_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void**, void**) {
  FC_ENTER("cuLaunchKernelEx");
  if (!config) return CUDA_ERROR_INVALID_VALUE;
  return launch(f, config->hStream);
}
FC_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void**,
                                         void**) {
  FC_ENTER("cuLaunchKernelEx");
  if (!config) return CUDA_ERROR_INVALID_VALUE;
  return launch(f, config->hStream);
}
