// The cut's counts per GPU (docs/design.md "Cut across collective ranks";
// src/shim/cut.cpp), under the preloaded shim against the simulated driver
// with three devices: ctest shim.track.cut_devices.
//
// A process that drives a collective on several GPUs (single-process
// multi-GPU NCCL, torch.nn.DataParallel) launches one kernel on each GPU per
// step; the kernel on GPU 0 completes only once the one on GPU 1 is launched.
// Counted per process, a cut that lands between the two launches of a step
// holds the second, and GPU 0's kernel never drains. Counted per GPU, the
// process stands at the target only once every GPU it launches on does.
//
// One workload process, forked before any CUDA activity, has a context on each
// device and launches a collective kernel on the device the test's command
// names (the simulated driver runs it as a plain kernel). The test's own
// process is the coordinator:
//   - two launches on GPU 0, one on GPU 1: "status" answers reserved 2 (the
//     most on one GPU) and launched 1 (the fewest on a GPU in use)
//   - armed, target 2: the launch on GPU 1 goes through (GPU 1 reaches the
//     target), the next on GPU 0 holds; launched 2
//   - a target below 2 is refused
//   - released, then armed with no target: a first launch on GPU 2 holds, and
//     counts as a GPU in use (launched 0 while it holds); with target 3 it goes
//     through, GPU 1 catches up, GPU 0 holds at 4 (launched 1: GPU 2's count)
//   - released: the held launch goes on, and launches on every GPU pass
//   - GPU 2 idle while GPUs 0 and 1 let 80000 launches through: left out of
//     the count (launched is theirs); one launch there puts it back
// GPU 1's and GPU 2's kernels are NCCL's symmetric-memory kernels
// (ncclSymDevKernel_* of NCCL 2.27, ncclSymkDevKernel_* of 2.28 on): their
// launches hold and count as the others do.
#include <poll.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/fakecuda/fakecuda_test_util.h"
#include "tests/shim/ckpt_client.h"

using namespace fctest;
using namespace ckpt_client;

namespace {

constexpr const char* kCollective = "_Z28ncclDevKernel_AllReduce_Testv";
/// GPU 1's and GPU 2's collectives: NCCL's symmetric-memory kernels, as NCCL
/// 2.27 and 2.28 on name them, which the default prefixes count too (their
/// counts and holds below show it).
constexpr const char* kSymmetric27 = "_Z38ncclSymDevKernel_AllReduce_AGxLL_R_sumv";
constexpr const char* kSymmetric = "_Z39ncclSymkDevKernel_AllReduce_AGxLL_R_sumv";
constexpr int kDevices = 3;

enum Cmd : uint64_t {
  kLaunch0 = 1,  // kLaunch0 + d: one launch on device d, then its stream synchronized
  kMany = 50,    // then d and n: n launches on device d, then its stream synchronized
  kFinish = 100,
};

int workload(int sock) {
  FC_REQ(cuInit(0) == CUDA_SUCCESS);
  int count = 0;
  FC_REQ(cuDeviceGetCount(&count) == CUDA_SUCCESS && count == kDevices);
  CUcontext ctx[kDevices];
  CUfunction fn[kDevices];
  CUstream st[kDevices];
  static const char image[] = "cut_devices: placeholder module image";
  for (int d = 0; d < kDevices; ++d) {
    FC_REQ(cuDevicePrimaryCtxRetain(&ctx[d], d) == CUDA_SUCCESS);
    FC_REQ(cuCtxSetCurrent(ctx[d]) == CUDA_SUCCESS);
    CUmodule mod;
    FC_REQ(cuModuleLoadData(&mod, image) == CUDA_SUCCESS);
    const char* name = d == 2 ? kSymmetric : d == 1 ? kSymmetric27 : kCollective;
    FC_REQ(cuModuleGetFunction(&fn[d], mod, name) == CUDA_SUCCESS);
    FC_REQ(cuStreamCreate(&st[d], CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  }
  for (;;) {
    uint64_t cmd = 0;
    if (!recv_u64(sock, &cmd)) return 1;
    if (cmd == kFinish) return 0;
    uint64_t dev = cmd - kLaunch0, n = 1;
    if (cmd == kMany && (!recv_u64(sock, &dev) || !recv_u64(sock, &n))) return 1;
    if (dev >= kDevices) return 1;
    const int d = static_cast<int>(dev);
    bool ok = cuCtxSetCurrent(ctx[d]) == CUDA_SUCCESS;
    for (uint64_t k = 0; ok && k < n; ++k)
      ok = cuLaunchKernel(fn[d], 1, 1, 1, 32, 1, 1, 0, st[d], nullptr, nullptr) == CUDA_SUCCESS;
    ok = ok && cuStreamSynchronize(st[d]) == CUDA_SUCCESS;
    if (!send_u64(sock, ok ? 0 : 1)) return 1;
  }
}

Child g_job;
Shim g_shim;

/// One cut request; false (said on stderr) when refused or not answered,
/// unless refused is expected, then whether it was refused.
bool cut(const char* op, uint64_t target, proto::CutState* st, bool refused = false) {
  proto::CutRequest r;
  r.op = op;
  r.target = target;
  std::string err;
  if (!g_shim.exchange(proto::kMsgShimCut, r, -1, proto::kMsgShimCutState, st, &err)) {
    fprintf(stderr, "cut %s: %s\n", op, err.c_str());
    return false;
  }
  if (st->ok == !refused) return true;
  fprintf(stderr, "cut %s: %s\n", op, st->ok ? "accepted" : st->error.c_str());
  return false;
}

bool answered_within(long ms) {
  pollfd p{g_job.sock, POLLIN, 0};
  return poll(&p, 1, static_cast<int>(ms)) == 1;
}

/// A launch on device d that must come back at once, successfully.
bool launch(int d) {
  uint64_t r = 1;
  return send_u64(g_job.sock, kLaunch0 + d) && answered_within(5000) && recv_u64(g_job.sock, &r) &&
         r == 0;
}

/// A launch on device d that must hold: the shim counts one more thread
/// holding (within 5 s), and no answer comes.
bool launch_held(int d) {
  proto::CutState st;
  if (!cut("status", 0, &st)) return false;
  const uint32_t before = st.held;
  if (!send_u64(g_job.sock, kLaunch0 + d)) return false;
  for (int i = 0; i < 500 && st.held == before; ++i) {
    if (answered_within(10) || !cut("status", 0, &st)) return false;
  }
  return st.held == before + 1 && !answered_within(100);
}

/// The answer of a held launch, once let go.
bool held_back() {
  uint64_t r = 1;
  return answered_within(5000) && recv_u64(g_job.sock, &r) && r == 0;
}

void show(const char* when, const proto::CutState& st) {
  fprintf(stderr, "%s: armed %d target %llu reserved %llu launched %llu held %u\n", when,
          int(st.armed), (unsigned long long)st.target, (unsigned long long)st.reserved,
          (unsigned long long)st.launched, st.held);
}

int run() {
  g_job = spawn(workload);
  REQ(g_job.pid > 0);
  REQ(launch(0));  // the shim is up
  REQ(g_shim.connect(g_job.pid));
  REQ(launch(0) && launch(1));
  proto::CutState st;
  REQ(cut("status", 0, &st));
  show("GPU 0 twice, GPU 1 once", st);
  REQ(st.reserved == 2 && st.launched == 1 && st.devices.size() == 2);

  // Armed with target 2: GPU 1 catches up, GPU 0 holds.
  REQ(cut("arm", 0, &st) && st.armed && st.reserved == 2);
  REQ(cut("target", 2, &st));
  REQ(launch(1));
  REQ(cut("status", 0, &st));
  show("target 2, GPU 1 launched", st);
  REQ(st.reserved == 2 && st.launched == 2 && st.held == 0);
  REQ(launch_held(0));
  REQ(cut("status", 0, &st));
  show("GPU 0 held", st);
  REQ(st.held == 1 && st.launched == 2 && st.reserved == 2);
  REQ(cut("target", 1, &st, true));
  REQ(st.error.find("below the 2") != std::string::npos);

  REQ(cut("release", 0, &st) && !st.armed);
  REQ(held_back());  // GPU 0 at 3, GPU 1 at 2

  // Armed with no target, a first launch on GPU 2 holds: that GPU is in use,
  // so the process stands at 0 until it has launched there.
  REQ(cut("arm", 0, &st));
  REQ(launch_held(2));
  REQ(cut("status", 0, &st));
  show("armed, GPU 2 held at its first", st);
  REQ(st.held == 1 && st.reserved == 3 && st.launched == 0);
  REQ(cut("target", 3, &st));
  REQ(held_back());
  REQ(launch(1));       // GPU 1: 3
  REQ(launch_held(0));  // GPU 0 would reach 4
  REQ(cut("status", 0, &st));
  show("target 3, GPU 2 and GPU 1 launched, GPU 0 held", st);
  REQ(st.held == 1 && st.reserved == 3 && st.launched == 1 && st.devices.size() == 3);

  // Released: the held launch goes on, and launches on every GPU pass.
  REQ(cut("release", 0, &st) && !st.armed);
  REQ(held_back());
  REQ(launch(1) && launch(2));
  REQ(cut("status", 0, &st));
  show("released", st);
  REQ(st.reserved == 4 && st.launched == 2 && st.held == 0);

  // GPU 2 left behind: once GPUs 0 and 1 let more than 65536 launches
  // through since its last, it is no longer in use (a process that stopped
  // launching collectives there), and the process stands at GPU 0 and 1's
  // count; a launch there puts it back in use.
  auto many = [](uint64_t d, uint64_t n) {
    uint64_t r = 1;
    return send_u64(g_job.sock, kMany) && send_u64(g_job.sock, d) && send_u64(g_job.sock, n) &&
           answered_within(60000) && recv_u64(g_job.sock, &r) && r == 0;
  };
  REQ(many(0, 40000) && many(1, 40000));
  REQ(cut("status", 0, &st));
  show("GPU 0 and GPU 1 40000 more each", st);
  REQ(st.reserved == 40004 && st.launched == 40004);
  REQ(launch(2));
  REQ(cut("status", 0, &st));
  show("GPU 2 once more", st);
  REQ(st.reserved == 40004 && st.launched == 3);
  REQ(send_u64(g_job.sock, kFinish));
  REQ(g_job.join() == 0);
  return 0;
}

}  // namespace

int main() {
  setenv("FAKECUDA_DEVICES", std::to_string(kDevices).c_str(), 1);
  return coordinator_main("shim.track.cut_devices", "cutdevs", run, [] { g_job.kill(); });
}
