// The cut counts collective kernels launched from CUDA graphs (src/shim/
// graphs.h; docs/design.md "Cut across collective ranks"), under the preloaded
// shim against the simulated driver: ctest shim.track.cut_graphs.
//
// One workload process, forked before any CUDA activity, launches kernels on
// the test's command; the test's own process is the coordinator and reads the
// shim's cut state ("cut" requests) after each command. The collective kernel
// is a plain kernel of the simulated driver named like NCCL's (it runs
// nothing), so one process can launch it alone.
//   - direct launches count one each; launches captured into a graph count
//     nothing (cuStreamIsCapturing), a plain kernel nothing
//   - each launch of an instance counts the graph's collective nodes (3);
//     a graph without collectives counts nothing
//   - a built graph: a kernel node plus a child graph node holding the
//     captured graph counts 1 + 3
//   - an instance updated (cuGraphExecUpdate) to a graph with other
//     collectives is counted anew
//   - the cut: armed with a target the graph's 3 launches do not fit under,
//     the graph launch holds (outside the gate) while a single launch would
//     pass; a target they fit under lets it go; release lets a held launch go
//   - a destroyed instance is forgotten: its handle counts nothing
//   - PyTorch's capture of an NCCL collective: a second stream joins the
//     capture through an event and launches the collective there (counts
//     nothing: that stream reports capturing too; a drain meanwhile is
//     refused rather than invalidate the capture), then is joined back
//     through another event; each launch of the instance counts its
//     collectives on both streams (2)
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "tests/fakecuda/fakecuda_test_util.h"
#include "tests/shim/ckpt_client.h"

using namespace fctest;
using namespace ckpt_client;

namespace {

// Mangled, as the driver names NCCL's kernels; the simulated driver runs it
// as a plain kernel (only ncclDevKernel_Handshake* kernels wait for a peer).
constexpr const char* kCollective = "_Z24ncclDevKernel_AllReduce_Testv";
constexpr const char* kPlain = "_Z11plainKernelv";

enum Cmd : uint64_t {
  kDirect = 1,  // one direct launch of the collective
  kCapture,     // capture 3 collectives + 1 plain, instantiate: instance A
  kLaunchA,     // launch instance A
  kPlainGraph,  // capture 2 plain kernels, instantiate, launch
  kBuilt,       // graph: collective node + child graph (the captured one); launch it
  kUpdateA,     // update instance A to a graph of 1 collective + 3 plain; launch it
  kDestroyA,    // destroy instance A, launch its stale handle (must fail)
  kJoinFork,    // capture on s: plain; stream b joins through an event, collective on b
  kJoinEnd,     // s waits on an event of b, collective on s, end, instantiate: instance J
  kLaunchJ,     // launch instance J
  kFinish,
};

int workload(int sock) {
  CUcontext ctx;
  FC_REQ(init_primary(&ctx) == CUDA_SUCCESS);
  static const char image[] = "cut_graphs: placeholder module image";
  CUmodule mod;
  FC_REQ(cuModuleLoadData(&mod, image) == CUDA_SUCCESS);
  CUfunction coll, plain;
  FC_REQ(cuModuleGetFunction(&coll, mod, kCollective) == CUDA_SUCCESS);
  FC_REQ(cuModuleGetFunction(&plain, mod, kPlain) == CUDA_SUCCESS);
  CUstream s, b;  // b: the collectives' own stream of kJoin*
  FC_REQ(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  FC_REQ(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CUevent fork_ev, join_ev;
  FC_REQ(cuEventCreate(&fork_ev, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
  FC_REQ(cuEventCreate(&join_ev, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
  auto launch_on = [&](CUstream st, CUfunction f) {
    return cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, st, nullptr, nullptr);
  };
  auto launch = [&](CUfunction f) { return launch_on(s, f); };
  // Captures the sequence of kernels fs (collective: true) into a new graph.
  auto capture = [&](std::initializer_list<bool> fs, CUgraph* g) {
    if (cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) != CUDA_SUCCESS)
      return false;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (cuStreamIsCapturing(s, &st) != CUDA_SUCCESS || st != CU_STREAM_CAPTURE_STATUS_ACTIVE)
      return false;
    for (bool c : fs)
      if (launch(c ? coll : plain) != CUDA_SUCCESS) return false;
    return cuStreamEndCapture(s, g) == CUDA_SUCCESS;
  };
  CUgraph ga = nullptr;
  CUgraphExec a = nullptr, j = nullptr;
  for (;;) {
    uint64_t cmd = 0;
    if (!recv_u64(sock, &cmd)) return 1;
    bool ok = true;
    switch (cmd) {
      case kDirect:
        ok = launch(coll) == CUDA_SUCCESS;
        break;
      case kCapture:
        ok = capture({true, true, false, true}, &ga) &&
             cuGraphInstantiateWithFlags(&a, ga, 0) == CUDA_SUCCESS;
        break;
      case kLaunchA:
        ok = cuGraphLaunch(a, s) == CUDA_SUCCESS;
        break;
      case kPlainGraph: {
        CUgraph g;
        CUgraphExec e;
        ok = capture({false, false}, &g) && cuGraphInstantiateWithFlags(&e, g, 0) == CUDA_SUCCESS &&
             cuGraphLaunch(e, s) == CUDA_SUCCESS && cuGraphExecDestroy(e) == CUDA_SUCCESS &&
             cuGraphDestroy(g) == CUDA_SUCCESS;
        break;
      }
      case kBuilt: {
        CUgraph g;
        CUgraphNode k, child;
        CUDA_KERNEL_NODE_PARAMS_v2 p{};
        p.func = coll;
        p.gridDimX = p.gridDimY = p.gridDimZ = 1;
        p.blockDimX = 32;
        p.blockDimY = p.blockDimZ = 1;
        CUgraphExec e;
        ok = cuGraphCreate(&g, 0) == CUDA_SUCCESS &&
             cuGraphAddKernelNode_v2(&k, g, nullptr, 0, &p) == CUDA_SUCCESS &&
             cuGraphAddChildGraphNode(&child, g, &k, 1, ga) == CUDA_SUCCESS &&
             cuGraphInstantiateWithFlags(&e, g, 0) == CUDA_SUCCESS &&
             cuGraphLaunch(e, s) == CUDA_SUCCESS && cuGraphExecDestroy(e) == CUDA_SUCCESS &&
             cuGraphDestroy(g) == CUDA_SUCCESS;
        break;
      }
      case kUpdateA: {
        // Same topology (four kernel nodes), other functions: 1 collective.
        CUgraph g;
        CUgraphExecUpdateResultInfo info{};
        ok = capture({true, false, false, false}, &g);
        if (ok) {
          const CUresult r = cuGraphExecUpdate_v2(a, g, &info);
          if (r != CUDA_SUCCESS) {
            fprintf(stderr, "child: cuGraphExecUpdate_v2: %d (result %d)\n", (int)r,
                    (int)info.result);
            ok = false;
          }
        }
        ok = ok && cuGraphLaunch(a, s) == CUDA_SUCCESS;
        break;
      }
      case kDestroyA:
        ok = cuGraphExecDestroy(a) == CUDA_SUCCESS && cuGraphLaunch(a, s) != CUDA_SUCCESS;
        break;
      case kJoinFork:
        // As ProcessGroupNCCL inside torch.cuda.graph: the collective's
        // stream waits on an event recorded on the capturing stream.
        ok = cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS &&
             launch_on(s, plain) == CUDA_SUCCESS && cuEventRecord(fork_ev, s) == CUDA_SUCCESS &&
             cuStreamWaitEvent(b, fork_ev, 0) == CUDA_SUCCESS && launch_on(b, coll) == CUDA_SUCCESS;
        break;
      case kJoinEnd: {
        CUgraph g;
        ok = cuEventRecord(join_ev, b) == CUDA_SUCCESS &&
             cuStreamWaitEvent(s, join_ev, 0) == CUDA_SUCCESS &&
             launch_on(s, coll) == CUDA_SUCCESS && cuStreamEndCapture(s, &g) == CUDA_SUCCESS &&
             cuGraphInstantiateWithFlags(&j, g, 0) == CUDA_SUCCESS &&
             cuGraphDestroy(g) == CUDA_SUCCESS;
        break;
      }
      case kLaunchJ:
        ok = cuGraphLaunch(j, s) == CUDA_SUCCESS;
        break;
      case kFinish:
        return cuStreamSynchronize(s) == CUDA_SUCCESS ? 0 : 1;
      default:
        return 1;
    }
    if (ok && cmd != kJoinFork) ok = cuStreamSynchronize(s) == CUDA_SUCCESS;  // not while capturing
    if (!send_u64(sock, ok ? 0 : 1)) return 1;
  }
}

Child g_job;
Shim g_shim;

bool cut(const char* op, uint64_t target, proto::CutState* st) {
  proto::CutRequest r;
  r.op = op;
  r.target = target;
  std::string err;
  if (!g_shim.exchange(proto::kMsgShimCut, r, -1, proto::kMsgShimCutState, st, &err) || !st->ok) {
    fprintf(stderr, "cut %s: %s%s\n", op, err.c_str(), st->error.c_str());
    return false;
  }
  return true;
}

uint64_t launched() {
  proto::CutState st;
  return cut("status", 0, &st) ? st.launched : ~0ull;
}

bool command(uint64_t cmd) {
  uint64_t r = 1;
  if (!send_u64(g_job.sock, cmd) || !recv_u64(g_job.sock, &r) || r != 0) {
    fprintf(stderr, "command %llu failed in the workload\n", (unsigned long long)cmd);
    return false;
  }
  return true;
}

/// Whether the workload answered within ms.
bool answered_within(int ms) {
  pollfd p{g_job.sock, POLLIN, 0};
  return poll(&p, 1, ms) == 1;
}

int run() {
  g_job = spawn(workload);
  REQ(g_job.pid > 0);
  REQ(command(kDirect));  // the shim is up once the driver was called
  REQ(g_shim.connect(g_job.pid));
  REQ(launched() == 1);
  REQ(command(kDirect));
  REQ(launched() == 2);
  REQ(command(kCapture));
  REQ(launched() == 2);  // captured, not run
  REQ(command(kLaunchA));
  REQ(launched() == 5);
  REQ(command(kLaunchA));
  REQ(launched() == 8);
  REQ(command(kPlainGraph));
  REQ(launched() == 8);
  REQ(command(kBuilt));
  REQ(launched() == 12);  // 1 + the child graph's 3

  // The cut: 12 launched; a target of 14 leaves room for 2, not for A's 3.
  proto::CutState st;
  REQ(cut("arm", 0, &st) && st.reserved == 12);
  REQ(cut("target", 14, &st));
  REQ(send_u64(g_job.sock, kLaunchA));
  REQ(!answered_within(300));  // held
  // The launch reaches the hold in its own time (slower under a sanitizer).
  for (int i = 0; i < 500 && cut("status", 0, &st) && st.held == 0; ++i) usleep(10000);
  REQ(cut("status", 0, &st) && st.held == 1 && st.launched == 12);
  REQ(cut("target", 15, &st));
  uint64_t r = 1;
  REQ(answered_within(5000) && recv_u64(g_job.sock, &r) && r == 0);
  REQ(launched() == 15);
  REQ(cut("status", 0, &st) && st.reserved == 15 && st.held == 0);
  // At the target: the next graph launch holds until the cut is released.
  REQ(send_u64(g_job.sock, kLaunchA));
  REQ(!answered_within(300));
  REQ(cut("release", 0, &st));
  REQ(answered_within(5000) && recv_u64(g_job.sock, &r) && r == 0);
  REQ(launched() == 18);

  REQ(command(kUpdateA));
  REQ(launched() == 19);  // the updated instance has one collective
  REQ(command(kDestroyA));
  REQ(launched() == 19);

  REQ(command(kJoinFork));
  REQ(launched() == 19);  // b captures: its collective runs at the instance's launches
  // A drain while the capture is under way is refused: its cuCtxSynchronize
  // would invalidate the capture (kJoinEnd then fails). As the coordinator
  // does: the gate closed first, opened again after the refusal.
  REQ(g_shim.gate_close().ok);
  REQ(refused_with(g_shim.drain(), "stream capture"));
  REQ(g_shim.gate_open().ok);
  REQ(command(kJoinEnd));
  REQ(launched() == 19);
  REQ(command(kLaunchJ));
  REQ(launched() == 21);  // b's collective and s's
  REQ(command(kLaunchJ));
  REQ(launched() == 23);
  REQ(send_u64(g_job.sock, kFinish));
  REQ(g_job.join() == 0);
  return 0;
}

}  // namespace

int main() {
  return coordinator_main("shim.track.cut_graphs", "cutgraphs", run, [] { g_job.kill(); });
}
