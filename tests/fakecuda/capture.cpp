// Stream capture: between cuStreamBeginCapture and cuStreamEndCapture a
// stream records its kernel launches into a new graph (graphs.cpp) instead of
// running them.
//
// A capture belongs to one stream: a created stream, or a thread's per-thread
// default stream (CU_STREAM_PER_THREAD, or NULL in the _ptsz forms); the
// legacy NULL stream cannot capture (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED).
// Every capture mode is accepted; in GLOBAL and THREAD_LOCAL mode
// cuStreamEndCapture must come from the thread that began
// (CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD). Beginning twice, or ending a
// stream that does not capture, fails CUDA_ERROR_ILLEGAL_STATE.
//
// While a stream captures:
// - cuLaunchKernel(Ex)(_ptsz) on it appends a kernel node that depends on the
//   previous one (the capture is a chain) and runs nothing: a handshake
//   kernel's three arguments are copied by value, other kernels keep function,
//   grid and block.
// - cuStreamSynchronize, cuStreamQuery, copies and memsets on it, and
//   cuGraphLaunch on it, fail CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and
//   invalidate the capture, as the real driver does for operations it cannot
//   capture: further launches fail CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and
//   cuStreamEndCapture fails so too, returning a NULL graph.
// Not simulated: other streams joining a capture through events
// (cuStreamWaitEvent), and the checks that the real driver makes on other
// streams and threads while a capture is active (CUDA_ERROR_STREAM_CAPTURE_
// IMPLICIT for the legacy stream, unsafe calls in GLOBAL mode).
#include "gate.h"
#include "state.h"

#include <sys/syscall.h>
#include <unistd.h>

using namespace fc;

namespace {

long this_tid() {
  return static_cast<long>(syscall(SYS_gettid));
}

bool legacy(CUstream s, bool ptsz) {
  return s == CU_STREAM_LEGACY || (s == nullptr && !ptsz);
}

/// Resolves the stream of a capture call. Precondition: Driver::mu held.
CUresult capture_stream(CUstream s, bool ptsz, StreamKey* key) {
  if (!valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
  if (!resolve_stream(s, ptsz, key)) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS;
}

CUresult begin(CUstream s, bool ptsz, CUstreamCaptureMode mode) {
  FC_REQUIRE_INIT();
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  if (!valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
  if (legacy(s, ptsz)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  StreamKey key;
  if (CUresult r = capture_stream(s, ptsz, &key)) return r;
  if (d.captures.count(stream_key_id(key))) return CUDA_ERROR_ILLEGAL_STATE;
  Capture c;
  c.graph = graph_new(nullptr);
  c.id = d.next_capture_id++;
  c.mode = mode;
  c.tid = this_tid();
  d.captures.emplace(stream_key_id(key), c);
  return CUDA_SUCCESS;
}

CUresult end(CUstream s, bool ptsz, CUgraph* out) {
  FC_REQUIRE_INIT();
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  StreamKey key;
  if (CUresult r = capture_stream(s, ptsz, &key)) return r;
  auto it = d.captures.find(stream_key_id(key));
  if (it == d.captures.end()) return CUDA_ERROR_ILLEGAL_STATE;
  Capture& c = it->second;
  if (c.mode != CU_STREAM_CAPTURE_MODE_RELAXED && c.tid != this_tid())
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  *out = nullptr;
  if (c.invalidated || !c.graph) {
    graph_free(c.graph);
    d.captures.erase(it);
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  *out = reinterpret_cast<CUgraph>(c.graph);
  d.captures.erase(it);
  return CUDA_SUCCESS;
}

CUstreamCaptureStatus status_of(const Capture* c) {
  if (!c) return CU_STREAM_CAPTURE_STATUS_NONE;
  return c->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

CUresult is_capturing(CUstream s, bool ptsz, CUstreamCaptureStatus* status) {
  FC_REQUIRE_INIT();
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(driver().mu);
  StreamKey key;
  if (CUresult r = capture_stream(s, ptsz, &key)) return r;
  *status = status_of(capture_of(key));
  return CUDA_SUCCESS;
}

/// cuStreamGetCaptureInfo (every version): status, id and graph; the capture
/// is a chain whose dependencies are not reported (NULL, 0).
CUresult info(CUstream s, bool ptsz, CUstreamCaptureStatus* status, cuuint64_t* id,
              CUgraph* graph, const CUgraphNode** deps, const CUgraphEdgeData** edges,
              size_t* ndeps) {
  FC_REQUIRE_INIT();
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(driver().mu);
  StreamKey key;
  if (CUresult r = capture_stream(s, ptsz, &key)) return r;
  const Capture* c = capture_of(key);
  *status = status_of(c);
  if (id) *id = c ? c->id : 0;
  if (graph) *graph = c ? reinterpret_cast<CUgraph>(c->graph) : nullptr;
  if (deps) *deps = nullptr;
  if (edges) *edges = nullptr;
  if (ndeps) *ndeps = 0;
  return CUDA_SUCCESS;
}

}  // namespace

namespace fc {

Capture* capture_of(const StreamKey& key) {
  auto& m = driver().captures;
  auto it = m.find(stream_key_id(key));
  return it == m.end() ? nullptr : &it->second;
}

CUresult capture_launch(Capture* c, const StreamKey& key, CUfunction f, const LaunchDims& dims,
                        void** params, void** extra) {
  if (c->invalidated || !c->graph) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  std::vector<GraphNode*> deps;
  if (!c->graph->nodes.empty()) deps.push_back(c->graph->nodes.back());
  return graph_add_kernel(c->graph, std::move(deps), f, reinterpret_cast<CUcontext>(key.ctx),
                          dims, params, extra, nullptr);
}

CUresult capture_refuse(const StreamKey& key) {
  Capture* c = capture_of(key);
  if (!c) return CUDA_SUCCESS;
  c->invalidated = true;
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

void capture_forget(const StreamKey& key) {
  auto& m = driver().captures;
  auto it = m.find(stream_key_id(key));
  if (it == m.end()) return;
  graph_free(it->second.graph);
  m.erase(it);
}

}  // namespace fc

FC_EXPORT CUresult cuStreamBeginCapture(CUstream hStream) {
  FC_ENTER("cuStreamBeginCapture");
  return begin(hStream, false, CU_STREAM_CAPTURE_MODE_GLOBAL);
}
FC_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream hStream) {
  FC_ENTER("cuStreamBeginCapture");
  return begin(hStream, true, CU_STREAM_CAPTURE_MODE_GLOBAL);
}
FC_EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  FC_ENTER("cuStreamBeginCapture");
  return begin(hStream, false, mode);
}
FC_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  FC_ENTER("cuStreamBeginCapture");
  return begin(hStream, true, mode);
}
FC_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  FC_ENTER("cuStreamEndCapture");
  return end(hStream, false, phGraph);
}
FC_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  FC_ENTER("cuStreamEndCapture");
  return end(hStream, true, phGraph);
}
FC_EXPORT CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  FC_ENTER("cuStreamIsCapturing");
  return is_capturing(hStream, false, captureStatus);
}
FC_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream hStream,
                                            CUstreamCaptureStatus* captureStatus) {
  FC_ENTER("cuStreamIsCapturing");
  return is_capturing(hStream, true, captureStatus);
}

#define FC_INFO_V3_PARAMS                                                                  \
  CUstream hStream, CUstreamCaptureStatus *captureStatus_out, cuuint64_t *id_out,          \
      CUgraph *graph_out, const CUgraphNode **dependencies_out,                            \
      const CUgraphEdgeData **edgeData_out, size_t *numDependencies_out
FC_EXPORT CUresult cuStreamGetCaptureInfo_v3(FC_INFO_V3_PARAMS) {
  FC_ENTER("cuStreamGetCaptureInfo");
  return info(hStream, false, captureStatus_out, id_out, graph_out, dependencies_out,
              edgeData_out, numDependencies_out);
}
FC_EXPORT CUresult cuStreamGetCaptureInfo_v3_ptsz(FC_INFO_V3_PARAMS) {
  FC_ENTER("cuStreamGetCaptureInfo");
  return info(hStream, true, captureStatus_out, id_out, graph_out, dependencies_out,
              edgeData_out, numDependencies_out);
}
FC_EXPORT CUresult cuStreamGetCaptureInfo_v2(CUstream hStream,
                                             CUstreamCaptureStatus* captureStatus_out,
                                             cuuint64_t* id_out, CUgraph* graph_out,
                                             const CUgraphNode** dependencies_out,
                                             size_t* numDependencies_out) {
  FC_ENTER("cuStreamGetCaptureInfo");
  return info(hStream, false, captureStatus_out, id_out, graph_out, dependencies_out, nullptr,
              numDependencies_out);
}
FC_EXPORT CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream hStream,
                                                  CUstreamCaptureStatus* captureStatus_out,
                                                  cuuint64_t* id_out, CUgraph* graph_out,
                                                  const CUgraphNode** dependencies_out,
                                                  size_t* numDependencies_out) {
  FC_ENTER("cuStreamGetCaptureInfo");
  return info(hStream, true, captureStatus_out, id_out, graph_out, dependencies_out, nullptr,
              numDependencies_out);
}
FC_EXPORT CUresult cuStreamGetCaptureInfo(CUstream hStream,
                                          CUstreamCaptureStatus* captureStatus_out,
                                          cuuint64_t* id_out) {
  FC_ENTER("cuStreamGetCaptureInfo");
  return info(hStream, false, captureStatus_out, id_out, nullptr, nullptr, nullptr, nullptr);
}
FC_EXPORT CUresult cuStreamGetCaptureInfo_ptsz(CUstream hStream,
                                               CUstreamCaptureStatus* captureStatus_out,
                                               cuuint64_t* id_out) {
  FC_ENTER("cuStreamGetCaptureInfo");
  return info(hStream, true, captureStatus_out, id_out, nullptr, nullptr, nullptr, nullptr);
}
