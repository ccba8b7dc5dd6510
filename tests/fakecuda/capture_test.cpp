// Simulated driver: streams joining a capture through events (capture.cpp),
// as PyTorch captures NCCL collectives: the collective stream waits on an
// event recorded on the capturing stream, and the capturing stream waits on
// one recorded after the collective. Each rule was measured on the real
// driver (capture.cpp's header): the join, the end of a capture whose joined
// work is (not) joined back, the end on a joined stream, waits across
// captures and on events recorded outside capture, and captured events used
// as ordinary ones. Every case runs in forked children.
#include <doctest/doctest.h>
#include <unistd.h>

#include <functional>
#include <thread>
#include <vector>

#include "fakecuda_test_util.h"
#include "kernels_test_util.h"

using namespace fctest;

namespace {

constexpr const char* kHandshake = "ncclDevKernel_Handshake_Capture";
constexpr auto kNone = CU_STREAM_CAPTURE_STATUS_NONE;
constexpr auto kActive = CU_STREAM_CAPTURE_STATUS_ACTIVE;
constexpr auto kInvalidated = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
constexpr auto kGlobal = CU_STREAM_CAPTURE_MODE_GLOBAL;

CUresult launch(CUfunction f, CUstream s, CUdeviceptr mine, CUdeviceptr peer, uint64_t step) {
  void* params[] = {&mine, &peer, &step};
  return cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, params, nullptr);
}

/// cuStreamIsCapturing, or a value no status has when the call fails.
int status(CUstream s) {
  CUstreamCaptureStatus st;
  return cuStreamIsCapturing(s, &st) == CUDA_SUCCESS ? st : -1;
}

/// What cuStreamGetCaptureInfo reports of s: id, graph, dependency set.
struct Info {
  cuuint64_t id = 0;
  CUgraph graph = nullptr;
  std::vector<CUgraphNode> deps;
};
Info info(CUstream s) {
  Info i;
  CUstreamCaptureStatus st;
  const CUgraphNode* deps = nullptr;
  size_t n = 0;
  if (cuStreamGetCaptureInfo(s, &st, &i.id, &i.graph, &deps, nullptr, &n) == CUDA_SUCCESS)
    i.deps.assign(deps, deps + n);
  return i;
}

size_t node_count(CUgraph g) {
  size_t n = 0;
  return cuGraphGetNodes(g, nullptr, &n) == CUDA_SUCCESS ? n : ~size_t{0};
}

/// Streams A (origin) and B and events e1, e2; A captures and has launched
/// one handshake kernel; B has joined through e1 and launched one.
struct Fork {
  CUstream a = nullptr, b = nullptr;
  CUevent e1 = nullptr, e2 = nullptr;

  int init(const HandshakeSetup& k) {
    FC_REQ(create_streams({{&a, CU_STREAM_NON_BLOCKING}, {&b, CU_STREAM_NON_BLOCKING}}) == 0);
    FC_REQ(cuEventCreate(&e1, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
    FC_REQ(cuEventCreate(&e2, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
    FC_REQ(cuStreamBeginCapture(a, kGlobal) == CUDA_SUCCESS);
    FC_REQ(launch(k.f, a, k.b.ptr, k.b.ptr + 8, 0) == CUDA_SUCCESS);
    FC_REQ(cuEventRecord(e1, a) == CUDA_SUCCESS);
    FC_REQ(cuStreamWaitEvent(b, e1, 0) == CUDA_SUCCESS);
    FC_REQ(launch(k.f, b, k.b.ptr + 16, k.b.ptr + 24, 0) == CUDA_SUCCESS);
    return 0;
  }
  /// Joins B's work back into A.
  CUresult rejoin() {
    if (CUresult r = cuEventRecord(e2, b)) return r;
    return cuStreamWaitEvent(a, e2, 0);
  }
};

/// Runs fn(k, f) in a forked child once the handshake setup k is made and
/// the Fork f made from it.
int with_fork(const std::function<int(const HandshakeSetup&, Fork&)>& fn) {
  return run_child([&] {
    HandshakeSetup k;
    FC_REQ(k.init(kHandshake) == 0);
    Fork f;
    FC_REQ(f.init(k) == 0);
    return fn(k, f);
  });
}

}  // namespace

TEST_CASE("fakecuda: capture: a stream joins through an event and is joined back") {
  CHECK(run_child([] {
          HandshakeSetup k;
          FC_REQ(k.init(kHandshake) == 0);
          CUdeviceptr a_mine = k.b.ptr, a_peer = k.b.ptr + 8;
          CUdeviceptr b_mine = k.b.ptr + 16, b_peer = k.b.ptr + 24;
          CUstream a, b;
          FC_REQ(create_streams({{&a, 0}, {&b, CU_STREAM_NON_BLOCKING}}) == 0);
          CUevent e1, e2;
          FC_REQ(cuEventCreate(&e1, 0) == CUDA_SUCCESS && cuEventCreate(&e2, 0) == CUDA_SUCCESS);
          FC_REQ(cuStreamBeginCapture(a, kGlobal) == CUDA_SUCCESS);
          FC_REQ(launch(k.f, a, a_mine, a_peer, 0) == CUDA_SUCCESS);
          const Info at_fork = info(a);
          FC_REQ(at_fork.deps.size() == 1);
          FC_REQ(cuEventRecord(e1, a) == CUDA_SUCCESS);
          FC_REQ(status(b) == kNone);
          FC_REQ(cuStreamWaitEvent(b, e1, 0) == CUDA_SUCCESS);
          // B is in A's capture, its next node depending on A's kernel.
          FC_REQ(status(b) == kActive);
          Info joined = info(b);
          FC_REQ(joined.id == at_fork.id && joined.graph == at_fork.graph);
          FC_REQ(joined.deps == at_fork.deps);
          FC_REQ(cuEventQuery(e1) == CUDA_ERROR_CAPTURED_EVENT);  // not a query: invalidated
          FC_REQ(status(a) == kInvalidated && status(b) == kInvalidated);
          CUgraph g = nullptr;
          FC_REQ(cuStreamEndCapture(a, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && !g);
          FC_REQ(status(a) == kNone && status(b) == kNone);

          // Again without the query: B's collective is captured, not run.
          FC_REQ(cuStreamBeginCapture(a, kGlobal) == CUDA_SUCCESS);
          FC_REQ(launch(k.f, a, a_mine, a_peer, 0) == CUDA_SUCCESS);
          FC_REQ(cuEventRecord(e1, a) == CUDA_SUCCESS);
          FC_REQ(cuStreamWaitEvent(b, e1, 0) == CUDA_SUCCESS);
          FC_REQ(launch(k.f, b, b_mine, b_peer, 0) == CUDA_SUCCESS);
          FC_REQ(launch(k.f, a, a_mine, a_peer, 0) == CUDA_SUCCESS);
          const Info after_b = info(b);
          FC_REQ(cuEventRecord(e2, b) == CUDA_SUCCESS);
          FC_REQ(cuStreamWaitEvent(a, e2, 0) == CUDA_SUCCESS);
          FC_REQ(info(a).deps.size() == 2 && info(a).deps[1] == after_b.deps[0]);
          usleep(20 * 1000);
          FC_REQ(*word(a_mine) == 0 && *word(b_mine) == 0);  // nothing ran
          FC_REQ(cuStreamEndCapture(a, &g) == CUDA_SUCCESS && g);
          FC_REQ(status(a) == kNone && status(b) == kNone);
          FC_REQ(node_count(g) == 3);
          // The events were recorded in a capture that has ended.
          FC_REQ(cuEventQuery(e2) == CUDA_ERROR_INVALID_VALUE);
          FC_REQ(cuEventSynchronize(e2) == CUDA_ERROR_INVALID_VALUE);
          FC_REQ(cuStreamWaitEvent(b, e2, 0) == CUDA_ERROR_INVALID_VALUE);
          FC_REQ(cuEventRecord(e2, b) == CUDA_SUCCESS && cuEventQuery(e2) == CUDA_SUCCESS);

          // A replay runs all three nodes: A's flag advances by 2, B's by 1.
          *word(a_peer) = 100;
          *word(b_peer) = 100;
          CUgraphExec e;
          FC_REQ(cuGraphInstantiate(&e, g, 0) == CUDA_SUCCESS);
          FC_REQ(cuGraphLaunch(e, a) == CUDA_SUCCESS);
          FC_REQ(cuStreamSynchronize(a) == CUDA_SUCCESS);
          FC_REQ(*word(a_mine) == 2 && *word(b_mine) == 1);
          // B runs its own launches again.
          FC_REQ(launch(k.f, b, b_mine, b_peer, 0) == CUDA_SUCCESS);
          FC_REQ(cuStreamSynchronize(b) == CUDA_SUCCESS && *word(b_mine) == 2);

          // The per-thread default stream joins too.
          FC_REQ(cuStreamBeginCapture(a, kGlobal) == CUDA_SUCCESS);
          FC_REQ(cuEventRecord(e1, a) == CUDA_SUCCESS);
          FC_REQ(cuStreamWaitEvent(CU_STREAM_PER_THREAD, e1, 0) == CUDA_SUCCESS);
          FC_REQ(status(CU_STREAM_PER_THREAD) == kActive);
          FC_REQ(launch(k.f, CU_STREAM_PER_THREAD, b_mine, b_peer, 0) == CUDA_SUCCESS);
          FC_REQ(cuEventRecord(e2, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
          FC_REQ(cuStreamWaitEvent(a, e2, 0) == CUDA_SUCCESS);
          FC_REQ(cuStreamEndCapture(a, &g) == CUDA_SUCCESS && node_count(g) == 1);
          FC_REQ(status(CU_STREAM_PER_THREAD) == kNone);
          return 0;
        }) == 0);
}

TEST_CASE("fakecuda: capture: the origin's end fails while joined work is not joined back") {
  CHECK(with_fork([](const HandshakeSetup& k, Fork& f) {
          // B's kernel never joined back: UNJOINED, and the capture is over.
          CUgraph g = reinterpret_cast<CUgraph>(1);
          FC_REQ(cuStreamEndCapture(f.a, &g) == CUDA_ERROR_STREAM_CAPTURE_UNJOINED && !g);
          FC_REQ(status(f.a) == kNone && status(f.b) == kNone);
          FC_REQ(cuStreamEndCapture(f.a, &g) == CUDA_ERROR_ILLEGAL_STATE);
          FC_REQ(cuStreamEndCapture(f.b, &g) == CUDA_ERROR_ILLEGAL_STATE);
          FC_REQ(*word(k.b.ptr + 16) == 0);  // B's captured kernel never ran
          // Work B launches after its rejoin is not joined back.
          FC_REQ(f.init(k) == 0);
          FC_REQ(f.rejoin() == CUDA_SUCCESS);
          FC_REQ(launch(k.f, f.b, k.b.ptr + 16, k.b.ptr + 24, 0) == CUDA_SUCCESS);
          FC_REQ(cuStreamEndCapture(f.a, &g) == CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
          FC_REQ(status(f.b) == kNone);
          // Nor is the work of a joined stream destroyed meanwhile.
          FC_REQ(f.init(k) == 0);
          FC_REQ(cuStreamDestroy(f.b) == CUDA_SUCCESS);
          FC_REQ(status(f.a) == kActive);
          FC_REQ(cuStreamEndCapture(f.a, &g) == CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
          // A stream that only waited captured nothing: it need not rejoin.
          CUstream a, b;
          CUevent e;
          FC_REQ(create_streams({{&a, 0}, {&b, 0}}) == 0);
          FC_REQ(cuEventCreate(&e, 0) == CUDA_SUCCESS);
          FC_REQ(cuStreamBeginCapture(a, kGlobal) == CUDA_SUCCESS);
          FC_REQ(launch(k.f, a, k.b.ptr, k.b.ptr + 8, 0) == CUDA_SUCCESS);
          FC_REQ(cuEventRecord(e, a) == CUDA_SUCCESS && cuStreamWaitEvent(b, e, 0) == CUDA_SUCCESS);
          FC_REQ(cuStreamBeginCapture(b, kGlobal) == CUDA_ERROR_ILLEGAL_STATE);  // joined
          FC_REQ(cuStreamEndCapture(a, &g) == CUDA_SUCCESS && node_count(g) == 1);
          FC_REQ(status(b) == kNone);
          return 0;
        }) == 0);
}

TEST_CASE("fakecuda: capture: ending a joined stream fails UNMATCHED and invalidates") {
  CHECK(with_fork([](const HandshakeSetup& k, Fork& f) {
          CUgraph g = reinterpret_cast<CUgraph>(1);
          FC_REQ(cuStreamEndCapture(f.b, &g) == CUDA_ERROR_STREAM_CAPTURE_UNMATCHED && !g);
          FC_REQ(status(f.a) == kInvalidated && status(f.b) == kInvalidated);
          FC_REQ(info(f.b).id == 0 && info(f.b).graph == nullptr);
          FC_REQ(launch(k.f, f.b, k.b.ptr, k.b.ptr + 8, 0) ==
                 CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
          FC_REQ(f.rejoin() == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
          FC_REQ(cuStreamEndCapture(f.a, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && !g);
          FC_REQ(status(f.a) == kNone && status(f.b) == kNone);
          // A query on a joined stream invalidates the whole capture as well.
          FC_REQ(f.init(k) == 0);
          FC_REQ(cuStreamQuery(f.b) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
          FC_REQ(status(f.a) == kInvalidated);
          FC_REQ(cuStreamEndCapture(f.a, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
          FC_REQ(status(f.b) == kNone);
          return 0;
        }) == 0);
}

TEST_CASE("fakecuda: capture: waits across captures and on events recorded outside") {
  CHECK(run_child([] {
          HandshakeSetup k;
          FC_REQ(k.init(kHandshake) == 0);
          CUstream a, b, c;
          FC_REQ(create_streams({{&a, 0}, {&b, 0}, {&c, 0}}) == 0);
          CUevent e, outside, never;
          for (CUevent* ev : {&e, &outside, &never}) FC_REQ(cuEventCreate(ev, 0) == CUDA_SUCCESS);
          FC_REQ(cuEventRecord(outside, c) == CUDA_SUCCESS);
          CUgraph g = nullptr;
          // An event recorded outside capture: ISOLATION, invalidated.
          FC_REQ(cuStreamBeginCapture(a, kGlobal) == CUDA_SUCCESS);
          FC_REQ(cuStreamWaitEvent(a, never, 0) == CUDA_SUCCESS);  // no work to wait for
          FC_REQ(cuStreamWaitEvent(a, outside, 2) == CUDA_ERROR_INVALID_VALUE);
          FC_REQ(cuStreamWaitEvent(a, nullptr, 0) == CUDA_ERROR_INVALID_HANDLE);
          FC_REQ(status(a) == kActive);
          FC_REQ(cuStreamWaitEvent(a, outside, 0) == CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
          FC_REQ(status(a) == kInvalidated);
          FC_REQ(cuStreamEndCapture(a, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
          // ... unless waited on as an external event: an event-wait node.
          FC_REQ(cuStreamWaitEvent(c, outside, CU_EVENT_WAIT_EXTERNAL) == CUDA_ERROR_ILLEGAL_STATE);
          FC_REQ(cuEventRecordWithFlags(outside, c, CU_EVENT_RECORD_EXTERNAL) ==
                 CUDA_ERROR_ILLEGAL_STATE);
          FC_REQ(cuStreamBeginCapture(a, kGlobal) == CUDA_SUCCESS);
          FC_REQ(cuStreamWaitEvent(a, outside, CU_EVENT_WAIT_EXTERNAL) == CUDA_SUCCESS);
          FC_REQ(launch(k.f, a, k.b.ptr, k.b.ptr + 8, 0) == CUDA_SUCCESS);
          FC_REQ(cuStreamEndCapture(a, &g) == CUDA_SUCCESS && node_count(g) == 2);
          CUgraphNode first;
          size_t n = 1;
          CUgraphNodeType t = CU_GRAPH_NODE_TYPE_KERNEL;
          FC_REQ(cuGraphGetNodes(g, &first, &n) == CUDA_SUCCESS && n == 1);
          FC_REQ(cuGraphNodeGetType(first, &t) == CUDA_SUCCESS &&
                 t == CU_GRAPH_NODE_TYPE_WAIT_EVENT);
          // Another capture's event: MERGE, both invalidated.
          FC_REQ(cuStreamBeginCapture(a, kGlobal) == CUDA_SUCCESS);
          FC_REQ(cuStreamBeginCapture(b, kGlobal) == CUDA_SUCCESS);
          FC_REQ(cuEventRecord(e, a) == CUDA_SUCCESS);
          FC_REQ(cuStreamWaitEvent(b, e, 0) == CUDA_ERROR_STREAM_CAPTURE_MERGE);
          FC_REQ(status(a) == kInvalidated && status(b) == kInvalidated);
          FC_REQ(cuStreamEndCapture(b, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
          FC_REQ(cuStreamEndCapture(a, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
          // The legacy stream cannot join: IMPLICIT, invalidated.
          FC_REQ(cuStreamBeginCapture(a, kGlobal) == CUDA_SUCCESS);
          FC_REQ(cuEventRecord(e, a) == CUDA_SUCCESS);
          FC_REQ(cuStreamWaitEvent(CU_STREAM_LEGACY, e, 0) == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
          FC_REQ(status(a) == kInvalidated && status(CU_STREAM_LEGACY) == kNone);
          FC_REQ(cuStreamEndCapture(a, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
          // A captured event synchronized: CAPTURED_EVENT, invalidated.
          FC_REQ(cuStreamBeginCapture(a, kGlobal) == CUDA_SUCCESS);
          FC_REQ(cuEventRecord(e, a) == CUDA_SUCCESS);
          FC_REQ(cuEventSynchronize(e) == CUDA_ERROR_CAPTURED_EVENT);
          FC_REQ(cuEventRecord(e, a) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
          FC_REQ(cuStreamEndCapture(a, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
          return 0;
        }) == 0);
}

TEST_CASE("fakecuda: capture: outside capture a wait on an event waits for its kernels") {
  CHECK(run_child([] {
          HandshakeSetup k;
          FC_REQ(k.init(kHandshake) == 0);
          CUstream a, b;
          CUevent e;
          FC_REQ(create_streams({{&a, 0}, {&b, 0}}) == 0 && cuEventCreate(&e, 0) == CUDA_SUCCESS);
          FC_REQ(cuStreamWaitEvent(b, e, 0) == CUDA_SUCCESS);  // never recorded
          // e behind a collective on a that waits for its peer.
          const CUdeviceptr peer = k.b.ptr + 8;
          FC_REQ(launch(k.f, a, k.b.ptr, peer, 1) == CUDA_SUCCESS);
          FC_REQ(cuEventRecord(e, a) == CUDA_SUCCESS);
          FC_REQ(cuEventQuery(e) == CUDA_ERROR_NOT_READY);
          std::thread peer_arrives([&] {
            usleep(100 * 1000);
            *word(peer) = 1;
          });
          const CUresult r = cuStreamWaitEvent(b, e, 0);
          const bool done = *word(peer) == 1;
          peer_arrives.join();
          FC_REQ(r == CUDA_SUCCESS && done);
          FC_REQ(cuEventQuery(e) == CUDA_SUCCESS && cuStreamQuery(b) == CUDA_SUCCESS);
          return 0;
        }) == 0);
}
