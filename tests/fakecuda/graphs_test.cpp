// Simulated driver: stream capture and CUDA graphs (capture.cpp, graphs.cpp).
// Handshake launches captured into a graph run nothing until the graph is
// launched; a node captured with step 0 takes "the next step" (*my_flag + 1)
// when it runs, so replays of a graph advance both ranks' flags by the
// number of its nodes. Also: a graph built by hand with a child graph, the
// query calls, invalidation, refused captures, exec update, and a graph that
// replays after the driver checkpoint of its process. Every case runs in
// forked children: the test process starts no kernel thread.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "fakecuda_test_util.h"
#include "kernels_test_util.h"

using namespace fctest;

namespace {

constexpr const char* kHandshake = "ncclDevKernel_Handshake_Graph";

CUresult launch(CUfunction f, CUstream s, CUdeviceptr mine, CUdeviceptr peer, uint64_t step) {
  void* params[] = {&mine, &peer, &step};
  return cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, params, nullptr);
}

/// Captures n handshake launches (mine, peer, step 0) on s into *g.
CUresult capture_chain(CUstream s, CUfunction f, CUdeviceptr mine, CUdeviceptr peer, int n,
                       CUgraph* g) {
  if (CUresult r = cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL)) return r;
  for (int i = 0; i < n; ++i)
    if (CUresult r = launch(f, s, mine, peer, 0)) return r;
  return cuStreamEndCapture(s, g);
}

/// Adds a handshake kernel node (mine, peer, step) to g.
CUresult add_handshake(CUgraphNode* out, CUgraph g, std::vector<CUgraphNode> deps, CUfunction f,
                       CUdeviceptr mine, CUdeviceptr peer, uint64_t step) {
  void* params[] = {&mine, &peer, &step};
  CUDA_KERNEL_NODE_PARAMS p{};
  p.func = f;
  p.gridDimX = p.gridDimY = p.gridDimZ = 1;
  p.blockDimX = p.blockDimY = p.blockDimZ = 1;
  p.kernelParams = params;
  return cuGraphAddKernelNode(out, g, deps.data(), deps.size(), &p);
}

/// The nodes of g (two-call pattern).
std::vector<CUgraphNode> nodes_of(CUgraph g) {
  size_t n = 0;
  if (cuGraphGetNodes(g, nullptr, &n) != CUDA_SUCCESS) return {};
  std::vector<CUgraphNode> v(n);
  if (n && cuGraphGetNodes(g, v.data(), &n) != CUDA_SUCCESS) return {};
  return v;
}

/// The three arguments a handshake kernel node keeps.
bool node_args(CUgraphNode node, CUfunction f, CUdeviceptr mine, CUdeviceptr peer,
               uint64_t step) {
  CUDA_KERNEL_NODE_PARAMS p{};
  if (cuGraphKernelNodeGetParams(node, &p) != CUDA_SUCCESS) return false;
  if (p.func != f || p.kern != nullptr || !p.kernelParams) return false;
  CUdeviceptr m, q;
  uint64_t st;
  memcpy(&m, p.kernelParams[0], 8);
  memcpy(&q, p.kernelParams[1], 8);
  memcpy(&st, p.kernelParams[2], 8);
  return m == mine && q == peer && st == step;
}

}  // namespace

TEST_CASE("fakecuda: graph capture records handshake launches and runs nothing") {
  CHECK(run_child([] {
          HandshakeSetup k;
          FC_REQ(k.init(kHandshake) == 0);
          CUfunction f = k.f, plain = load_function("vector_add");
          FC_REQ(plain);
          CUdeviceptr mine = k.b.ptr, peer = k.b.ptr + 8;
          CUstream s;
          FC_REQ(cuStreamCreate(&s, 0) == CUDA_SUCCESS);
          CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_ACTIVE;
          FC_REQ(cuStreamIsCapturing(s, &st) == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_NONE);
          FC_REQ(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS);
          FC_REQ(cuStreamIsCapturing(s, &st) == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
          cuuint64_t id = 0;
          CUgraph building = nullptr;
          const CUgraphNode* deps = reinterpret_cast<const CUgraphNode*>(1);
          size_t ndeps = 99;
          FC_REQ(cuStreamGetCaptureInfo(s, &st, &id, &building, &deps, nullptr, &ndeps) ==
                 CUDA_SUCCESS);
          FC_REQ(st == CU_STREAM_CAPTURE_STATUS_ACTIVE && id != 0 && building);
          FC_REQ(deps == nullptr && ndeps == 0);

          // kernelParams, `extra` and cuLaunchKernelEx; a plain kernel too.
          FC_REQ(launch(f, s, mine, peer, 0) == CUDA_SUCCESS);
          uint64_t buf[3] = {mine, peer, 7};
          size_t size = sizeof buf;
          void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                           CU_LAUNCH_PARAM_END};
          FC_REQ(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, nullptr, extra) == CUDA_SUCCESS);
          FC_REQ(cuLaunchKernel(plain, 4, 2, 1, 64, 1, 1, 128, s, nullptr, nullptr) ==
                 CUDA_SUCCESS);
          CUlaunchConfig cfg{};
          cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
          cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
          cfg.hStream = s;
          CUdeviceptr m2 = mine, p2 = peer;
          uint64_t step = 0;
          void* params[] = {&m2, &p2, &step};
          FC_REQ(cuLaunchKernelEx(&cfg, f, params, nullptr) == CUDA_SUCCESS);
          // A handshake kernel still needs its arguments.
          FC_REQ(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, nullptr, nullptr) ==
                 CUDA_ERROR_INVALID_VALUE);
          buf[2] = 99;  // arguments were copied at capture
          m2 = 0;
          usleep(50 * 1000);
          FC_REQ(*word(mine) == 0 && *word(peer) == 0);  // nothing ran

          CUgraph g = nullptr;
          FC_REQ(cuStreamEndCapture(s, &g) == CUDA_SUCCESS && g == building);
          FC_REQ(cuStreamIsCapturing(s, &st) == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_NONE);
          FC_REQ(cuStreamQuery(s) == CUDA_SUCCESS);  // nothing pending
          FC_REQ(cuStreamEndCapture(s, &g) == CUDA_ERROR_ILLEGAL_STATE);

          // GetNodes: count, a short and a long buffer.
          std::vector<CUgraphNode> nodes = nodes_of(g);
          FC_REQ(nodes.size() == 4);
          CUgraphNode two[2] = {};
          size_t n = 2;
          FC_REQ(cuGraphGetNodes(g, two, &n) == CUDA_SUCCESS && n == 2);
          FC_REQ(two[0] == nodes[0] && two[1] == nodes[1]);
          CUgraphNode six[6];
          for (auto& x : six) x = reinterpret_cast<CUgraphNode>(1);
          n = 6;
          FC_REQ(cuGraphGetNodes(g, six, &n) == CUDA_SUCCESS && n == 4);
          FC_REQ(six[3] == nodes[3] && six[4] == nullptr && six[5] == nullptr);
          FC_REQ(cuGraphGetNodes(g, nullptr, nullptr) == CUDA_ERROR_INVALID_VALUE);

          for (CUgraphNode node : nodes) {
            CUgraphNodeType t = CU_GRAPH_NODE_TYPE_GRAPH;
            FC_REQ(cuGraphNodeGetType(node, &t) == CUDA_SUCCESS && t == CU_GRAPH_NODE_TYPE_KERNEL);
          }
          FC_REQ(node_args(nodes[0], f, mine, peer, 0));
          FC_REQ(node_args(nodes[1], f, mine, peer, 7));
          FC_REQ(node_args(nodes[3], f, mine, peer, 0));
          CUDA_KERNEL_NODE_PARAMS p{};
          FC_REQ(cuGraphKernelNodeGetParams(nodes[2], &p) == CUDA_SUCCESS);
          FC_REQ(p.func == plain && p.gridDimX == 4 && p.gridDimY == 2 && p.blockDimX == 64);
          FC_REQ(p.sharedMemBytes == 128 && p.kernelParams == nullptr);
          CUgraph child;
          FC_REQ(cuGraphChildGraphNodeGetGraph(nodes[0], &child) == CUDA_ERROR_INVALID_VALUE);

          // A new capture has a new id.
          FC_REQ(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
          cuuint64_t id2 = 0;
          FC_REQ(cuStreamGetCaptureInfo(s, &st, &id2, nullptr, nullptr, nullptr, nullptr) ==
                 CUDA_SUCCESS);
          FC_REQ(id2 != 0 && id2 != id);
          CUgraph empty = nullptr;
          FC_REQ(cuStreamEndCapture(s, &empty) == CUDA_SUCCESS && nodes_of(empty).empty());

          // Launched, the graph runs in stream order: the first node stores
          // step 1 and waits; with the peer far ahead the nodes store 1, 7, 8.
          CUgraphExec e;
          FC_REQ(cuGraphInstantiate(&e, g, 0) == CUDA_SUCCESS);
          FC_REQ(cuGraphLaunch(e, s) == CUDA_SUCCESS);
          FC_REQ(within(2000, [&] { return *word(mine) == 1; }));
          usleep(20 * 1000);
          FC_REQ(cuStreamQuery(s) == CUDA_ERROR_NOT_READY);
          *word(peer) = 100;
          FC_REQ(cuStreamSynchronize(s) == CUDA_SUCCESS);
          FC_REQ(*word(mine) == 8);
          FC_REQ(cuGraphExecDestroy(e) == CUDA_SUCCESS);
          FC_REQ(cuGraphExecDestroy(e) == CUDA_ERROR_INVALID_VALUE);
          FC_REQ(cuGraphDestroy(g) == CUDA_SUCCESS);
          FC_REQ(cuGraphDestroy(g) == CUDA_ERROR_INVALID_VALUE);
          CUgraphNodeType t;
          FC_REQ(cuGraphNodeGetType(nodes[0], &t) == CUDA_ERROR_INVALID_VALUE);
          return 0;
        }) == 0);
}

TEST_CASE("fakecuda: graph capture refuses the legacy stream and wrong states") {
  CHECK(run_child([] {
          HandshakeSetup k;
          FC_REQ(k.init(kHandshake) == 0);
          CUstream s;
          FC_REQ(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
          auto global = CU_STREAM_CAPTURE_MODE_GLOBAL;
          FC_REQ(cuStreamBeginCapture(nullptr, global) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
          FC_REQ(cuStreamBeginCapture(CU_STREAM_LEGACY, global) ==
                 CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
          CUgraph g = nullptr;
          FC_REQ(cuStreamEndCapture(nullptr, &g) == CUDA_ERROR_ILLEGAL_STATE);
          FC_REQ(cuStreamEndCapture(s, &g) == CUDA_ERROR_ILLEGAL_STATE);
          FC_REQ(cuStreamBeginCapture(s, static_cast<CUstreamCaptureMode>(7)) ==
                 CUDA_ERROR_INVALID_VALUE);
          FC_REQ(cuStreamBeginCapture(s, global) == CUDA_SUCCESS);
          FC_REQ(cuStreamBeginCapture(s, global) == CUDA_ERROR_ILLEGAL_STATE);
          // GLOBAL mode: ended by the thread that began.
          CUresult other = CUDA_SUCCESS;
          std::thread([&] {
            cuCtxSetCurrent(k.ctx);
            other = cuStreamEndCapture(s, &g);
          }).join();
          FC_REQ(other == CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
          FC_REQ(cuStreamEndCapture(s, &g) == CUDA_SUCCESS && g);
          // RELAXED: any thread.
          FC_REQ(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
          std::thread([&] {
            cuCtxSetCurrent(k.ctx);
            other = cuStreamEndCapture(s, &g);
          }).join();
          FC_REQ(other == CUDA_SUCCESS);
          // The per-thread default stream captures.
          FC_REQ(cuStreamBeginCapture(CU_STREAM_PER_THREAD, global) == CUDA_SUCCESS);
          FC_REQ(launch(k.f, CU_STREAM_PER_THREAD, k.b.ptr, k.b.ptr + 8, 0) == CUDA_SUCCESS);
          CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
          FC_REQ(cuStreamIsCapturing(CU_STREAM_PER_THREAD, &st) == CUDA_SUCCESS &&
                 st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
          FC_REQ(cuStreamIsCapturing(nullptr, &st) == CUDA_SUCCESS &&
                 st == CU_STREAM_CAPTURE_STATUS_NONE);  // the legacy stream
          FC_REQ(cuStreamEndCapture(CU_STREAM_PER_THREAD, &g) == CUDA_SUCCESS);
          FC_REQ(nodes_of(g).size() == 1 && *word(k.b.ptr) == 0);
          FC_REQ(cuStreamIsCapturing(s, nullptr) == CUDA_ERROR_INVALID_VALUE);
          FC_REQ(cuStreamEndCapture(s, nullptr) == CUDA_ERROR_INVALID_VALUE);
          // Destroying a capturing stream ends its capture.
          CUstream t;
          FC_REQ(cuStreamCreate(&t, 0) == CUDA_SUCCESS);
          FC_REQ(cuStreamBeginCapture(t, global) == CUDA_SUCCESS);
          FC_REQ(cuStreamDestroy(t) == CUDA_SUCCESS);
          return 0;
        }) == 0);
}

TEST_CASE("fakecuda: graph capture is invalidated by a synchronize, a query or a copy") {
  CHECK(run_child([] {
          HandshakeSetup k;
          FC_REQ(k.init(kHandshake) == 0);
          CUdeviceptr mine = k.b.ptr, peer = k.b.ptr + 8;
          CUstream s;
          FC_REQ(cuStreamCreate(&s, 0) == CUDA_SUCCESS);
          CUgraph ok = nullptr;
          FC_REQ(capture_chain(s, k.f, mine, peer, 1, &ok) == CUDA_SUCCESS);
          CUgraphExec e;
          FC_REQ(cuGraphInstantiate(&e, ok, 0) == CUDA_SUCCESS);
          uint64_t v = 5;
          using Op = std::function<CUresult()>;
          const Op ops[] = {
              [&] { return cuStreamSynchronize(s); },
              [&] { return cuStreamQuery(s); },
              [&] { return cuMemcpyHtoDAsync(peer + 8, &v, 8, s); },
              [&] { return cuMemsetD8Async(peer + 8, 0, 8, s); },
              [&] { return cuGraphLaunch(e, s); },
          };
          for (const Op& op : ops) {
            FC_REQ(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
            FC_REQ(launch(k.f, s, mine, peer, 1) == CUDA_SUCCESS);
            FC_REQ(op() == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
            CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
            FC_REQ(cuStreamIsCapturing(s, &st) == CUDA_SUCCESS &&
                   st == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
            FC_REQ(launch(k.f, s, mine, peer, 1) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
            CUgraph g = reinterpret_cast<CUgraph>(1);
            FC_REQ(cuStreamEndCapture(s, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
            FC_REQ(g == nullptr);
            FC_REQ(cuStreamIsCapturing(s, &st) == CUDA_SUCCESS &&
                   st == CU_STREAM_CAPTURE_STATUS_NONE);
            FC_REQ(*word(mine) == 0 && *word(peer + 8) == 0);  // nothing ran or copied
          }
          // The stream works again once the capture has ended.
          FC_REQ(cuStreamSynchronize(s) == CUDA_SUCCESS);
          FC_REQ(cuMemcpyHtoDAsync(peer + 8, &v, 8, s) == CUDA_SUCCESS && *word(peer + 8) == 5);
          return 0;
        }) == 0);
}

TEST_CASE("fakecuda: graph with a child graph, built by hand, replays as a snapshot") {
  CHECK(run_child([] {
          HandshakeSetup k;
          FC_REQ(k.init(kHandshake) == 0);
          CUfunction f = k.f;
          CUdeviceptr mine = k.b.ptr, peer = k.b.ptr + 8;
          CUgraph child, parent, other;
          FC_REQ(cuGraphCreate(&child, 0) == CUDA_SUCCESS);
          FC_REQ(cuGraphCreate(&parent, 0) == CUDA_SUCCESS);
          FC_REQ(cuGraphCreate(&other, 0) == CUDA_SUCCESS);
          FC_REQ(cuGraphCreate(&other, 1) == CUDA_ERROR_INVALID_VALUE);
          CUgraphNode c1, c2, a, sub, b, x;
          FC_REQ(add_handshake(&c1, child, {}, f, mine, peer, 0) == CUDA_SUCCESS);
          FC_REQ(add_handshake(&c2, child, {c1}, f, mine, peer, 0) == CUDA_SUCCESS);
          FC_REQ(add_handshake(&a, parent, {}, f, mine, peer, 0) == CUDA_SUCCESS);
          FC_REQ(cuGraphAddChildGraphNode(&sub, parent, &a, 1, child) == CUDA_SUCCESS);
          // A library kernel (kern) names the function when func is NULL.
          CUdeviceptr m = mine, p = peer;
          uint64_t step = 0;
          void* params[] = {&m, &p, &step};
          CUDA_KERNEL_NODE_PARAMS kp{};
          kp.kern = reinterpret_cast<CUkernel>(f);
          kp.gridDimX = kp.gridDimY = kp.gridDimZ = kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
          kp.kernelParams = params;
          FC_REQ(cuGraphAddKernelNode(&b, parent, &sub, 1, &kp) == CUDA_SUCCESS);
          FC_REQ(node_args(b, f, mine, peer, 0));
          // Refused: a dependency of another graph, a bad graph, a handshake
          // node without arguments, a child graph that is the graph itself.
          FC_REQ(add_handshake(&x, other, {a}, f, mine, peer, 0) == CUDA_ERROR_INVALID_VALUE);
          FC_REQ(add_handshake(&x, parent, {a, a}, f, mine, peer, 0) == CUDA_ERROR_INVALID_VALUE);
          FC_REQ(add_handshake(&x, reinterpret_cast<CUgraph>(&x), {}, f, mine, peer, 0) ==
                 CUDA_ERROR_INVALID_VALUE);
          kp.kernelParams = nullptr;
          FC_REQ(cuGraphAddKernelNode(&x, other, nullptr, 0, &kp) == CUDA_ERROR_INVALID_VALUE);
          FC_REQ(cuGraphAddChildGraphNode(&x, parent, nullptr, 0, parent) ==
                 CUDA_ERROR_INVALID_VALUE);
          FC_REQ(nodes_of(other).empty());

          // The node holds a clone: later changes to `child` do not reach it.
          FC_REQ(add_handshake(&x, child, {c2}, f, mine, peer, 0) == CUDA_SUCCESS);
          CUgraphNodeType t;
          FC_REQ(cuGraphNodeGetType(sub, &t) == CUDA_SUCCESS && t == CU_GRAPH_NODE_TYPE_GRAPH);
          CUgraph inner = nullptr;
          FC_REQ(cuGraphChildGraphNodeGetGraph(sub, &inner) == CUDA_SUCCESS && inner != child);
          std::vector<CUgraphNode> in = nodes_of(inner);
          FC_REQ(in.size() == 2 && in[0] != c1 && node_args(in[1], f, mine, peer, 0));
          FC_REQ(cuGraphDestroy(inner) == CUDA_ERROR_INVALID_VALUE);  // the node's
          FC_REQ(nodes_of(parent).size() == 3);

          // Four handshake nodes per launch: the flag advances by four.
          CUDA_GRAPH_INSTANTIATE_PARAMS ip{};
          ip.result_out = CUDA_GRAPH_INSTANTIATE_ERROR;
          CUgraphExec e;
          FC_REQ(cuGraphInstantiateWithParams(&e, parent, &ip) == CUDA_SUCCESS);
          FC_REQ(ip.result_out == CUDA_GRAPH_INSTANTIATE_SUCCESS);
          *word(peer) = 1000;
          CUstream s;
          FC_REQ(cuStreamCreate(&s, 0) == CUDA_SUCCESS);
          FC_REQ(cuGraphLaunch(e, s) == CUDA_SUCCESS && cuGraphLaunch(e, s) == CUDA_SUCCESS);
          FC_REQ(cuStreamSynchronize(s) == CUDA_SUCCESS && *word(mine) == 8);
          // An exec is a snapshot: a node added to the graph, or the graph
          // destroyed, changes nothing.
          FC_REQ(add_handshake(&x, parent, {b}, f, mine, peer, 0) == CUDA_SUCCESS);
          FC_REQ(cuGraphDestroy(child) == CUDA_SUCCESS);
          FC_REQ(cuGraphLaunch(e, nullptr) == CUDA_SUCCESS);
          FC_REQ(cuStreamSynchronize(nullptr) == CUDA_SUCCESS && *word(mine) == 12);
          FC_REQ(cuGraphDestroy(parent) == CUDA_SUCCESS);
          FC_REQ(cuGraphChildGraphNodeGetGraph(sub, &inner) == CUDA_ERROR_INVALID_VALUE);
          FC_REQ(cuGraphLaunch(e, s) == CUDA_SUCCESS);
          FC_REQ(cuStreamSynchronize(s) == CUDA_SUCCESS && *word(mine) == 16);
          FC_REQ(cuGraphLaunch(reinterpret_cast<CUgraphExec>(&x), s) == CUDA_ERROR_INVALID_VALUE);

          // A forked child has none of its parent's graphs.
          int forked = run_child([&] {
            FC_REQ(init_primary() == CUDA_SUCCESS);
            FC_REQ(cuGraphLaunch(e, nullptr) == CUDA_ERROR_INVALID_VALUE);
            size_t n = 0;
            FC_REQ(cuGraphGetNodes(other, nullptr, &n) == CUDA_ERROR_INVALID_VALUE);
            return 0;
          });
          FC_REQ(forked == 0);
          return 0;
        }) == 0);
}

TEST_CASE("fakecuda: graph exec update takes new arguments, refuses another structure") {
  CHECK(run_child([] {
          HandshakeSetup k;
          FC_REQ(k.init(kHandshake) == 0);
          CUfunction f = k.f, g2 = load_function("ncclDevKernel_Handshake_Other");
          FC_REQ(g2);
          CUdeviceptr a = k.b.ptr, b = k.b.ptr + 8, peer = k.b.ptr + 16;
          *word(peer) = 1000;
          CUstream s;
          FC_REQ(cuStreamCreate(&s, 0) == CUDA_SUCCESS);
          CUgraph on_a, on_b, longer, changed;
          FC_REQ(capture_chain(s, f, a, peer, 2, &on_a) == CUDA_SUCCESS);
          FC_REQ(capture_chain(s, f, b, peer, 2, &on_b) == CUDA_SUCCESS);
          FC_REQ(capture_chain(s, f, b, peer, 3, &longer) == CUDA_SUCCESS);
          FC_REQ(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
          FC_REQ(launch(f, s, b, peer, 0) == CUDA_SUCCESS);
          FC_REQ(launch(g2, s, b, peer, 0) == CUDA_SUCCESS);
          FC_REQ(cuStreamEndCapture(s, &changed) == CUDA_SUCCESS);

          CUgraphExec e;
          FC_REQ(cuGraphInstantiate(&e, on_a, 0) == CUDA_SUCCESS);
          FC_REQ(cuGraphLaunch(e, s) == CUDA_SUCCESS && cuStreamSynchronize(s) == CUDA_SUCCESS);
          FC_REQ(*word(a) == 2 && *word(b) == 0);
          CUgraphExecUpdateResultInfo info{};
          info.result = CU_GRAPH_EXEC_UPDATE_ERROR;
          FC_REQ(cuGraphExecUpdate(e, on_b, &info) == CUDA_SUCCESS);
          FC_REQ(info.result == CU_GRAPH_EXEC_UPDATE_SUCCESS && info.errorNode == nullptr);
          FC_REQ(cuGraphLaunch(e, s) == CUDA_SUCCESS && cuStreamSynchronize(s) == CUDA_SUCCESS);
          FC_REQ(*word(a) == 2 && *word(b) == 2);

          FC_REQ(cuGraphExecUpdate(e, longer, &info) == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
          FC_REQ(info.result == CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED);
          FC_REQ(info.errorNode == nodes_of(longer)[2]);
          // A failed update keeps what the exec had.
          FC_REQ(cuGraphLaunch(e, s) == CUDA_SUCCESS && cuStreamSynchronize(s) == CUDA_SUCCESS);
          FC_REQ(*word(a) == 2 && *word(b) == 4);
          // Another function in a node of the same structure is taken (drivers
          // since CUDA 11.2), and its node runs.
          FC_REQ(cuGraphExecUpdate(e, changed, &info) == CUDA_SUCCESS);
          FC_REQ(info.result == CU_GRAPH_EXEC_UPDATE_SUCCESS);
          FC_REQ(cuGraphLaunch(e, s) == CUDA_SUCCESS && cuStreamSynchronize(s) == CUDA_SUCCESS);
          FC_REQ(*word(a) == 2 && *word(b) == 6);
          FC_REQ(cuGraphExecUpdate(e, on_a, nullptr) == CUDA_ERROR_INVALID_VALUE);
          FC_REQ(cuGraphExecUpdate(e, reinterpret_cast<CUgraph>(&info), &info) ==
                 CUDA_ERROR_INVALID_VALUE);

          // The CUDA 10.2 form, through cuGetProcAddress.
          using UpdateV1 = CUresult (*)(CUgraphExec, CUgraph, CUgraphNode*, CUgraphExecUpdateResult*);
          void* fn = nullptr;
          CUdriverProcAddressQueryResult q;
          FC_REQ(cuGetProcAddress("cuGraphExecUpdate", &fn, 11000, CU_GET_PROC_ADDRESS_DEFAULT,
                                  &q) == CUDA_SUCCESS && fn);
          CUgraphNode err_node = nullptr;
          CUgraphExecUpdateResult r = CU_GRAPH_EXEC_UPDATE_SUCCESS;
          FC_REQ(reinterpret_cast<UpdateV1>(fn)(e, longer, &err_node, &r) ==
                 CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
          FC_REQ(r == CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED);
          FC_REQ(reinterpret_cast<UpdateV1>(fn)(e, on_a, &err_node, &r) == CUDA_SUCCESS);
          FC_REQ(r == CU_GRAPH_EXEC_UPDATE_SUCCESS);
          FC_REQ(cuGraphLaunch(e, s) == CUDA_SUCCESS && cuStreamSynchronize(s) == CUDA_SUCCESS);
          FC_REQ(*word(a) == 4 && *word(b) == 6);
          return 0;
        }) == 0);
}

namespace {

constexpr int kNodes = 3;    // handshake nodes per graph
constexpr int kReplays = 100;

/// One rank replaying a captured collective: its flag in its own exported
/// allocation, the peer's in the imported one (kernels_test.cpp's rank_main).
/// Rank 1 instantiates through the 5-argument cuGraphInstantiate.
int graph_rank(int sock, int rank) {
  HandshakeSetup k;
  FC_REQ(k.init(kHandshake) == 0);
  const VmmBuffer& own = k.b;
  CUdeviceptr peer;
  FC_REQ(exchange_with_peer(sock, own, &peer) == 0);
  CUstream s;
  FC_REQ(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CUgraph g;
  FC_REQ(capture_chain(s, k.f, own.ptr, peer, kNodes, &g) == CUDA_SUCCESS);
  usleep(20 * 1000);
  FC_REQ(*word(own.ptr) == 0);  // captured, not run
  CUgraphExec e;
  if (rank == 0) {
    FC_REQ(cuGraphInstantiate(&e, g, 0) == CUDA_SUCCESS);
  } else {
    using InstantiateV1 = CUresult (*)(CUgraphExec*, CUgraph, CUgraphNode*, char*, size_t);
    void* fn = nullptr;
    CUdriverProcAddressQueryResult q;
    FC_REQ(cuGetProcAddress("cuGraphInstantiate", &fn, 11000, CU_GET_PROC_ADDRESS_DEFAULT, &q) ==
           CUDA_SUCCESS && fn);
    char log[16] = "x";
    CUgraphNode err = reinterpret_cast<CUgraphNode>(1);
    FC_REQ(reinterpret_cast<InstantiateV1>(fn)(&e, g, &err, log, sizeof log) == CUDA_SUCCESS);
    FC_REQ(err == nullptr && log[0] == '\0');
  }
  for (uint64_t r = 1; r <= kReplays; ++r) {
    FC_REQ(cuGraphLaunch(e, s) == CUDA_SUCCESS);
    FC_REQ(cuStreamSynchronize(s) == CUDA_SUCCESS);
    FC_REQ(*word(own.ptr) == r * kNodes);
    FC_REQ(*word(peer) >= r * kNodes);
  }
  return 0;
}

}  // namespace

TEST_CASE("fakecuda: graph replays a collective between two processes, step after step") {
  const char* failed = run_rank_pair([](int sock) { return graph_rank(sock, 0); },
                                     [](int sock) { return graph_rank(sock, 1); });
  CHECK_MESSAGE(failed == nullptr, (failed ? failed : ""));
}

namespace {

/// Two ranks in one process (two non-blocking streams, flags in its own
/// allocation) replay their graphs; after the coordinator's checkpoint and
/// restore the same execs replay again, continuing from the restored flags.
int checkpointed_graphs(int sock) {
  HandshakeSetup k;
  FC_REQ(k.init(kHandshake) == 0);
  CUdeviceptr a = k.b.ptr, b = k.b.ptr + 8;
  CUstream sa, sb;
  FC_REQ(create_streams({{&sa, CU_STREAM_NON_BLOCKING}, {&sb, CU_STREAM_NON_BLOCKING}}) == 0);
  CUgraph ga, gb;
  FC_REQ(capture_chain(sa, k.f, a, b, 2, &ga) == CUDA_SUCCESS);
  FC_REQ(capture_chain(sb, k.f, b, a, 2, &gb) == CUDA_SUCCESS);
  CUgraphExec ea, eb;
  FC_REQ(cuGraphInstantiate(&ea, ga, 0) == CUDA_SUCCESS);
  FC_REQ(cuGraphInstantiate(&eb, gb, 0) == CUDA_SUCCESS);
  auto replay = [&](int times) {
    for (int i = 0; i < times; ++i)
      if (cuGraphLaunch(ea, sa) != CUDA_SUCCESS || cuGraphLaunch(eb, sb) != CUDA_SUCCESS)
        return false;
    return cuStreamSynchronize(sa) == CUDA_SUCCESS && cuStreamSynchronize(sb) == CUDA_SUCCESS;
  };
  FC_REQ(replay(3));
  FC_REQ(*word(a) == 6 && *word(b) == 6);
  FC_REQ(send_u64(sock, 1));
  uint64_t go = 0;
  FC_REQ(recv_u64(sock, &go));  // checkpointed, restored and unlocked meanwhile
  std::vector<CUgraphNode> nodes = nodes_of(ga);
  FC_REQ(nodes.size() == 2 && node_args(nodes[1], k.f, a, b, 0));
  FC_REQ(replay(3));
  FC_REQ(*word(a) == 12 && *word(b) == 12);
  FC_REQ(send_u64(sock, 0));
  return 0;
}

/// Runs fn in a child; once it sends 1, runs the driver's checkpoint cycle on
/// it and sends 1 back; fn then sends 0 when all went well.
void cycle_while_child_waits(const std::function<int(int sock)>& fn) {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  Child t = spawn(fn);
  uint64_t ready = 0;
  REQUIRE(recv_u64(t.sock, &ready));
  REQUIRE(ready == 1);
  REQUIRE(driver_cycle(t.pid, 2000) == CUDA_SUCCESS);
  CHECK(send_u64(t.sock, 1));
  uint64_t result = 99;
  CHECK(recv_u64(t.sock, &result));
  CHECK(result == 0);
  CHECK(t.join() == 0);
}

}  // namespace

TEST_CASE("fakecuda: graph survives the driver checkpoint of its process and replays") {
  cycle_while_child_waits(checkpointed_graphs);
}

namespace {

/// A capture under way across the driver checkpoint of its process, as
/// measured on the H200 (docs/gpu-runs/capture-checkpoint-h200.log): stream sa
/// begins a capture, sb joins it through an event and captures two handshake
/// launches of its own; the coordinator locks, checkpoints, restores and
/// unlocks the process meanwhile. The capture is still active afterwards,
/// joins back, ends, and its graph replays.
int checkpointed_capture(int sock, CUstreamCaptureMode mode) {
  HandshakeSetup k;
  FC_REQ(k.init(kHandshake) == 0);
  CUdeviceptr a = k.b.ptr, b = k.b.ptr + 8;
  CUstream sa, sb, other;
  FC_REQ(create_streams({{&sa, CU_STREAM_NON_BLOCKING},
                         {&sb, CU_STREAM_NON_BLOCKING},
                         {&other, CU_STREAM_NON_BLOCKING}}) == 0);
  CUevent fork_ev, join_ev;
  FC_REQ(cuEventCreate(&fork_ev, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
  FC_REQ(cuEventCreate(&join_ev, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
  FC_REQ(cuStreamBeginCapture(sa, mode) == CUDA_SUCCESS);
  FC_REQ(cuEventRecord(fork_ev, sa) == CUDA_SUCCESS);
  FC_REQ(cuStreamWaitEvent(sb, fork_ev, 0) == CUDA_SUCCESS);
  FC_REQ(launch(k.f, sb, a, b, 0) == CUDA_SUCCESS);
  FC_REQ(launch(k.f, sb, a, b, 0) == CUDA_SUCCESS);
  FC_REQ(send_u64(sock, 1));
  uint64_t go = 0;
  FC_REQ(recv_u64(sock, &go));  // checkpointed, restored and unlocked meanwhile
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  FC_REQ(cuStreamIsCapturing(sb, &st) == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  FC_REQ(cuEventRecord(join_ev, sb) == CUDA_SUCCESS);
  FC_REQ(cuStreamWaitEvent(sa, join_ev, 0) == CUDA_SUCCESS);
  CUgraph g = nullptr;
  FC_REQ(cuStreamEndCapture(sa, &g) == CUDA_SUCCESS && g);
  FC_REQ(nodes_of(g).size() >= 2);
  CUgraphExec e;
  FC_REQ(cuGraphInstantiate(&e, g, 0) == CUDA_SUCCESS);
  // The peer's half of each handshake comes from a plain launch on another
  // stream, so the graph's two collectives complete.
  FC_REQ(cuGraphLaunch(e, sa) == CUDA_SUCCESS);
  FC_REQ(launch(k.f, other, b, a, 1) == CUDA_SUCCESS);
  FC_REQ(launch(k.f, other, b, a, 2) == CUDA_SUCCESS);
  FC_REQ(cuStreamSynchronize(sa) == CUDA_SUCCESS && cuStreamSynchronize(other) == CUDA_SUCCESS);
  FC_REQ(*word(a) == 2 && *word(b) == 2);
  FC_REQ(send_u64(sock, 0));
  return 0;
}

}  // namespace

TEST_CASE("fakecuda: a capture under way survives the driver checkpoint of its process") {
  for (CUstreamCaptureMode mode : {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_RELAXED}) {
    CAPTURE(int(mode));
    cycle_while_child_waits([mode](int sock) { return checkpointed_capture(sock, mode); });
  }
}
