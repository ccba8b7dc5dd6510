// Streams, events and modules. Copies and memsets complete before their call
// returns; kernels launch as no-ops, except the asynchronous handshake kernels
// ("ncclDevKernel_Handshake*", kernels.cpp), which later operations of their
// stream, stream/event/context synchronization and stream/event queries wait
// for or report (CUDA_ERROR_NOT_READY).
// On a stream that captures into a graph (capture.cpp) a launch appends a
// kernel node and runs nothing, an event record makes a captured event, and
// cuStreamSynchronize and cuStreamQuery fail
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidate the capture; on a
// stream outside capture they are potentially unsafe calls, refused the same
// way while a GLOBAL or THREAD_LOCAL capture prohibits them.
// cuStreamWaitEvent joins captures (capture.cpp); outside capture it waits on
// the host for the kernels the event was recorded behind, as copies wait for
// their stream's (the driver orders the stream on the device and returns at
// once: here the call can block, never reorder).
#include "gate.h"
#include "state.h"

#include <chrono>
#include <cstring>

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

/// cuStreamSynchronize: waits for the stream's kernels; their sticky error.
CUresult stream_sync(CUstream h, bool ptsz) {
  FC_REQUIRE_INIT();
  StreamKey key;
  {
    std::lock_guard<std::mutex> l(driver().mu);
    if (!valid_stream(h)) return CUDA_ERROR_INVALID_HANDLE;
    if (!resolve_stream(h, ptsz, &key)) return CUDA_SUCCESS;
    if (CUresult r = capture_refuse(key)) return r;
    if (CUresult r = capture_unsafe_call()) return r;
  }
  return stream_wait(key);
}

/// cuStreamQuery: CUDA_ERROR_NOT_READY while a kernel of the stream is pending.
CUresult stream_query(CUstream h, bool ptsz) {
  FC_REQUIRE_INIT();
  StreamKey key;
  {
    std::lock_guard<std::mutex> l(driver().mu);
    if (!valid_stream(h)) return CUDA_ERROR_INVALID_HANDLE;
    if (!resolve_stream(h, ptsz, &key)) return CUDA_SUCCESS;
    if (CUresult r = capture_refuse(key)) return r;
    if (CUresult r = capture_unsafe_call()) return r;
  }
  if (stream_busy(key)) return CUDA_ERROR_NOT_READY;
  return stream_error(key);
}

CUresult stream_destroy(CUstream h) {
  FC_REQUIRE_INIT();
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  auto* s = reinterpret_cast<Stream*>(h);
  if (!h || !d.streams.count(s)) return CUDA_ERROR_INVALID_HANDLE;
  StreamKey key;
  if (resolve_stream(h, false, &key)) capture_forget(key);
  d.streams.erase(s);
  delete s;
  return CUDA_SUCCESS;
}

CUresult event_destroy(CUevent h) {
  FC_REQUIRE_INIT();
  Driver& d = driver();
  event_set_deps(h, nullptr);  // before the address can be reused
  std::lock_guard<std::mutex> l(d.mu);
  auto* e = reinterpret_cast<Event*>(h);
  if (!h || !d.events.count(e)) return CUDA_ERROR_INVALID_HANDLE;
  d.events.erase(e);
  delete e;
  return CUDA_SUCCESS;
}

/// The event completes with the kernels pending on its stream now. Its time
/// is the host time of the record call. On a capturing stream it becomes a
/// captured event instead (capture.cpp).
CUresult event_record(CUevent h, CUstream s, bool ptsz, unsigned flags) {
  FC_REQUIRE_INIT();
  Driver& d = driver();
  StreamKey key;
  bool keyed = false, captured = false;
  {
    std::lock_guard<std::mutex> l(d.mu);
    auto* e = reinterpret_cast<Event*>(h);
    if (!h || !d.events.count(e) || !valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
    keyed = resolve_stream(s, ptsz, &key);
    if (CUresult r = capture_record(keyed ? &key : nullptr, e, flags, &captured)) return r;
    if (!captured) {
      e->recorded = true;
      e->time_ms = now_ms();
    }
  }
  event_set_deps(h, keyed && !captured ? &key : nullptr);
  return CUDA_SUCCESS;
}

/// A valid event that cuEventQuery / cuEventSynchronize may use: not a
/// captured event (capture_event_use).
CUresult event_use(CUevent h) {
  FC_REQUIRE_INIT();
  std::lock_guard<std::mutex> l(driver().mu);
  auto* e = reinterpret_cast<Event*>(h);
  if (!h || !driver().events.count(e)) return CUDA_ERROR_INVALID_HANDLE;
  return capture_event_use(e);
}

/// cuStreamWaitEvent: a join or dependency of a capture, or (an ordinary
/// wait) a host wait for the kernels the event was recorded behind.
CUresult stream_wait_event(CUstream s, CUevent h, unsigned flags, bool ptsz) {
  FC_REQUIRE_INIT();
  Driver& d = driver();
  {
    std::lock_guard<std::mutex> l(d.mu);
    auto* e = reinterpret_cast<Event*>(h);
    if (!h || !d.events.count(e) || !valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
    StreamKey key;
    if (!resolve_stream(s, ptsz, &key)) return CUDA_ERROR_INVALID_CONTEXT;
    bool ordinary = false;
    if (CUresult r = capture_wait(key, e, flags, &ordinary)) return r;
    if (!ordinary) return CUDA_SUCCESS;
  }
  event_wait(h);
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
  if (event_busy(a) || event_busy(b)) return CUDA_ERROR_NOT_READY;
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

}  // namespace

/// Reads a handshake kernel's (my_flag, peer_flag, step) from kernelParams
/// (three pointers to the values) or from a CU_LAUNCH_PARAM_BUFFER_POINTER
/// buffer of three 8-byte words in `extra`.
bool fc::handshake_args(void** params, void** extra, HandshakeArgs* a) {
  if (params) {
    if (!params[0] || !params[1] || !params[2]) return false;
    memcpy(&a->my_flag, params[0], sizeof a->my_flag);
    memcpy(&a->peer_flag, params[1], sizeof a->peer_flag);
    memcpy(&a->step, params[2], sizeof a->step);
    return true;
  }
  if (!extra) return false;
  const void* buf = nullptr;
  size_t size = 0;
  for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buf = extra[i + 1];
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1])
      size = *static_cast<const size_t*>(extra[i + 1]);
  }
  if (!buf || size < 24) return false;
  auto* w = static_cast<const unsigned char*>(buf);
  memcpy(&a->my_flag, w, 8);
  memcpy(&a->peer_flag, w + 8, 8);
  memcpy(&a->step, w + 16, 8);
  return true;
}

namespace {

/// A no-op kernel completes at once; a handshake kernel is queued on its
/// stream behind the work it must follow and runs on the kernel thread. On a
/// capturing stream either becomes a node of the capture's graph.
CUresult launch(CUfunction f, CUstream s, bool ptsz, const LaunchDims& dims, void** params,
                void** extra) {
  FC_REQUIRE_INIT();
  Driver& d = driver();
  StreamKey key;
  {
    std::lock_guard<std::mutex> l(d.mu);
    auto* fn = reinterpret_cast<Function*>(f);
    if (!f || !d.functions.count(fn)) return CUDA_ERROR_INVALID_HANDLE;
    if (!valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
    const bool keyed = resolve_stream(s, ptsz, &key);
    if (Capture* c = keyed ? capture_of(key) : nullptr)
      return capture_launch(c, key, f, dims, params, extra);
    if (!fn->handshake) return CUDA_SUCCESS;
    if (!keyed) return CUDA_ERROR_INVALID_CONTEXT;
  }
  HandshakeArgs args;
  if (!handshake_args(params, extra, &args)) return CUDA_ERROR_INVALID_VALUE;
  kernel_enqueue(key, args);
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
  return stream_sync(hStream, false);
}
FC_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream) {
  FC_ENTER("cuStreamSynchronize");
  return stream_sync(hStream, true);
}
FC_EXPORT CUresult cuStreamQuery(CUstream hStream) {
  FC_ENTER("cuStreamQuery");
  return stream_query(hStream, false);
}
FC_EXPORT CUresult cuStreamQuery_ptsz(CUstream hStream) {
  FC_ENTER("cuStreamQuery");
  return stream_query(hStream, true);
}

FC_EXPORT CUresult cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  FC_ENTER("cuEventCreate");
  FC_REQUIRE_INIT();
  if (!phEvent || (Flags & ~0xfu)) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::unique_lock<std::mutex> l(d.mu);
  if (!valid_ctx(reinterpret_cast<CUcontext>(current_ctx()))) return CUDA_ERROR_INVALID_CONTEXT;
  auto* e = new Event;
  e->flags = Flags;
  d.events.insert(e);
  *phEvent = reinterpret_cast<CUevent>(e);
  l.unlock();
  event_set_deps(e, nullptr);  // forget a destroyed event at this address
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
  return event_record(hEvent, hStream, false, 0);
}
FC_EXPORT CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) {
  FC_ENTER("cuEventRecord");
  return event_record(hEvent, hStream, true, 0);
}
FC_EXPORT CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags) {
  FC_ENTER("cuEventRecordWithFlags");
  return event_record(hEvent, hStream, false, flags);
}
FC_EXPORT CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream,
                                               unsigned int flags) {
  FC_ENTER("cuEventRecordWithFlags");
  return event_record(hEvent, hStream, true, flags);
}
FC_EXPORT CUresult cuEventQuery(CUevent hEvent) {
  FC_ENTER("cuEventQuery");
  if (CUresult r = event_use(hEvent)) return r;
  return event_busy(hEvent) ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
FC_EXPORT CUresult cuEventSynchronize(CUevent hEvent) {
  FC_ENTER("cuEventSynchronize");
  if (CUresult r = event_use(hEvent)) return r;
  event_wait(hEvent);
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  FC_ENTER("cuStreamWaitEvent");
  return stream_wait_event(hStream, hEvent, Flags, false);
}
FC_EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  FC_ENTER("cuStreamWaitEvent");
  return stream_wait_event(hStream, hEvent, Flags, true);
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
  f->name = name;
  // C++ kernels are looked up by their mangled names, as on the real driver
  // ("_Z28ncclDevKernel_Handshake_Pairmmm"): compare from the identifier.
  const char* ident = name;
  if (ident[0] == '_' && ident[1] == 'Z') {
    ident += 2;
    if (*ident == 'N') ++ident;
    while (*ident >= '0' && *ident <= '9') ++ident;
  }
  f->handshake = strncmp(ident, kHandshakePrefix, strlen(kHandshakePrefix)) == 0;
  d.functions.insert(f);
  *hfunc = reinterpret_cast<CUfunction>(f);
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuFuncGetName(const char** name, CUfunction hfunc) {
  FC_ENTER("cuFuncGetName");
  FC_REQUIRE_INIT();
  if (!name) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  auto* f = reinterpret_cast<Function*>(hfunc);
  if (!hfunc || !d.functions.count(f)) return CUDA_ERROR_INVALID_HANDLE;
  *name = f->name.c_str();  // valid until the module is unloaded
  return CUDA_SUCCESS;
}

namespace {

LaunchDims dims_of(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared_mem) {
  LaunchDims d;
  d.grid[0] = gx, d.grid[1] = gy, d.grid[2] = gz;
  d.block[0] = bx, d.block[1] = by, d.block[2] = bz;
  d.shared_mem = shared_mem;
  return d;
}

LaunchDims dims_of(const CUlaunchConfig& c) {
  return dims_of(c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX, c.blockDimY, c.blockDimZ,
                 c.sharedMemBytes);
}

}  // namespace

#define FC_LAUNCH_PARAMS                                                                \
  CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,     \
      unsigned int by, unsigned int bz, unsigned int shmem, CUstream hStream,           \
      void **kernelParams, void **extra
FC_EXPORT CUresult cuLaunchKernel(FC_LAUNCH_PARAMS) {
  FC_ENTER("cuLaunchKernel");
  return launch(f, hStream, false, dims_of(gx, gy, gz, bx, by, bz, shmem), kernelParams, extra);
}
FC_EXPORT CUresult cuLaunchKernel_ptsz(FC_LAUNCH_PARAMS) {
  FC_ENTER("cuLaunchKernel");
  return launch(f, hStream, true, dims_of(gx, gy, gz, bx, by, bz, shmem), kernelParams, extra);
}

FC_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f,
                                    void** kernelParams, void** extra) {
  FC_ENTER("cuLaunchKernelEx");
  if (!config) return CUDA_ERROR_INVALID_VALUE;
  return launch(f, config->hStream, false, dims_of(*config), kernelParams, extra);
}
FC_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f,
                                         void** kernelParams, void** extra) {
  FC_ENTER("cuLaunchKernelEx");
  if (!config) return CUDA_ERROR_INVALID_VALUE;
  return launch(f, config->hStream, true, dims_of(*config), kernelParams, extra);
}
