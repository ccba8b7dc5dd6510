// Simulated driver: calls that do not go into a capture, made while one is
// ACTIVE (capture.cpp). First the probe tests/gpu/probes/capture_sync.cpp,
// each case expecting what docs/gpu-runs/capture-sync-h200.log shows; then
// the rules taken from cuThreadExchangeStreamCaptureMode's documentation:
// which threads a capture prohibits potentially unsafe calls to, and a thread
// that exchanges its own mode. Every case runs in forked children.
#include <doctest/doctest.h>
#include <unistd.h>

#include <functional>
#include <future>
#include <thread>

#include "fakecuda_test_util.h"
#include "kernels_test_util.h"

using namespace fctest;

namespace {

constexpr auto kActive = CU_STREAM_CAPTURE_STATUS_ACTIVE;
constexpr auto kInvalidated = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
constexpr auto kGlobal = CU_STREAM_CAPTURE_MODE_GLOBAL;
constexpr auto kThreadLocal = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
constexpr auto kRelaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
constexpr CUstreamCaptureMode kModes[] = {kGlobal, kThreadLocal, kRelaxed};
constexpr const char* kModeNames[] = {"GLOBAL", "THREAD_LOCAL", "RELAXED"};

/// cuStreamIsCapturing, or a value no status has when the call fails.
int status(CUstream s) {
  CUstreamCaptureStatus st;
  return cuStreamIsCapturing(s, &st) == CUDA_SUCCESS ? st : -1;
}

/// cuStreamEndCapture: its result, the graph (if any) destroyed; *got_graph
/// tells whether there was one.
CUresult end_capture(CUstream s, bool* got_graph) {
  CUgraph g = reinterpret_cast<CUgraph>(1);
  const CUresult r = cuStreamEndCapture(s, &g);
  *got_graph = g != nullptr;
  if (g) cuGraphDestroy(g);
  return r;
}

/// The probe's calls: `other` is a non-blocking stream outside the capture,
/// `buf` a block made before it.
using Op = CUresult (*)(CUstream other, CUdeviceptr buf);
CUresult op_ctx_sync(CUstream, CUdeviceptr) {
  return cuCtxSynchronize();
}
CUresult op_alloc(CUstream, CUdeviceptr) {
  CUdeviceptr p;
  CUresult r = cuMemAlloc(&p, 1 << 20);
  if (r == CUDA_SUCCESS) r = cuMemFree(p);
  return r;
}
CUresult op_free(CUstream, CUdeviceptr b) {
  return cuMemFree(b);
}
CUresult op_htod(CUstream, CUdeviceptr b) {
  int x = 1;
  return cuMemcpyHtoD(b, &x, sizeof x);
}
CUresult op_other_sync(CUstream o, CUdeviceptr) {
  return cuStreamSynchronize(o);
}
CUresult op_other_query(CUstream o, CUdeviceptr) {
  return cuStreamQuery(o);
}
CUresult op_legacy_sync(CUstream, CUdeviceptr) {
  return cuStreamSynchronize(CU_STREAM_LEGACY);
}
CUresult op_memset_other(CUstream o, CUdeviceptr b) {
  return cuMemsetD8Async(b, 0, 16, o);
}
CUresult op_vmm(CUstream, CUdeviceptr) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  size_t g = 0;
  cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  CUmemGenericAllocationHandle h;
  CUresult r = cuMemCreate(&h, g, &p, 0);
  if (r == CUDA_SUCCESS) r = cuMemRelease(h);
  return r;
}
CUresult op_alloc_host(CUstream, CUdeviceptr) {
  void* p;
  CUresult r = cuMemAllocHost(&p, 4096);
  if (r == CUDA_SUCCESS) r = cuMemFreeHost(p);
  return r;
}

/// One case of the probe: whether GLOBAL, THREAD_LOCAL and RELAXED capture
/// refuse the call (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, capture
/// invalidated) or let it succeed (capture still ACTIVE).
struct Row {
  const char* name;
  Op op;
  bool refused[3];
};
constexpr Row kRows[] = {
    {"cuCtxSynchronize", op_ctx_sync, {true, true, true}},
    {"cuMemAlloc+Free", op_alloc, {true, true, false}},
    {"cuMemFree (made before)", op_free, {true, true, false}},
    {"cuMemcpyHtoD (sync)", op_htod, {false, false, false}},
    {"cuStreamSynchronize(other)", op_other_sync, {true, true, false}},
    {"cuStreamQuery(other)", op_other_query, {true, true, false}},
    {"cuStreamSynchronize(LEGACY)", op_legacy_sync, {true, true, false}},
    {"cuMemsetD8Async(other)", op_memset_other, {false, false, false}},
    {"cuMemCreate+Release", op_vmm, {false, false, false}},
    {"cuMemAllocHost+FreeHost", op_alloc_host, {true, true, false}},
};

/// The probe's case: capture on a fresh non-blocking stream in `mode`, one
/// kernel launched, the call, then the capture's status and its end. 0 when
/// all three are as the real driver's.
int probe_case(CUfunction k, const Row& row, int mode) {
  CUstream a, o;
  FC_REQ(create_streams({{&a, CU_STREAM_NON_BLOCKING}, {&o, CU_STREAM_NON_BLOCKING}}) == 0);
  CUdeviceptr buf;
  FC_REQ(cuMemAlloc(&buf, 4096) == CUDA_SUCCESS);
  FC_REQ(cuStreamBeginCapture(a, kModes[mode]) == CUDA_SUCCESS);
  FC_REQ(cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, a, nullptr, nullptr) == CUDA_SUCCESS);
  const bool refused = row.refused[mode];
  const CUresult r = row.op(o, buf);
  const int st = status(a);
  bool graph = false;
  const CUresult e = end_capture(a, &graph);
  const bool as_measured = refused
                               ? r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED && st == kInvalidated &&
                                     e == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && !graph
                               : r == CUDA_SUCCESS && st == kActive && e == CUDA_SUCCESS && graph;
  if (!as_measured) {
    fprintf(stderr, "child %d: %s in %s capture: call %d, status %d, end %d, graph %d\n",
            int(getpid()), row.name, kModeNames[mode], int(r), st, int(e), int(graph));
    return 1;
  }
  FC_REQ(cuCtxSynchronize() == CUDA_SUCCESS);
  if (row.op != op_free || refused) FC_REQ(cuMemFree(buf) == CUDA_SUCCESS);
  FC_REQ(cuStreamDestroy(a) == CUDA_SUCCESS && cuStreamDestroy(o) == CUDA_SUCCESS);
  return 0;
}

/// What each test's child starts with: the primary context current, a plain
/// kernel, two non-blocking streams.
struct Setup {
  CUcontext ctx = nullptr;
  CUfunction k = nullptr;
  CUstream a = nullptr, b = nullptr;
};

/// Runs fn in a forked child once its Setup is made.
int with_setup(const std::function<int(const Setup&)>& fn) {
  return run_child([&] {
    Setup s;
    FC_REQ(init_primary(&s.ctx) == CUDA_SUCCESS);
    s.k = load_function("k");
    FC_REQ(s.k);
    FC_REQ(create_streams({{&s.a, CU_STREAM_NON_BLOCKING}, {&s.b, CU_STREAM_NON_BLOCKING}}) == 0);
    return fn(s);
  });
}

/// A capture held by a thread of its own: begun there in `mode` on s with one
/// kernel launched, ended there by end() (GLOBAL and THREAD_LOCAL captures
/// must end on the thread that began them).
class CaptureThread {
 public:
  CaptureThread(CUcontext ctx, CUfunction k, CUstream s, CUstreamCaptureMode mode)
      : thread_([this, ctx, k, s, mode] {
          cuCtxSetCurrent(ctx);
          CUresult r = cuStreamBeginCapture(s, mode);
          if (r == CUDA_SUCCESS) r = cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, nullptr, nullptr);
          begun_.set_value(r);
          go_.get_future().wait();
          bool graph = false;
          ended_.set_value(r == CUDA_SUCCESS ? end_capture(s, &graph) : r);
        }) {}
  ~CaptureThread() {
    if (thread_.joinable()) end();
  }
  CaptureThread(const CaptureThread&) = delete;
  CaptureThread& operator=(const CaptureThread&) = delete;

  /// The result of the begin and the launch.
  CUresult begun() { return begun_future_.get(); }
  /// Ends the capture on its thread; the result of cuStreamEndCapture.
  CUresult end() {
    go_.set_value();
    thread_.join();
    return ended_.get_future().get();
  }

 private:
  std::promise<CUresult> begun_;
  std::future<CUresult> begun_future_ = begun_.get_future();
  std::promise<void> go_;
  std::promise<CUresult> ended_;
  std::thread thread_;  ///< last: starts once the promises exist
};

/// Runs fn on a new thread with ctx current; its result.
CUresult on_thread(CUcontext ctx, const std::function<CUresult()>& fn) {
  CUresult r = CUDA_ERROR_UNKNOWN;
  std::thread([&] {
    cuCtxSetCurrent(ctx);
    r = fn();
  }).join();
  return r;
}

/// cuThreadExchangeStreamCaptureMode to `mode`; the mode it replaced.
CUstreamCaptureMode exchange(CUstreamCaptureMode mode) {
  cuThreadExchangeStreamCaptureMode(&mode);
  return mode;
}

}  // namespace

TEST_CASE("fakecuda: capture rules: each call of the probe in each mode, as measured") {
  CHECK(with_setup([](const Setup& s) {
          int failed = 0;
          for (const Row& row : kRows)
            for (int mode = 0; mode < 3; ++mode) failed += probe_case(s.k, row, mode);
          return failed;
        }) == 0);
}

TEST_CASE("fakecuda: capture rules: cuCtxSynchronize is refused for the capture's context only") {
  CHECK(with_setup([](const Setup& s) {
          CUcontext other;
          FC_REQ(cuCtxCreate(&other, nullptr, 0, 0) == CUDA_SUCCESS);
          FC_REQ(cuCtxSetCurrent(s.ctx) == CUDA_SUCCESS);
          bool graph = false;
          for (CUstreamCaptureMode mode : kModes) {
            FC_REQ(cuStreamBeginCapture(s.a, mode) == CUDA_SUCCESS);
            FC_REQ(cuCtxSynchronize_v2(other) == CUDA_SUCCESS);
            FC_REQ(status(s.a) == kActive);
            // Chosen, not measured: from another thread as well.
            FC_REQ(on_thread(s.ctx, [] { return cuCtxSynchronize(); }) ==
                   CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
            FC_REQ(status(s.a) == kInvalidated);
            // Chosen: an invalidated capture no longer refuses it.
            FC_REQ(cuCtxSynchronize_v2(s.ctx) == CUDA_SUCCESS);
            FC_REQ(end_capture(s.a, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && !graph);
          }
          // The per-thread default stream's capture is its context's too.
          FC_REQ(cuStreamBeginCapture(CU_STREAM_PER_THREAD, kRelaxed) == CUDA_SUCCESS);
          FC_REQ(cuCtxSynchronize_v2(s.ctx) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
          FC_REQ(status(CU_STREAM_PER_THREAD) == kInvalidated);
          FC_REQ(end_capture(CU_STREAM_PER_THREAD, &graph) ==
                 CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
          return 0;
        }) == 0);
}

TEST_CASE("fakecuda: capture rules: GLOBAL prohibits unsafe calls of every thread") {
  CHECK(with_setup([](const Setup& s) {
          const std::function<CUresult()> unsafe[] = {
              [] { return op_alloc(nullptr, 0); },
              [&] { return cuStreamSynchronize(s.b); },
              [] { return cuStreamQuery(CU_STREAM_LEGACY); },
          };
          bool graph = false;
          for (const auto& call : unsafe) {
            // Begun GLOBAL on this thread: another thread's call is refused.
            FC_REQ(cuStreamBeginCapture(s.a, kGlobal) == CUDA_SUCCESS);
            FC_REQ(on_thread(s.ctx, call) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
            FC_REQ(status(s.a) == kInvalidated);
            FC_REQ(end_capture(s.a, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
            // THREAD_LOCAL and RELAXED: other threads are free.
            for (CUstreamCaptureMode mode : {kThreadLocal, kRelaxed}) {
              FC_REQ(cuStreamBeginCapture(s.a, mode) == CUDA_SUCCESS);
              FC_REQ(on_thread(s.ctx, call) == CUDA_SUCCESS);
              FC_REQ(status(s.a) == kActive);
              FC_REQ(end_capture(s.a, &graph) == CUDA_SUCCESS && graph);
            }
          }
          // One call, two prohibiting captures: this thread's THREAD_LOCAL
          // one and another thread's GLOBAL one; both are invalidated.
          CaptureThread global(s.ctx, s.k, s.b, kGlobal);
          FC_REQ(global.begun() == CUDA_SUCCESS);
          FC_REQ(cuStreamBeginCapture(s.a, kThreadLocal) == CUDA_SUCCESS);
          FC_REQ(op_alloc(nullptr, 0) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
          FC_REQ(status(s.a) == kInvalidated && status(s.b) == kInvalidated);
          FC_REQ(global.end() == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
          FC_REQ(end_capture(s.a, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
          // Another thread's THREAD_LOCAL capture prohibits nothing here.
          CaptureThread local(s.ctx, s.k, s.b, kThreadLocal);
          FC_REQ(local.begun() == CUDA_SUCCESS);
          FC_REQ(op_alloc(nullptr, 0) == CUDA_SUCCESS);
          FC_REQ(cuStreamSynchronize(s.a) == CUDA_SUCCESS);
          FC_REQ(status(s.b) == kActive);
          FC_REQ(local.end() == CUDA_SUCCESS);
          return 0;
        }) == 0);
}

TEST_CASE("fakecuda: capture rules: cuThreadExchangeStreamCaptureMode sets the thread's mode") {
  CHECK(with_setup([](const Setup& s) {
          FC_REQ(cuThreadExchangeStreamCaptureMode(nullptr) == CUDA_ERROR_INVALID_VALUE);
          CUstreamCaptureMode bad = static_cast<CUstreamCaptureMode>(7);
          FC_REQ(cuThreadExchangeStreamCaptureMode(&bad) == CUDA_ERROR_INVALID_VALUE);
          bool graph = false;

          // RELAXED: this thread's own GLOBAL capture prohibits nothing ...
          FC_REQ(exchange(kRelaxed) == kGlobal);  // the default
          FC_REQ(cuStreamBeginCapture(s.a, kGlobal) == CUDA_SUCCESS);
          FC_REQ(op_alloc(nullptr, 0) == CUDA_SUCCESS);
          FC_REQ(op_alloc_host(nullptr, 0) == CUDA_SUCCESS);
          FC_REQ(cuStreamSynchronize(s.b) == CUDA_SUCCESS);
          FC_REQ(cuStreamQuery(CU_STREAM_LEGACY) == CUDA_SUCCESS);
          FC_REQ(status(s.a) == kActive);
          // ... but the mode is this thread's: another one is still refused.
          FC_REQ(on_thread(s.ctx, [] { return op_alloc(nullptr, 0); }) ==
                 CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
          FC_REQ(end_capture(s.a, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
          // Conflicting calls stay refused in RELAXED mode.
          FC_REQ(cuStreamBeginCapture(s.a, kGlobal) == CUDA_SUCCESS);
          FC_REQ(cuStreamQuery(s.a) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
          FC_REQ(end_capture(s.a, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
          FC_REQ(cuStreamBeginCapture(s.a, kGlobal) == CUDA_SUCCESS);
          FC_REQ(cuCtxSynchronize() == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
          FC_REQ(end_capture(s.a, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

          // THREAD_LOCAL: another thread's GLOBAL capture is ignored, this
          // thread's own capture is not.
          FC_REQ(exchange(kThreadLocal) == kRelaxed);
          {
            CaptureThread global(s.ctx, s.k, s.b, kGlobal);
            FC_REQ(global.begun() == CUDA_SUCCESS);
            FC_REQ(op_alloc(nullptr, 0) == CUDA_SUCCESS);
            FC_REQ(status(s.b) == kActive);
            FC_REQ(cuStreamBeginCapture(s.a, kThreadLocal) == CUDA_SUCCESS);
            FC_REQ(op_alloc(nullptr, 0) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
            FC_REQ(status(s.a) == kInvalidated && status(s.b) == kActive);
            FC_REQ(end_capture(s.a, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
            FC_REQ(global.end() == CUDA_SUCCESS);
          }
          // Back to GLOBAL: the other thread's GLOBAL capture prohibits again.
          FC_REQ(exchange(kGlobal) == kThreadLocal);
          FC_REQ(exchange(kGlobal) == kGlobal);
          CaptureThread global(s.ctx, s.k, s.b, kGlobal);
          FC_REQ(global.begun() == CUDA_SUCCESS);
          FC_REQ(op_alloc(nullptr, 0) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
          FC_REQ(status(s.b) == kInvalidated);
          FC_REQ(global.end() == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
          return 0;
        }) == 0);
}
