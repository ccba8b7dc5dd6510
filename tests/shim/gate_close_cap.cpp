// The wait of a gate-close request, under the preloaded shim against the
// simulated driver: ctest shim.track.gate_cap.
//
// The shim takes a gate-close's timeout_ms for at most the longest timeout a
// checkpoint may carry (proto::kMaxTimeoutMs, a week: the coordinator asks for
// its phase, that timeout). What a test can see without waiting a week: a
// value above the cap is answered as the cap is. A workload thread sits 1.5 s
// inside cuCtxSynchronize (FAKECUDA_DELAY) while the test closes the gate:
//   - with timeout_ms = kMaxTimeoutMs: the close waits for the call, then
//     succeeds (code 0), after about the rest of the 1.5 s
//   - with timeout_ms = 2^64-1: the same (before the cap the deadline, now
//     plus the value, wrapped around: the close timed out at once, ETIMEDOUT;
//     a value just short of wrapping kept the control listener, and every
//     client behind it, in the close for that long)
#include <pthread.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>

#include "tests/fakecuda/fakecuda_test_util.h"
#include "tests/shim/ckpt_client.h"
#include "tests/shim/workload_cmds.h"

using namespace fctest;
using namespace ckpt_client;
using cmds::command;
using Clock = std::chrono::steady_clock;

namespace {

constexpr long kBusyMs = 1500;  // the workload's cuCtxSynchronize

enum Cmd : uint64_t {
  kInit = 1,  // context
  kBusy,      // a thread sits kBusyMs inside cuCtxSynchronize
  kJoin,      // joins it; replies 1 when its call succeeded
};

CUcontext g_ctx = nullptr;
CUresult g_busy_result = CUDA_ERROR_UNKNOWN;

void* busy_thread(void*) {
  g_busy_result = cuCtxSetCurrent(g_ctx);
  if (g_busy_result == CUDA_SUCCESS) g_busy_result = cuCtxSynchronize();
  return nullptr;
}

pthread_t g_busy{};

int act(uint64_t cmd, uint64_t* value) {
  switch (cmd) {
    case kInit:
      FC_REQ(init_primary(&g_ctx) == CUDA_SUCCESS);
      return 0;
    case kBusy:
      FC_REQ(pthread_create(&g_busy, nullptr, busy_thread, nullptr) == 0);
      return 0;
    case kJoin:
      pthread_join(g_busy, nullptr);
      *value = g_busy_result == CUDA_SUCCESS ? 1 : 0;
      return 0;
    default:
      return 1;
  }
}

int workload(int sock) {
  setenv("FAKECUDA_DELAY", ("cuCtxSynchronize:" + std::to_string(kBusyMs)).c_str(), 1);
  return cmds::serve(sock, act);
}

Child g_workload;

/// Closes the gate with timeout_ms while a call sits in the driver: closed
/// once the call returned, not at once, and opened again.
int close_while_busy(uint64_t timeout_ms) {
  REQ(command(g_workload, kBusy));
  usleep(200000);  // the call is in the driver
  Shim c;
  REQ(c.connect(g_workload.pid));
  const auto t0 = Clock::now();
  const proto::Done d = c.call(proto::kMsgGateClose, proto::GateRequest{timeout_ms});
  const long took = cmds::ms_since(t0);
  fprintf(stderr, "gate-close with timeout_ms %llu: ok %d, code %d, after %ld ms\n",
          (unsigned long long)timeout_ms, (int)d.ok, d.code, took);
  const bool open = d.code == 0 && c.gate_open().ok;
  uint64_t done = 0;
  REQ(command(g_workload, kJoin, &done) && done == 1);
  REQ(d.ok && d.code == 0 && open);
  REQ(took >= kBusyMs - 200 - 300 && took < kBusyMs + 3000);
  return 0;
}

int run() {
  g_workload = spawn(workload);
  REQ(g_workload.pid > 0);
  REQ(command(g_workload, kInit));
  REQ(close_while_busy(static_cast<uint64_t>(proto::kMaxTimeoutMs)) == 0);
  REQ(close_while_busy(UINT64_MAX) == 0);
  REQ(cmds::finish(g_workload));
  return 0;
}

}  // namespace

int main() {
  return coordinator_main("shim.track.gate_cap", "gatecap", run, [] { g_workload.kill(); });
}
