// The wait of a gate-close request, under the preloaded shim against the
// simulated driver: ctest shim.track.gate_cap.
//
// The shim takes a gate-close's timeout_ms for at most the longest timeout a
// checkpoint may carry (proto::kMaxTimeoutMs, a week: the coordinator asks for
// its phase, that timeout). What a test can see without waiting a week: a
// value above the cap is answered as the cap is. A workload thread sits 1.5 s
// inside cuCtxSynchronize (FAKECUDA_DELAY) while the test closes the gate:
//   - with timeout_ms = kMaxTimeoutMs: the close waits for the call, then
//     succeeds (code 0): the call has returned when the close answers
//   - with timeout_ms = 2^64-1: the same (before the cap the deadline, now
//     plus the value, wrapped around: the close timed out at once, ETIMEDOUT;
//     a value just short of wrapping kept the control listener, and every
//     client behind it, in the close for that long)
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>

#include "shim/cusnap_shim.h"
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
  kBusy,      // a thread sits kBusyMs inside cuCtxSynchronize; replies once it is in
  kReturned,  // replies 1 when that call has returned
  kJoin,      // joins it; replies 1 when its call succeeded
};

CUcontext g_ctx = nullptr;
CUresult g_busy_result = CUDA_ERROR_UNKNOWN;
std::atomic<int> g_busy_phase{0};  // 1: about to synchronize; 2: returned

void* busy_thread(void*) {
  g_busy_result = cuCtxSetCurrent(g_ctx);
  g_busy_phase = 1;
  if (g_busy_result == CUDA_SUCCESS) g_busy_result = cuCtxSynchronize();
  g_busy_phase = 2;
  return nullptr;
}

pthread_t g_busy{};

/// Whether the shim counts a driver call in flight now.
bool call_in_flight() {
  uint64_t in_flight = 0;
  if (const cusnap_shim_control* c = cmds::shim_control())
    c->gate_state(nullptr, &in_flight, nullptr);
  return in_flight == 1;
}

int act(uint64_t cmd, uint64_t* value) {
  switch (cmd) {
    case kInit:
      FC_REQ(init_primary(&g_ctx) == CUDA_SUCCESS);
      return 0;
    case kBusy:
      g_busy_phase = 0;
      FC_REQ(pthread_create(&g_busy, nullptr, busy_thread, nullptr) == 0);
      // In cuCtxSynchronize (its 1.5 s) by the time the test closes the gate.
      for (int i = 0; i < 500 && !(g_busy_phase == 1 && call_in_flight()); ++i) usleep(10000);
      FC_REQ(g_busy_phase == 1 && call_in_flight());
      return 0;
    case kReturned:
      // The thread marks the return after the shim's leave() let the close
      // answer: a moment later (not the ~1.3 s the call had left).
      for (int i = 0; i < 50 && g_busy_phase != 2; ++i) usleep(4000);
      *value = g_busy_phase == 2 ? 1 : 0;
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
  Shim c;
  REQ(c.connect(g_workload.pid));
  REQ(command(g_workload, kBusy));  // the call is in the driver
  const auto t0 = Clock::now();
  const proto::Done d = c.call(proto::kMsgGateClose, proto::GateRequest{timeout_ms});
  const long took = cmds::ms_since(t0);
  // Asked before the gate opens: a close that answered before the call
  // returned did not wait for it.
  uint64_t returned = 0;
  const bool asked = command(g_workload, kReturned, &returned);
  fprintf(stderr,
          "gate-close with timeout_ms %llu: ok %d, code %d, after %ld ms; the call had %s\n",
          (unsigned long long)timeout_ms, (int)d.ok, d.code, took,
          returned == 1 ? "returned" : "not returned");
  const bool open = d.code == 0 && c.gate_open().ok;
  uint64_t done = 0;
  REQ(command(g_workload, kJoin, &done) && done == 1);
  REQ(d.ok && d.code == 0 && open);
  REQ(asked && returned == 1);
  REQ(took < kBusyMs + 3000);
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
