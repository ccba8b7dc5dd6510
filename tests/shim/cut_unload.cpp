// The cut's verdicts on kernel handles after an unload (src/shim/cut.cpp,
// is_collective and kernels_unloaded), under the preloaded shim against the
// simulated driver: ctest shim.track.cut_unload.
//
// The shim asks the driver a kernel's name once per handle and keeps the
// verdict (collective or not). A handle is the driver's object for the
// kernel, which an unload frees: a kernel loaded after it may get the same
// address (the simulated driver's handles are heap objects, and the freed
// one is handed out again). One workload process, forked before any CUDA
// activity, loads a kernel on the test's command (its module unloaded
// first) and launches it; the test's own process is the coordinator:
//   - a collective launched (its verdict kept), its module unloaded, a plain
//     kernel loaded at the same address: with the cut armed without a
//     target, the plain kernel's launch comes back at once (before: it held
//     for $CUSNAP_CUT_HOLD_MS, taken for the collective) and is not counted
//   - the plain kernel's module unloaded, a collective loaded at that
//     address again: with the cut armed, its launch holds (before: it went
//     through, taken for the plain kernel) until the cut is released, and is
//     counted
// cuLibraryUnload and a context's destruction forget the verdicts too; the
// simulated driver has no libraries and frees no kernels with a context, so
// those are not tested.
#include <poll.h>
#include <unistd.h>

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
constexpr const char* kPlain = "_Z12vector_scalev";
// The shim's limit ($CUSNAP_CUT_HOLD_MS): far longer than a launch that
// does not hold takes, and than the test waits for one.
constexpr long kShimLimit = 30000;

enum Cmd : uint64_t {
  kLoadCollective = 1,  // the module unloaded, a module loaded, the collective got
  kLoadPlain,           // the same with the plain kernel
  kLaunch,              // one launch of the kernel got last, then its stream synchronized
  kFinish,
};

int workload(int sock) {
  CUcontext ctx;
  FC_REQ(init_primary(&ctx) == CUDA_SUCCESS);
  CUstream s;
  FC_REQ(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  static const char image[] = "cut_unload: placeholder module image";
  CUmodule mod = nullptr;
  CUfunction f = nullptr;
  for (;;) {
    uint64_t cmd = 0;
    if (!recv_u64(sock, &cmd)) return 1;
    if (cmd == kFinish) return 0;
    if (cmd == kLoadCollective || cmd == kLoadPlain) {
      bool ok = !mod || cuModuleUnload(mod) == CUDA_SUCCESS;
      ok = ok && cuModuleLoadData(&mod, image) == CUDA_SUCCESS &&
           cuModuleGetFunction(&f, mod, cmd == kLoadCollective ? kCollective : kPlain) ==
               CUDA_SUCCESS;
      if (!send_u64(sock, ok ? reinterpret_cast<uintptr_t>(f) : 0)) return 1;
      continue;
    }
    if (cmd != kLaunch) return 1;
    const bool ok = cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, nullptr, nullptr) == CUDA_SUCCESS &&
                    cuStreamSynchronize(s) == CUDA_SUCCESS;
    if (!send_u64(sock, ok ? 0 : 1)) return 1;
  }
}

Child g_job;
Shim g_shim;

bool cut(const char* op, proto::CutState* st) {
  proto::CutRequest r;
  r.op = op;
  std::string err;
  if (!g_shim.exchange(proto::kMsgShimCut, r, -1, proto::kMsgShimCutState, st, &err) || !st->ok) {
    fprintf(stderr, "cut %s: %s%s\n", op, err.c_str(), st->error.c_str());
    return false;
  }
  return true;
}

/// Whether the workload answered within ms.
bool answered_within(long ms) {
  pollfd p{g_job.sock, POLLIN, 0};
  return poll(&p, 1, static_cast<int>(ms)) == 1;
}

/// The workload's kernel after the command (its address; 0 on failure).
uint64_t load(Cmd cmd) {
  uint64_t f = 0;
  return send_u64(g_job.sock, cmd) && recv_u64(g_job.sock, &f) ? f : 0;
}

int run() {
  g_job = spawn(workload);
  REQ(g_job.pid > 0);
  const uint64_t collective = load(kLoadCollective);
  REQ(collective != 0);
  uint64_t r = 1;
  REQ(send_u64(g_job.sock, kLaunch) && recv_u64(g_job.sock, &r) && r == 0);  // the shim is up
  REQ(g_shim.connect(g_job.pid));
  proto::CutState st;
  REQ(cut("status", &st) && st.launched == 1);

  // A plain kernel at the collective's address: it does not hold.
  const uint64_t plain = load(kLoadPlain);
  fprintf(stderr, "collective at %#llx, then the plain kernel at %#llx\n",
          (unsigned long long)collective, (unsigned long long)plain);
  REQ(plain == collective);  // else this test shows nothing
  REQ(cut("arm", &st) && st.armed);
  REQ(send_u64(g_job.sock, kLaunch));
  REQ(answered_within(5000));
  REQ(recv_u64(g_job.sock, &r) && r == 0);
  REQ(cut("status", &st) && st.armed && st.held == 0 && st.launched == 1 && st.reserved == 1);
  REQ(cut("release", &st) && !st.armed);

  // A collective at the plain kernel's address: it holds until the release.
  REQ(load(kLoadCollective) == plain);
  REQ(cut("arm", &st) && st.armed);
  REQ(send_u64(g_job.sock, kLaunch));
  REQ(!answered_within(500));
  REQ(cut("status", &st) && st.armed && st.held == 1 && st.launched == 1);
  REQ(cut("release", &st) && !st.armed);
  REQ(answered_within(5000));
  REQ(recv_u64(g_job.sock, &r) && r == 0);
  REQ(cut("status", &st) && st.held == 0 && st.launched == 2);

  REQ(send_u64(g_job.sock, kFinish));
  REQ(g_job.join() == 0);
  return 0;
}

}  // namespace

int main() {
  // The workload's shim reads its limit at its first hold.
  setenv("CUSNAP_CUT_HOLD_MS", std::to_string(kShimLimit).c_str(), 1);
  return coordinator_main("shim.track.cut_unload", "cutunload", run, [] { g_job.kill(); });
}
