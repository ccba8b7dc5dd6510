// How long a collective launch holds at the cut when nobody finishes it
// (docs/shim.md, the "cut" request; src/shim/cut.cpp, hold()), under the
// preloaded shim against the simulated driver: ctest shim.track.cut_hold.
//
// The shim's own limit is set low ($CUSNAP_CUT_HOLD_MS=200, in the
// workload's environment before its first driver call). One workload process,
// forked before any CUDA activity, launches a collective kernel on the
// test's command; the test's own process is the coordinator, arms the cut
// without a target (every collective launch then holds) and never releases
// it, and times how long the launch takes to come back:
//   - "arm" without hold_ms: the shim's own limit applies (back after 200 ms
//     at least, and within 3.5 s: before the longer hold below would end)
//   - "arm" with a hold_ms shorter than the shim's limit (50): the longer of
//     the two, the shim's, applies (200 ms at least)
//   - "arm" with hold_ms 4000, longer than the shim's limit: still held (and
//     the cut still armed) after 1 s, five times the shim's limit; then let
//     go by the shim itself after 4000 ms at least, the cut dropped
//   - "arm" without hold_ms again: the shim's limit applies again (a hold_ms
//     of an earlier arm is not kept)
//   - the workload's stderr a pipe that is full (its reader reads nothing):
//     the shim's line about the dropped cut is not written, and the launch
//     comes back as before (before: the shim waited in that write, holding
//     the cut's lock, and the launch and every "cut" request waited for good)
// Each dropped cut lets the launch through: the count goes up by one.
// The lower bounds hold on any machine (the shim's deadline starts after the
// command was sent; 10 ms for the clock's whole milliseconds); the upper
// bounds are generous, for a loaded machine.
#include <fcntl.h>
#include <poll.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/fakecuda/fakecuda_test_util.h"
#include "tests/shim/ckpt_client.h"

using namespace fctest;
using namespace ckpt_client;

namespace {

// Mangled, as the driver names NCCL's kernels; the simulated driver runs it
// as a plain kernel, so one process can launch it alone.
constexpr const char* kCollective = "_Z24ncclDevKernel_AllReduce_Testv";
constexpr long kShimLimit = 200;      // $CUSNAP_CUT_HOLD_MS
constexpr uint64_t kLongHold = 4000;  // an arm's hold_ms, longer than the shim's limit
// The clock's resolution in these measurements (whole ms, each end cut).
constexpr long kSlackMs = 10;

enum Cmd : uint64_t {
  kLaunch = 1,  // one launch of the collective, then its stream synchronized
  kFinish,
  kFullStderr,  // stderr becomes a pipe filled to the brim, whose reader never reads
};

/// Makes stderr a full pipe, writes to which wait (blocking, its reader
/// open); true when done.
bool full_stderr() {
  static int pipe_fds[2] = {-1, -1};  // the reader stays open, unread
  if (pipe(pipe_fds) != 0 || fcntl(pipe_fds[1], F_SETFL, O_NONBLOCK) != 0) return false;
  static const char page[4096] = {};
  while (write(pipe_fds[1], page, sizeof page) > 0) {
  }
  if (errno != EAGAIN || fcntl(pipe_fds[1], F_SETFL, 0) != 0) return false;
  pollfd p{pipe_fds[1], POLLOUT, 0};
  if (poll(&p, 1, 0) != 0) return false;  // no room
  return dup2(pipe_fds[1], STDERR_FILENO) == STDERR_FILENO && close(pipe_fds[1]) == 0;
}

int workload(int sock) {
  CUcontext ctx;
  FC_REQ(init_primary(&ctx) == CUDA_SUCCESS);
  static const char image[] = "cut_hold: placeholder module image";
  CUmodule mod;
  FC_REQ(cuModuleLoadData(&mod, image) == CUDA_SUCCESS);
  CUfunction coll;
  FC_REQ(cuModuleGetFunction(&coll, mod, kCollective) == CUDA_SUCCESS);
  CUstream s;
  FC_REQ(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  for (;;) {
    uint64_t cmd = 0;
    if (!recv_u64(sock, &cmd)) return 1;
    if (cmd == kFinish) return 0;
    if (cmd == kFullStderr) {
      if (!send_u64(sock, full_stderr() ? 0 : 1)) return 1;
      continue;
    }
    if (cmd != kLaunch) return 1;
    const bool ok =
        cuLaunchKernel(coll, 1, 1, 1, 32, 1, 1, 0, s, nullptr, nullptr) == CUDA_SUCCESS &&
        cuStreamSynchronize(s) == CUDA_SUCCESS;
    if (!send_u64(sock, ok ? 0 : 1)) return 1;
  }
}

Child g_job;
Shim g_shim;

bool cut(const char* op, uint64_t hold_ms, proto::CutState* st) {
  proto::CutRequest r;
  r.op = op;
  r.hold_ms = hold_ms;
  std::string err;
  if (!g_shim.exchange(proto::kMsgShimCut, r, -1, proto::kMsgShimCutState, st, &err) || !st->ok) {
    fprintf(stderr, "cut %s: %s%s\n", op, err.c_str(), st->error.c_str());
    return false;
  }
  return true;
}

long now_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

/// Whether the workload answered within ms.
bool answered_within(long ms) {
  pollfd p{g_job.sock, POLLIN, 0};
  return poll(&p, 1, static_cast<int>(ms)) == 1;
}

/// The count of collective launches made (~0 when the shim does not answer).
uint64_t launched() {
  proto::CutState st;
  return cut("status", 0, &st) ? st.launched : ~0ull;
}

/// Arms the cut with hold_ms (0: none; no target, so the next collective
/// launch holds), starts a launch and, the cut never released, waits until
/// the launch comes back by itself: at most `within` ms. When still_held_at
/// is above 0, the launch must still be held that many ms after it started
/// (the cut armed, one thread holding). *took_ms: from the command to the
/// answer. The launch must succeed, the shim have dropped the cut and the
/// count have gone up by one.
bool hold_alone(uint64_t hold_ms, long still_held_at, long within, long* took_ms) {
  const uint64_t before = launched();
  proto::CutState st;
  REQB(cut("arm", hold_ms, &st) && st.armed && st.held == 0 && st.reserved == before);
  const long t0 = now_ms();
  REQB(send_u64(g_job.sock, kLaunch));
  if (still_held_at > 0) {
    REQB(!answered_within(still_held_at));
    REQB(cut("status", 0, &st));
    fprintf(stderr, "  after %ld ms: armed %d, held %u, launched %llu\n", now_ms() - t0,
            (int)st.armed, st.held, (unsigned long long)st.launched);
    REQB(st.armed && st.held == 1 && st.launched == before);
  }
  const long left = within - (now_ms() - t0);
  uint64_t r = 1;
  REQB(left > 0 && answered_within(left));
  *took_ms = now_ms() - t0;
  REQB(recv_u64(g_job.sock, &r) && r == 0);
  REQB(cut("status", 0, &st));
  REQB(!st.armed && st.held == 0 && st.launched == before + 1);
  fprintf(stderr, "arm hold_ms %llu (shim limit %ld ms): the launch came back after %ld ms\n",
          (unsigned long long)hold_ms, kShimLimit, *took_ms);
  return true;
}

int run() {
  g_job = spawn(workload);
  REQ(g_job.pid > 0);
  uint64_t r = 1;
  REQ(send_u64(g_job.sock, kLaunch) && recv_u64(g_job.sock, &r) && r == 0);  // the shim is up
  REQ(g_shim.connect(g_job.pid));
  REQ(launched() == 1);

  long took = 0;
  // No hold_ms: the shim's limit; back well before kLongHold.
  REQ(hold_alone(0, 0, kLongHold - 500, &took));
  REQ(took >= kShimLimit - kSlackMs);
  // hold_ms shorter than the shim's limit: the shim's.
  REQ(hold_alone(50, 0, kLongHold - 500, &took));
  REQ(took >= kShimLimit - kSlackMs);
  // hold_ms longer than the shim's limit: that long. Held after 1 s, let go
  // by the shim after kLongHold.
  REQ(hold_alone(kLongHold, 1000, kLongHold + 15000, &took));
  REQ(took >= static_cast<long>(kLongHold) - kSlackMs);
  // An arm without hold_ms again: the shim's limit, not the last arm's.
  REQ(hold_alone(0, 0, kLongHold - 500, &took));
  REQ(took >= kShimLimit - kSlackMs);

  // stderr full: the shim drops its line rather than wait with the cut's lock.
  REQ(send_u64(g_job.sock, kFullStderr) && recv_u64(g_job.sock, &r) && r == 0);
  REQ(hold_alone(0, 0, kLongHold - 500, &took));
  REQ(took >= kShimLimit - kSlackMs);

  REQ(launched() == 6);
  REQ(send_u64(g_job.sock, kFinish));
  REQ(g_job.join() == 0);
  return 0;
}

}  // namespace

int main() {
  // The workload's shim reads its limit at its first hold.
  setenv("CUSNAP_CUT_HOLD_MS", std::to_string(kShimLimit).c_str(), 1);
  return coordinator_main("shim.track.cut_hold", "cuthold", run, [] { g_job.kill(); });
}
