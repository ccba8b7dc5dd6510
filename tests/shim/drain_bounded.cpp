// The drain of a quiesce, bounded, under the preloaded shim against the
// simulated driver: ctest shim.track.drain_bounded.
//
// A handshake kernel (the simulated driver's collective: it waits until its
// peer flag reaches its step) runs in the workload; the test closes the
// gate; a workload thread then sets the peer flag through the driver
// (cuMemcpyHtoD) and is held at the gate. The drain's synchronize waits for
// the kernel, which waits for that thread, which waits for the gate:
//   - a drain with timeout_ms 500 is answered ETIMEDOUT within 3 s, naming
//     the device work, and a gate-open on the same connection is answered at
//     once; the held call then goes through, the kernel ends (before: the
//     drain ran on the control listener, which stayed in the synchronize for
//     good, so no gate-open was served and the workload stood still)
//   - a drain while the kernel waits again and the gate-open comes from
//     another connection: the same
//   - a drain that names no time (an older client's empty request: "until
//     it has finished") is bounded by the gate's hold ($CUSNAP_CUT_HOLD_MS,
//     1.5 s here): answered ETIMEDOUT after it, then the same (before: the
//     drain was waited for without end on the control listener, which then
//     served nothing, the gate-open included, and the workload stood still)
//   - a drain given up synchronizes nothing more once its synchronize
//     returns: a capture begun in a second context after the gate opened
//     ends whole (before: the drain's thread went on to that context and
//     invalidated it)
//   - with the kernel ended, a gate-close and a drain succeed at once, and
//     the gate opens.
#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/fakecuda/fakecuda_test_util.h"
#include "tests/fakecuda/kernels_test_util.h"
#include "tests/shim/ckpt_client.h"
#include "tests/shim/workload_cmds.h"

using namespace fctest;
using namespace ckpt_client;
using cmds::command;
using Clock = std::chrono::steady_clock;

namespace {

enum Cmd : uint64_t {
  kInit = 1,    // context, the handshake kernel, its flags
  kLaunch,      // launches the kernel at the next step: it waits for the peer flag
  kSetPeer,     // a thread sets the peer flag to the step through the driver
  kJoin,        // joins that thread; replies 1 when its call succeeded
  kSync,        // cuCtxSynchronize; replies 1 when it succeeded
  kCapture,     // begins a GLOBAL capture on a stream of a second context
  kEndCapture,  // ends it; replies 1 when it ended whole (not invalidated)
};

HandshakeSetup g_hs;
CUstream g_stream = nullptr;
CUcontext g_ctx2 = nullptr;  // created: the drain synchronizes it after the primary one
CUstream g_stream2 = nullptr;
uint64_t g_step = 0;
CUresult g_set_result = CUDA_ERROR_UNKNOWN;
pthread_t g_setter{};

void* set_peer(void*) {
  g_set_result = cuCtxSetCurrent(g_hs.ctx);
  const uint64_t v = g_step;
  if (g_set_result == CUDA_SUCCESS) g_set_result = cuMemcpyHtoD(g_hs.b.ptr + 8, &v, sizeof v);
  return nullptr;
}

int act(uint64_t cmd, uint64_t* value) {
  switch (cmd) {
    case kInit:
      FC_REQ(g_hs.init("ncclDevKernel_Handshake_Drain") == 0);
      FC_REQ(cuStreamCreate(&g_stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
      FC_REQ(cuCtxCreate(&g_ctx2, nullptr, 0, 0) == CUDA_SUCCESS);
      FC_REQ(cuStreamCreate(&g_stream2, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
      FC_REQ(cuCtxSetCurrent(g_hs.ctx) == CUDA_SUCCESS);
      return 0;
    case kLaunch: {
      ++g_step;
      CUdeviceptr mine = g_hs.b.ptr, peer = g_hs.b.ptr + 8;
      uint64_t step = g_step;
      void* params[] = {&mine, &peer, &step};
      FC_REQ(cuLaunchKernel(g_hs.f, 1, 1, 1, 32, 1, 1, 0, g_stream, params, nullptr) ==
             CUDA_SUCCESS);
      return 0;
    }
    case kSetPeer:
      FC_REQ(pthread_create(&g_setter, nullptr, set_peer, nullptr) == 0);
      return 0;
    case kJoin:
      pthread_join(g_setter, nullptr);
      *value = g_set_result == CUDA_SUCCESS ? 1 : 0;
      return 0;
    case kSync:
      *value = cuCtxSynchronize() == CUDA_SUCCESS ? 1 : 0;
      return 0;
    case kCapture:
      FC_REQ(cuCtxSetCurrent(g_ctx2) == CUDA_SUCCESS);
      FC_REQ(cuStreamBeginCapture_v2(g_stream2, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
      return 0;
    case kEndCapture: {
      CUgraph g = nullptr;
      const CUresult r = cuStreamEndCapture(g_stream2, &g);
      *value = r == CUDA_SUCCESS && g ? 1 : 0;
      if (g) cuGraphDestroy(g);
      FC_REQ(cuCtxSetCurrent(g_hs.ctx) == CUDA_SUCCESS);
      return 0;
    }
    default:
      return 1;
  }
}

int workload(int sock) {
  return cmds::serve(sock, act);
}

Child g_workload;
constexpr long kHoldMs = 1500;  // $CUSNAP_CUT_HOLD_MS of the workload

/// Closes the gate, holds a thread at it whose call the running kernel waits
/// for, and drains with timeout_ms (0: a request that names none, bounded by
/// the hold): answered ETIMEDOUT in time; the gate then opens through
/// `opener` (the same connection, or another one).
int drain_held(bool same_connection, long timeout_ms = 500) {
  REQ(command(g_workload, kLaunch));
  Shim c;
  REQ(c.connect(g_workload.pid));
  REQ(c.gate_close().ok);
  REQ(command(g_workload, kSetPeer));
  usleep(200000);  // the setter waits at the gate
  auto t0 = Clock::now();
  const proto::Done d = timeout_ms ? c.drain(uint64_t(timeout_ms)) : c.drain();
  const long took = cmds::ms_since(t0);
  fprintf(stderr,
          "drain (timeout_ms %ld) with a kernel waiting on a held thread: ok %d, code %d, after "
          "%ld ms: %s\n",
          timeout_ms, (int)d.ok, d.code, took, d.error.c_str());
  const long bound = timeout_ms ? timeout_ms : kHoldMs;
  REQ(!d.ok && d.code == ETIMEDOUT);
  REQ(d.error.find("the device work did not finish within " + std::to_string(bound) + " ms") !=
      std::string::npos);
  REQ(took >= bound - 100 && took < bound + 2500);
  t0 = Clock::now();
  if (same_connection) {
    REQ(c.gate_open().ok);
  } else {
    Shim other;
    REQ(other.connect(g_workload.pid));
    REQ(other.gate_open().ok);
  }
  REQ(cmds::ms_since(t0) < 1000);
  uint64_t done = 0;
  REQ(command(g_workload, kJoin, &done) && done == 1);  // the held call went through
  REQ(command(g_workload, kSync, &done) && done == 1);  // and the kernel ended
  return 0;
}

int run() {
  g_workload = spawn(workload);
  REQ(g_workload.pid > 0);
  REQ(command(g_workload, kInit));
  REQ(drain_held(true) == 0);
  REQ(drain_held(false) == 0);
  REQ(drain_held(true, 0) == 0);
  // The drain given up synchronizes nothing more once its synchronize
  // returns: a capture the application begins in the second context after
  // the gate opened ends whole (before: the drain went on to synchronize
  // that context, invalidating the capture).
  REQ(command(g_workload, kLaunch));
  {
    Shim c;
    REQ(c.connect(g_workload.pid));
    REQ(c.gate_close().ok);
    const proto::Done d = c.drain(500);  // the kernel waits for a flag not set yet
    REQ(!d.ok && d.code == ETIMEDOUT);
    REQ(c.gate_open().ok);
  }
  REQ(command(g_workload, kCapture));
  REQ(command(g_workload, kSetPeer));  // the kernel ends, the drain's synchronize returns
  uint64_t whole = 0;
  REQ(command(g_workload, kJoin, &whole) && whole == 1);
  usleep(300000);  // the kernel has ended, and the drain's synchronize with it
  REQ(command(g_workload, kEndCapture, &whole));
  fprintf(stderr, "a capture begun after the drain was given up ended %s\n",
          whole ? "whole" : "invalidated");
  REQ(whole == 1);
  REQ(command(g_workload, kSync, &whole) && whole == 1);
  // Nothing left running: a drain succeeds at once.
  Shim c;
  REQ(c.connect(g_workload.pid));
  REQ(c.gate_close().ok);
  const auto t0 = Clock::now();
  REQ(c.drain(5000).ok);
  REQ(cmds::ms_since(t0) < 1000);
  REQ(c.gate_open().ok);
  REQ(cmds::finish(g_workload));
  return 0;
}

}  // namespace

int main() {
  setenv("CUSNAP_CUT_HOLD_MS", std::to_string(kHoldMs).c_str(), 1);  // the workload's
  return coordinator_main("shim.track.drain_bounded", "drainb", run, [] { g_workload.kill(); });
}
