// Stream capture: between cuStreamBeginCapture and cuStreamEndCapture a
// stream records its kernel launches into a new graph (graphs.cpp) instead of
// running them, and other streams can join that capture through events.
//
// A capture begins on one stream, its origin: a created stream, or a thread's
// per-thread default stream (CU_STREAM_PER_THREAD, or NULL in the _ptsz
// forms); the legacy NULL stream cannot capture
// (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED). Every capture mode is accepted; in
// GLOBAL and THREAD_LOCAL mode cuStreamEndCapture must come from the thread
// that began (CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD). Beginning on a stream
// that takes part in a capture, or ending a stream that does not, fails
// CUDA_ERROR_ILLEGAL_STATE.
//
// Every stream of a capture has a dependency set: the nodes its next node
// depends on (cuStreamGetCaptureInfo returns it). While a stream captures:
// - cuLaunchKernel(Ex)(_ptsz) on it appends a kernel node depending on the
//   set, which becomes that node, and runs nothing: a handshake kernel's
//   three arguments are copied by value, other kernels keep function, grid
//   and block.
// - cuEventRecord on it makes the event a captured event holding the set;
//   nothing is recorded for execution.
// - cuStreamSynchronize, cuStreamQuery, copies and memsets on it, and
//   cuGraphLaunch on it, fail CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and
//   invalidate the capture, as the real driver does for operations it cannot
//   capture: further launches, records and waits on its streams fail
//   CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, and so does cuStreamEndCapture,
//   returning a NULL graph.
//
// Joins (CUDA Programming Guide, "Cross-stream Dependencies and Events",
// "Prohibited and Unhandled Operations", "Invalidation"; each rule below
// measured on an H200, driver 580.159.04):
// - cuStreamWaitEvent(s, e) with e captured: a stream s outside any capture
//   joins e's capture (cuStreamIsCapturing ACTIVE, the same id and graph)
//   with e's set as its own; a stream of the same capture adds e's set to its
//   own (this is how work is joined back). The legacy NULL stream cannot
//   join: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, the capture is invalidated.
//   A stream of another capture: CUDA_ERROR_STREAM_CAPTURE_MERGE, both
//   captures are invalidated.
// - A capturing stream waiting on an event recorded outside capture:
//   CUDA_ERROR_STREAM_CAPTURE_ISOLATION, the capture is invalidated; with
//   CU_EVENT_WAIT_EXTERNAL it appends an event-wait node instead. An event
//   never recorded is no dependency (success). CU_EVENT_WAIT_EXTERNAL or
//   CU_EVENT_RECORD_EXTERNAL outside capture: CUDA_ERROR_ILLEGAL_STATE.
// - cuStreamEndCapture on the origin succeeds when every node a joined stream
//   captured is an ancestor of the origin's set (or in it); every stream of
//   the capture then leaves it. Otherwise it fails
//   CUDA_ERROR_STREAM_CAPTURE_UNJOINED with a NULL graph, and the capture
//   ends all the same: every stream leaves it (NONE, not INVALIDATED). A
//   joined stream that only waited has captured nothing and need not be
//   joined back; a destroyed joined stream's work still must be.
// - cuStreamEndCapture on a joined stream fails
//   CUDA_ERROR_STREAM_CAPTURE_UNMATCHED with a NULL graph and invalidates the
//   capture, which the origin must still end.
// - cuEventQuery / cuEventSynchronize of a captured event fail
//   CUDA_ERROR_CAPTURED_EVENT and invalidate its capture; once that capture
//   has ended, they and cuStreamWaitEvent from a stream outside capture fail
//   CUDA_ERROR_INVALID_VALUE until the event is recorded again.
// Not measured, chosen: a capturing stream waiting on the captured event of a
// capture that has ended fails CUDA_ERROR_INVALID_VALUE and invalidates
// nothing; a stream outside capture waiting on a captured event of an
// invalidated capture fails CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and does
// not join; destroying the origin stream ends its capture and frees the graph;
// unknown flags of cuEventRecordWithFlags fail CUDA_ERROR_INVALID_VALUE, as
// measured for cuStreamWaitEvent's.
// Calls that do not go into a capture, made while it is ACTIVE (measured on
// an H200, driver 580.159.04, from the thread that began it:
// tests/gpu/probes/capture_sync.cpp, docs/gpu-runs/capture-sync-h200.log):
// - cuCtxSynchronize of a context with a stream in the capture fails
//   CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture in
//   every mode, RELAXED included: it necessarily conflicts with the capture,
//   which no mode permits (cuThreadExchangeStreamCaptureMode: a RELAXED
//   thread "is still prohibited from API calls which necessarily conflict
//   with stream capture"), so the calling thread's mode does not matter.
// - Potentially unsafe calls: cuMemAlloc, cuMemFree (of a block made before
//   the capture), cuMemAllocHost, cuStreamSynchronize / cuStreamQuery of a
//   stream outside capture (the legacy NULL stream's synchronize measured as
//   well) fail CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidate a GLOBAL
//   or THREAD_LOCAL capture; a RELAXED capture permits them.
// - cuMemCreate / cuMemRelease, a memset on another stream and a
//   synchronous copy (cuMemcpyHtoD) succeed in every mode.
// Which captures prohibit a potentially unsafe call on which thread follows
// cuThreadExchangeStreamCaptureMode's documentation (cuda.h), not measured
// across threads. Each thread has a capture interaction mode, GLOBAL until
// exchanged: "GLOBAL: ... If the local thread has an ongoing capture sequence
// that was not initiated with CU_STREAM_CAPTURE_MODE_RELAXED at
// cuStreamBeginCapture, or if any other thread has a concurrent capture
// sequence initiated with CU_STREAM_CAPTURE_MODE_GLOBAL, this thread is
// prohibited from potentially unsafe API calls." "THREAD_LOCAL: If the local
// thread has an ongoing capture sequence not initiated with
// CU_STREAM_CAPTURE_MODE_RELAXED, it is prohibited from potentially unsafe
// API calls. Concurrent capture sequences in other threads are ignored."
// "RELAXED: The local thread is not prohibited from potentially unsafe API
// calls." A prohibited call invalidates the captures that prohibit it.
// Chosen where neither measured nor documented: only ACTIVE captures prohibit
// (an invalidated one, until ended, no longer does; cuCtxSynchronize then
// waits as usual); cuCtxSynchronize from a thread other than the one that
// began is refused alike; a call that fails its own argument checks
// (INVALID_VALUE, INVALID_CONTEXT) does so first and invalidates nothing;
// cuMemHostAlloc, cuMemFreeHost, cuMemAllocAsync / cuMemFreeAsync and
// cuEventSynchronize / cuEventQuery of an event outside capture are not
// treated as potentially unsafe; an invalid mode given to
// cuThreadExchangeStreamCaptureMode fails CUDA_ERROR_INVALID_VALUE.
// Not simulated: CU_EVENT_RECORD_EXTERNAL on a capturing stream (event-record
// nodes; CUDA_ERROR_NOT_SUPPORTED), what an event-wait node waits for when
// its graph runs (nothing), cuStreamUpdateCaptureDependencies and
// cuStreamBeginCaptureToGraph (stubs), and CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
// for work on the legacy stream while a blocking stream of its context
// captures.
#include "gate.h"
#include "state.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <set>
#include <utility>

using namespace fc;

namespace {

long this_tid() {
  return static_cast<long>(syscall(SYS_gettid));
}

/// The calling thread's capture interaction mode
/// (cuThreadExchangeStreamCaptureMode).
thread_local CUstreamCaptureMode t_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

bool valid_mode(CUstreamCaptureMode mode) {
  return mode == CU_STREAM_CAPTURE_MODE_GLOBAL || mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ||
         mode == CU_STREAM_CAPTURE_MODE_RELAXED;
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

/// Whether the capture can take more work (not invalidated, graph alive).
bool live(const CaptureSeq& seq) {
  return !seq.invalidated && seq.graph;
}

/// Every stream leaves the capture. Precondition: Driver::mu held.
void leave_all(const std::shared_ptr<CaptureSeq>& seq) {
  auto& m = driver().captures;
  for (auto it = m.begin(); it != m.end();)
    it = it->second.seq == seq ? m.erase(it) : std::next(it);
}

/// Whether every node the joined streams (present or destroyed) captured is
/// an ancestor of the origin's set `origin_deps` or in it.
/// Precondition: Driver::mu held, live(seq).
bool joined_back(const std::shared_ptr<CaptureSeq>& seq,
                 const std::vector<GraphNode*>& origin_deps) {
  std::set<GraphNode*> reached;
  std::vector<GraphNode*> todo = origin_deps;
  while (!todo.empty()) {
    GraphNode* n = todo.back();
    todo.pop_back();
    if (reached.insert(n).second) todo.insert(todo.end(), n->deps.begin(), n->deps.end());
  }
  auto all_reached = [&](const std::vector<GraphNode*>& nodes) {
    return std::all_of(nodes.begin(), nodes.end(), [&](GraphNode* n) { return reached.count(n); });
  };
  for (const auto& [id, c] : driver().captures)
    if (c.seq == seq && !all_reached(c.deps)) return false;
  return all_reached(seq->left);
}

CUresult begin(CUstream s, bool ptsz, CUstreamCaptureMode mode) {
  FC_REQUIRE_INIT();
  if (!valid_mode(mode)) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  if (!valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
  if (legacy(s, ptsz)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  StreamKey key;
  if (CUresult r = capture_stream(s, ptsz, &key)) return r;
  if (d.captures.count(stream_key_id(key))) return CUDA_ERROR_ILLEGAL_STATE;
  auto seq = std::make_shared<CaptureSeq>();
  seq->graph = graph_new(nullptr);
  seq->id = d.next_capture_id++;
  seq->mode = mode;
  seq->tid = this_tid();
  seq->origin = stream_key_id(key);
  d.captures.emplace(seq->origin, Capture{seq, {}});
  return CUDA_SUCCESS;
}

CUresult end(CUstream s, bool ptsz, CUgraph* out) {
  FC_REQUIRE_INIT();
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  StreamKey key;
  if (CUresult r = capture_stream(s, ptsz, &key)) return r;
  Capture* c = capture_of(key);
  if (!c) return CUDA_ERROR_ILLEGAL_STATE;
  const std::shared_ptr<CaptureSeq> seq = c->seq;
  if (seq->origin != stream_key_id(key)) {
    *out = nullptr;
    seq->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
  }
  if (seq->mode != CU_STREAM_CAPTURE_MODE_RELAXED && seq->tid != this_tid())
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  *out = nullptr;
  CUresult r = CUDA_SUCCESS;
  if (!live(*seq))
    r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  else if (!joined_back(seq, c->deps))
    r = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
  leave_all(seq);
  if (r != CUDA_SUCCESS) {
    graph_free(seq->graph);
    return r;
  }
  *out = reinterpret_cast<CUgraph>(seq->graph);
  return CUDA_SUCCESS;
}

CUstreamCaptureStatus status_of(const Capture* c) {
  if (!c) return CU_STREAM_CAPTURE_STATUS_NONE;
  return live(*c->seq) ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_INVALIDATED;
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

/// cuStreamGetCaptureInfo (every version): status; while ACTIVE also id,
/// graph and the stream's dependency set (no edge data), else 0 and NULL,
/// as the driver answers. The set stays valid until the stream's next call.
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
  const bool active = *status == CU_STREAM_CAPTURE_STATUS_ACTIVE;
  const std::vector<GraphNode*>* set = active && !c->deps.empty() ? &c->deps : nullptr;
  if (id) *id = active ? c->seq->id : 0;
  if (graph) *graph = active ? reinterpret_cast<CUgraph>(c->seq->graph) : nullptr;
  if (deps) *deps = set ? reinterpret_cast<const CUgraphNode*>(set->data()) : nullptr;
  if (edges) *edges = nullptr;
  if (ndeps) *ndeps = set ? set->size() : 0;
  return CUDA_SUCCESS;
}

/// Adds the nodes `more` to the set `deps` (each once).
void add_deps(std::vector<GraphNode*>* deps, const std::vector<GraphNode*>& more) {
  for (GraphNode* n : more)
    if (std::find(deps->begin(), deps->end(), n) == deps->end()) deps->push_back(n);
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
  if (!live(*c->seq)) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  GraphNode* n = nullptr;
  if (CUresult r = graph_add_kernel(c->seq->graph, c->deps, f, reinterpret_cast<CUcontext>(key.ctx),
                                    dims, params, extra, &n))
    return r;
  c->deps.assign(1, n);
  return CUDA_SUCCESS;
}

CUresult capture_refuse(const StreamKey& key) {
  Capture* c = capture_of(key);
  if (!c) return CUDA_SUCCESS;
  c->seq->invalidated = true;
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

CUresult capture_unsafe_call() {
  if (t_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
  const long tid = this_tid();
  bool prohibited = false;
  for (auto& [id, c] : driver().captures) {
    CaptureSeq& seq = *c.seq;
    if (!live(seq)) continue;
    const bool own = seq.tid == tid && seq.mode != CU_STREAM_CAPTURE_MODE_RELAXED;
    const bool global = seq.tid != tid && seq.mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                        t_mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    if (own || global) {
      seq.invalidated = true;
      prohibited = true;
    }
  }
  return prohibited ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

CUresult capture_ctx_sync(Context* ctx) {
  bool capturing = false;
  for (auto& [id, c] : driver().captures)
    if (std::get<0>(id) == ctx && live(*c.seq)) {
      c.seq->invalidated = true;
      capturing = true;
    }
  return capturing ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

void capture_forget(const StreamKey& key) {
  auto& m = driver().captures;
  auto it = m.find(stream_key_id(key));
  if (it == m.end()) return;
  const std::shared_ptr<CaptureSeq> seq = it->second.seq;
  if (seq->origin != it->first) {
    add_deps(&seq->left, it->second.deps);
    m.erase(it);
    return;
  }
  leave_all(seq);
  graph_free(seq->graph);
}

CUresult capture_record(const StreamKey* key, Event* e, unsigned flags, bool* captured) {
  *captured = false;
  if (flags & ~unsigned{CU_EVENT_RECORD_EXTERNAL}) return CUDA_ERROR_INVALID_VALUE;
  Capture* c = key ? capture_of(*key) : nullptr;
  if (!c) {
    if (flags & CU_EVENT_RECORD_EXTERNAL) return CUDA_ERROR_ILLEGAL_STATE;
    e->captured = false;
    e->capture.reset();
    e->capture_deps.clear();
    return CUDA_SUCCESS;
  }
  if (!live(*c->seq)) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  if (flags & CU_EVENT_RECORD_EXTERNAL) return CUDA_ERROR_NOT_SUPPORTED;  // no record nodes
  e->captured = true;
  e->capture = c->seq;
  e->capture_deps = c->deps;
  *captured = true;
  return CUDA_SUCCESS;
}

CUresult capture_wait(const StreamKey& key, Event* e, unsigned flags, bool* ordinary) {
  *ordinary = false;
  if (flags & ~unsigned{CU_EVENT_WAIT_EXTERNAL}) return CUDA_ERROR_INVALID_VALUE;
  const bool external = flags & CU_EVENT_WAIT_EXTERNAL;
  const std::shared_ptr<CaptureSeq> from = e->captured ? e->capture.lock() : nullptr;
  Capture* c = capture_of(key);
  if (!c) {
    if (external) return CUDA_ERROR_ILLEGAL_STATE;
    if (!e->captured) {
      *ordinary = true;
      return CUDA_SUCCESS;
    }
    if (!from) return CUDA_ERROR_INVALID_VALUE;  // its capture has ended
    if (!live(*from)) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (key.kind == StreamKind::kLegacy) {
      from->invalidated = true;
      return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
    driver().captures.emplace(stream_key_id(key), Capture{from, e->capture_deps});
    return CUDA_SUCCESS;
  }
  CaptureSeq& seq = *c->seq;
  if (!live(seq)) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  if (external) {
    c->deps.assign(1, graph_add_node(seq.graph, CU_GRAPH_NODE_TYPE_WAIT_EVENT, c->deps));
    return CUDA_SUCCESS;
  }
  if (!e->captured) {
    if (!e->recorded) return CUDA_SUCCESS;  // an empty set of work
    seq.invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
  }
  if (!from) return CUDA_ERROR_INVALID_VALUE;
  if (from != c->seq) {
    seq.invalidated = true;
    from->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_MERGE;
  }
  add_deps(&c->deps, e->capture_deps);
  return CUDA_SUCCESS;
}

CUresult capture_event_use(Event* e) {
  if (!e->captured) return CUDA_SUCCESS;
  const std::shared_ptr<CaptureSeq> seq = e->capture.lock();
  if (!seq) return CUDA_ERROR_INVALID_VALUE;
  seq->invalidated = true;
  return CUDA_ERROR_CAPTURED_EVENT;
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
/// Swaps the calling thread's capture interaction mode with *mode.
FC_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  FC_ENTER_UNGATED("cuThreadExchangeStreamCaptureMode");
  FC_REQUIRE_INIT();
  if (!mode || !valid_mode(*mode)) return CUDA_ERROR_INVALID_VALUE;
  std::swap(*mode, t_mode);
  return CUDA_SUCCESS;
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
