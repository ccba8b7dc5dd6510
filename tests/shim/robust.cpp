// The shim never crashes or stalls the workload it lives in, under the
// preloaded shim against the simulated driver: ctest shim.track.robust.
//
// One workload process, forked before any CUDA activity, acts on the test's
// commands; the test's own process is the coordinator, speaking to the
// workload's shim on its control socket.
//   - pthread_cancel of a thread waiting at the closed gate: the thread keeps
//     waiting (the wait is no cancellation point), is cancelled at its next
//     cancellation point once the gate opened, and the process goes on (the
//     gate closes, drains and opens again; driver calls work)
//   - pthread_cancel of a collective launch held at the cut: the same, once
//     the cut is released (without the fix the C++ runtime terminated the
//     process: the cancellation unwound out of a noexcept function)
//   - a thread with a deferred cancellation pending when it makes the
//     sharing calls (export as a ticket, import of it, release, unmap and
//     release of the last handle: hooks that pwrite, pread and close inside a
//     catch (...) or a noexcept function): every call succeeds, the thread is
//     cancelled at its own next cancellation point after them, and the
//     process goes on (without the fix the C library aborted the process:
//     "FATAL: exception not rethrown")
//   - the workload out of descriptors (EMFILE) with a connection pending on
//     the shim's control socket: the listener does not spin (the workload's
//     CPU time stays low over 1 s) and serves the connection once
//     descriptors are free again
//   - a control listener whose poll fails (the workload's RLIMIT_NOFILE
//     lowered below the descriptors it polls: EINVAL) ends and takes its
//     socket down: the path is gone, and a client's connect fails at once
//     (without the fix the socket stayed bound and listening, and a client
//     connected into its backlog to wait out its whole timeout)
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "shim/cusnap_shim.h"
#include "tests/fakecuda/fakecuda_test_util.h"
#include "tests/shim/ckpt_client.h"
#include "tests/shim/workload_cmds.h"

using namespace fctest;
using namespace ckpt_client;

namespace {

constexpr const char* kCollective = "_Z24ncclDevKernel_AllReduce_Testv";

enum Cmd : uint64_t {
  kInit = 1,     // context, module, stream
  kGateWait,     // a thread calls the driver at the closed gate; cancel it; still waiting?
  kGateJoin,     // (gate open) the thread ended cancelled; the driver still answers
  kCutWait,      // a thread launches a collective (held at the cut)
  kCutCancel,    // cancel it; still held?
  kCutJoin,      // (cut released) the thread ended cancelled; a launch of ours passes
  kShareCancel,  // a thread makes the sharing calls with a cancellation pending
  kFdsOut,       // take every descriptor the process may open
  kFdsBack,      // give them back
  kPollLimit,    // RLIMIT_NOFILE 1: a poll of more than one descriptor fails
  kLimitBack,    // the limit as it was
  kFinish,
};

void sleep_ms(long ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, nullptr);
}

CUcontext g_ctx;
CUfunction g_coll;
CUstream g_stream;

/// After its driver call, waits to be cancelled (usleep: a cancellation point).
[[noreturn]] void wait_for_cancel() {
  for (;;) {
    pthread_testcancel();
    usleep(1000);
  }
}

void* gate_thread(void*) {
  int v = 0;
  cuDriverGetVersion(&v);  // waits at the closed gate
  wait_for_cancel();
}

void* cut_thread(void*) {
  cuCtxSetCurrent(g_ctx);
  cuLaunchKernel(g_coll, 1, 1, 1, 32, 1, 1, 0, g_stream, nullptr, nullptr);  // held at the cut
  wait_for_cancel();
}

// The sharing thread: its buffer, pipes and what its calls returned.
VmmBuffer g_buf;
int g_ready[2] = {-1, -1}, g_go[2] = {-1, -1};
int g_ticket = -1;
CUresult g_share_r[4] = {CUDA_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN,
                         CUDA_ERROR_UNKNOWN};
std::atomic<bool> g_share_done{false};

/// Disables cancellation, says it is ready, and blocks on the go pipe (a
/// cancellation point, but disabled) while the test cancels it; then enables
/// cancellation again (deferred: the pending request is not acted on there)
/// and makes its calls with the cancellation pending.
void* share_thread(void*) {
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, nullptr);
  pthread_setcanceltype(PTHREAD_CANCEL_DEFERRED, nullptr);
  cuCtxSetCurrent(g_ctx);
  char c = 1;
  if (write(g_ready[1], &c, 1) != 1 || read(g_go[0], &c, 1) != 1) return nullptr;
  pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, nullptr);
  // A ticket (pwrite), its import (pread), the release of the imported
  // handle, and the last unmap and release (the export cache's descriptor
  // closed). The ticket is closed by the workload after the join: close is
  // a cancellation point of the application's own.
  g_share_r[0] = cuMemExportToShareableHandle(&g_ticket, g_buf.handle,
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  CUmemGenericAllocationHandle h = 0;
  g_share_r[1] =
      cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(g_ticket)),
                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  g_share_r[2] = cuMemRelease(h);
  g_share_r[3] = vmm_destroy(g_buf);
  g_share_done = true;
  wait_for_cancel();
}

/// Whether t ended within ms, cancelled.
bool ended_cancelled(pthread_t t, long ms) {
  timespec until{};
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += ms / 1000;
  until.tv_nsec += (ms % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec += 1;
    until.tv_nsec -= 1000000000L;
  }
  void* ret = nullptr;
  return pthread_timedjoin_np(t, &ret, &until) == 0 && ret == PTHREAD_CANCELED;
}

/// Whether t still runs 200 ms after its cancellation was asked for.
bool cancel_pending(pthread_t t) {
  if (pthread_cancel(t) != 0) return false;
  sleep_ms(200);
  void* ret = nullptr;
  return pthread_tryjoin_np(t, &ret) == EBUSY;
}

int workload(int sock) {
  pthread_t gate_t{}, cut_t{};
  std::vector<int> fds;
  rlimit old_limit{};
  for (;;) {
    uint64_t cmd = 0;
    if (!recv_u64(sock, &cmd)) return 1;
    bool ok = true;
    switch (cmd) {
      case kInit: {
        static const char image[] = "robust: placeholder module image";
        CUmodule mod;
        ok = init_primary(&g_ctx) == CUDA_SUCCESS &&
             cuModuleLoadData(&mod, image) == CUDA_SUCCESS &&
             cuModuleGetFunction(&g_coll, mod, kCollective) == CUDA_SUCCESS &&
             cuStreamCreate(&g_stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS;
        break;
      }
      case kGateWait: {
        const cusnap_shim_control* c = cmds::shim_control();
        FC_REQ(c && pthread_create(&gate_t, nullptr, gate_thread, nullptr) == 0);
        uint64_t waiting = 0;
        for (int i = 0; i < 500 && waiting == 0; ++i) {
          sleep_ms(10);
          c->gate_state(nullptr, nullptr, &waiting);
        }
        FC_REQ(waiting == 1);
        FC_REQ(cancel_pending(gate_t));
        c->gate_state(nullptr, nullptr, &waiting);
        FC_REQ(waiting == 1);
        break;
      }
      case kGateJoin: {
        int v = 0;
        FC_REQ(ended_cancelled(gate_t, 5000));
        FC_REQ(cuDriverGetVersion(&v) == CUDA_SUCCESS && v > 0);
        FC_REQ(cuCtxSynchronize() == CUDA_SUCCESS);
        break;
      }
      case kCutWait:
        FC_REQ(pthread_create(&cut_t, nullptr, cut_thread, nullptr) == 0);
        break;
      case kCutCancel:
        FC_REQ(cancel_pending(cut_t));
        break;
      case kCutJoin:
        FC_REQ(ended_cancelled(cut_t, 5000));
        FC_REQ(cuLaunchKernel(g_coll, 1, 1, 1, 32, 1, 1, 0, g_stream, nullptr, nullptr) ==
               CUDA_SUCCESS);
        FC_REQ(cuStreamSynchronize(g_stream) == CUDA_SUCCESS);
        break;
      case kShareCancel: {
        constexpr size_t kSize = 2ull << 20;
        pthread_t t{};
        char c = 0;
        FC_REQ(vmm_create(kSize, &g_buf) == CUDA_SUCCESS);
        FC_REQ(pipe2(g_ready, O_CLOEXEC) == 0 && pipe2(g_go, O_CLOEXEC) == 0);
        FC_REQ(pthread_create(&t, nullptr, share_thread, nullptr) == 0);
        FC_REQ(read(g_ready[0], &c, 1) == 1);
        FC_REQ(pthread_cancel(t) == 0);  // pending: the thread has cancellation disabled
        FC_REQ(write(g_go[1], &c, 1) == 1);
        FC_REQ(ended_cancelled(t, 5000));
        FC_REQ(g_share_done.load());
        for (CUresult r : g_share_r) FC_REQ(r == CUDA_SUCCESS);
        for (int* p : {g_ready, g_go})
          for (int i = 0; i < 2; ++i) close(p[i]);
        close(g_ticket);
        // The process goes on: the tables and the driver still answer.
        VmmBuffer again;
        FC_REQ(vmm_create(kSize, &again) == CUDA_SUCCESS);
        int t2 = -1;
        FC_REQ(cuMemExportToShareableHandle(
                   &t2, again.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS);
        close(t2);
        FC_REQ(vmm_destroy(again) == CUDA_SUCCESS);
        FC_REQ(cuCtxSynchronize() == CUDA_SUCCESS);
        break;
      }
      case kFdsOut: {
        getrlimit(RLIMIT_NOFILE, &old_limit);
        rlimit low = old_limit;
        low.rlim_cur = std::min<rlim_t>(old_limit.rlim_cur, 256);
        FC_REQ(setrlimit(RLIMIT_NOFILE, &low) == 0);
        for (int fd; (fd = fcntl(0, F_DUPFD_CLOEXEC, 0)) >= 0;) fds.push_back(fd);
        FC_REQ(!fds.empty() && errno == EMFILE);
        break;
      }
      case kFdsBack:
        for (int fd : fds) close(fd);
        fds.clear();
        FC_REQ(setrlimit(RLIMIT_NOFILE, &old_limit) == 0);
        break;
      case kPollLimit: {
        getrlimit(RLIMIT_NOFILE, &old_limit);
        rlimit low = old_limit;
        low.rlim_cur = 1;  // the descriptors open stay open
        FC_REQ(setrlimit(RLIMIT_NOFILE, &low) == 0);
        break;
      }
      case kLimitBack:
        FC_REQ(setrlimit(RLIMIT_NOFILE, &old_limit) == 0);
        break;
      case kFinish:
        return 0;
      default:
        return 1;
    }
    if (!send_u64(sock, ok ? 0 : 1)) return 1;
  }
}

Child g_job;
Shim g_shim;

bool command(uint64_t cmd) {
  uint64_t r = 1;
  if (!send_u64(g_job.sock, cmd) || !recv_u64(g_job.sock, &r) || r != 0) {
    fprintf(stderr, "command %llu failed in the workload\n", (unsigned long long)cmd);
    return false;
  }
  return true;
}

bool cut(Shim& shim, const char* op, uint64_t target, proto::CutState* st) {
  proto::CutRequest r;
  r.op = op;
  r.target = target;
  std::string err;
  if (!shim.exchange(proto::kMsgShimCut, r, -1, proto::kMsgShimCutState, st, &err) || !st->ok) {
    fprintf(stderr, "cut %s: %s%s\n", op, err.c_str(), st->error.c_str());
    return false;
  }
  return true;
}

int run() {
  g_job = spawn(workload);
  REQ(g_job.pid > 0);
  REQ(command(kInit));  // the shim is up once the driver was called
  REQ(g_shim.connect(g_job.pid));

  // The gate.
  REQ(g_shim.gate_close().ok);
  REQ(command(kGateWait));
  REQ(g_shim.gate_open().ok);
  REQ(command(kGateJoin));
  REQ(g_shim.gate_close().ok);  // nothing left in flight: it drains
  REQ(g_shim.gate_open().ok);

  // The cut: armed at the count made so far, the next collective holds.
  proto::CutState st;
  REQ(cut(g_shim, "arm", 0, &st));
  const uint64_t at = st.reserved;
  REQ(cut(g_shim, "target", at, &st));
  REQ(command(kCutWait));
  bool held = false;
  for (int i = 0; i < 500 && !held; ++i) {
    REQ(cut(g_shim, "status", 0, &st));
    held = st.held == 1;
    if (!held) usleep(10000);
  }
  REQ(held);
  REQ(command(kCutCancel));
  REQ(cut(g_shim, "status", 0, &st) && st.held == 1 && st.launched == at);
  REQ(cut(g_shim, "release", 0, &st));
  REQ(command(kCutJoin));
  REQ(cut(g_shim, "status", 0, &st) && st.held == 0 && st.launched == at + 2);

  // Sharing calls with a cancellation pending.
  REQ(command(kShareCancel));

  // Out of descriptors: the control listener, back at its accept, has a
  // connection pending that it cannot take.
  g_shim.ch = proto::Channel();
  REQ(command(kFdsOut));
  Shim late;
  REQ(late.connect(g_job.pid));
  const double before = cmds::cpu_seconds(g_job.pid);
  usleep(1000000);
  const double spent = cmds::cpu_seconds(g_job.pid) - before;
  fprintf(stderr, "workload CPU time over 1 s without descriptors: %.2f s\n", spent);
  REQ(before >= 0 && spent < 0.25);
  REQ(command(kFdsBack));
  REQ(cut(late, "status", 0, &st));  // served now

  // The control listener's poll fails: with `late` open it polls two
  // descriptors, more than RLIMIT_NOFILE 1 allows (EINVAL). A byte of a
  // request on `late` wakes it to poll again (unless its next poll came
  // after the limit already: then it has ended and closed `late`). It
  // ends, its socket gone.
  const std::string ctl = proto::shim_control_socket(g_dir, g_job.pid);
  REQ(command(kPollLimit));
  (void)!send(late.ch.fd(), "\x01", 1, MSG_NOSIGNAL);
  bool gone = false;
  for (int i = 0; i < 300 && !gone; ++i) {
    gone = access(ctl.c_str(), F_OK) != 0;
    if (!gone) usleep(10000);
  }
  REQ(command(kLimitBack));
  REQ(gone);
  {
    UniqueFd fd;
    std::string err;
    const auto t0 = std::chrono::steady_clock::now();
    REQ(!proto::connect_unix(ctl, std::chrono::seconds(5), &fd, &err));
    REQ(cmds::ms_since(t0) < 1000);
    fprintf(stderr, "connect after the control listener ended: %s\n", err.c_str());
  }

  REQ(send_u64(g_job.sock, kFinish));
  REQ(g_job.join() == 0);
  return 0;
}

}  // namespace

int main() {
  return coordinator_main("shim.track.robust", "robust", run, [] { g_job.kill(); });
}
