// capture_checkpoint.cpp: what the real driver's process checkpoint does to a
// process whose stream is capturing (a CUDA graph being recorded) at the time,
// and what the simulated driver (tests/fakecuda) must mirror. On a GPU machine,
// as root:
//   g++ -I/usr/local/cuda/include capture_checkpoint.cpp -lcuda -o probe
//   for m in 0 2; do for c in 0 1 2; do ./probe $m $c; done; done
// MODE: 0 global, 1 thread-local, 2 relaxed. CASE: 0 lock and unlock only;
// 1 lock, checkpoint, restore, unlock; 2 as 1, with the capture begun on a
// second stream joined through an event (PyTorch's pattern for NCCL streams).
//
// A child process (forked before cuInit) allocates a counter, begins a capture
// in MODE, captures 8 increments of the counter, tells the parent, and waits
// on a pipe (no driver call). The parent runs the driver's checkpoint cycle
// on it, then lets it go: the child ends the capture, instantiates and
// launches the graph twice, and prints the counter (16 when all went well)
// and every call's result.
#include <cuda.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

static const char* nm(CUresult r) {
  const char* s = "?";
  cuGetErrorName(r, &s);
  return s;
}
static const char* st(CUstreamCaptureStatus s) {
  return s == CU_STREAM_CAPTURE_STATUS_NONE     ? "NONE"
         : s == CU_STREAM_CAPTURE_STATUS_ACTIVE ? "ACTIVE"
                                                 : "INVALIDATED";
}
#define R(who, x)                                                                 \
  do {                                                                            \
    CUresult _r = (x);                                                            \
    printf("  %-6s %-52s -> %d %s\n", who, #x, (int)_r, nm(_r));                  \
    fflush(stdout);                                                               \
  } while (0)

static const char* ptx =
    ".version 7.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry inc(.param .u64 p) {\n"
    "  .reg .b64 %rd<3>;\n  .reg .b32 %r<3>;\n"
    "  ld.param.u64 %rd1, [p];\n  cvta.to.global.u64 %rd2, %rd1;\n"
    "  ld.global.u32 %r1, [%rd2];\n  add.s32 %r2, %r1, 1;\n  st.global.u32 [%rd2], %r2;\n"
    "  ret;\n}\n";

static void child(int mode, int joined, int to_parent, int from_parent) {
  const char* who = "child";
  CUdevice d;
  CUcontext c;
  CUmodule m;
  CUfunction k;
  R(who, cuInit(0));
  R(who, cuDeviceGet(&d, 0));
  R(who, cuDevicePrimaryCtxRetain(&c, d));
  R(who, cuCtxSetCurrent(c));
  R(who, cuModuleLoadData(&m, ptx));
  R(who, cuModuleGetFunction(&k, m, "inc"));
  CUdeviceptr counter;
  R(who, cuMemAlloc(&counter, 4));
  R(who, cuMemsetD32(counter, 0, 1));
  CUstream A, B;
  CUevent e1, e2;
  R(who, cuStreamCreate(&A, CU_STREAM_NON_BLOCKING));
  R(who, cuStreamCreate(&B, CU_STREAM_NON_BLOCKING));
  R(who, cuEventCreate(&e1, CU_EVENT_DISABLE_TIMING));
  R(who, cuEventCreate(&e2, CU_EVENT_DISABLE_TIMING));
  void* args[] = {&counter};
  R(who, cuStreamBeginCapture(A, (CUstreamCaptureMode)mode));
  CUstream on = A;
  if (joined) {
    R(who, cuEventRecord(e1, A));
    R(who, cuStreamWaitEvent(B, e1, 0));
    on = B;
  }
  for (int i = 0; i < 8; ++i) cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, on, args, nullptr);
  CUstreamCaptureStatus cs;
  R(who, cuStreamIsCapturing(on, &cs));
  printf("  child  capturing before the checkpoint: %s\n", st(cs));
  fflush(stdout);
  char b = 'c';
  if (write(to_parent, &b, 1) != 1) _exit(3);
  if (read(from_parent, &b, 1) != 1) _exit(4);
  R(who, cuStreamIsCapturing(on, &cs));
  printf("  child  capturing after the checkpoint: %s\n", st(cs));
  if (joined) {
    R(who, cuEventRecord(e2, B));
    R(who, cuStreamWaitEvent(A, e2, 0));
  }
  CUgraph g = nullptr;
  R(who, cuStreamEndCapture(A, &g));
  printf("  child  graph %s\n", g ? "yes" : "NULL");
  unsigned v = 0;
  if (g) {
    CUgraphExec x = nullptr;
    R(who, cuGraphInstantiate(&x, g, 0));
    if (x) {
      R(who, cuGraphLaunch(x, A));
      R(who, cuGraphLaunch(x, A));
    }
  }
  R(who, cuStreamSynchronize(A));
  R(who, cuMemcpyDtoH(&v, counter, 4));
  printf("  child  counter %u (16 expected)\n", v);
  // Is the process still sound: a fresh capture and launch.
  R(who, cuStreamBeginCapture(A, (CUstreamCaptureMode)mode));
  cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, A, args, nullptr);
  CUgraph g2 = nullptr;
  R(who, cuStreamEndCapture(A, &g2));
  CUgraphExec x2 = nullptr;
  if (g2) R(who, cuGraphInstantiate(&x2, g2, 0));
  if (x2) R(who, cuGraphLaunch(x2, A));
  R(who, cuStreamSynchronize(A));
  R(who, cuMemcpyDtoH(&v, counter, 4));
  printf("  child  counter after a fresh capture %u\n", v);
  fflush(stdout);
  _exit(0);
}

static double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

int main(int argc, char** argv) {
  int mode = argc > 1 ? atoi(argv[1]) : 0;
  int which = argc > 2 ? atoi(argv[2]) : 1;
  printf("== mode %d (%s) case %d (%s)\n", mode,
         mode == 0 ? "GLOBAL" : mode == 1 ? "THREAD_LOCAL" : "RELAXED", which,
         which == 0 ? "lock, unlock" : which == 1 ? "lock, checkpoint, restore, unlock"
                                                  : "joined stream; lock, checkpoint, restore, unlock");
  fflush(stdout);
  int up[2], down[2];
  if (pipe(up) || pipe(down)) return 1;
  pid_t pid = fork();
  if (pid == 0) child(mode, which == 2, up[1], down[0]);
  const char* who = "parent";
  R(who, cuInit(0));
  char b;
  if (read(up[0], &b, 1) != 1) {
    puts("  parent child died before capturing");
    return 1;
  }
  CUcheckpointLockArgs la;
  memset(&la, 0, sizeof la);
  la.timeoutMs = 10000;
  auto t = std::chrono::steady_clock::now();
  CUresult r = cuCheckpointProcessLock(pid, &la);
  printf("  parent lock -> %d %s in %.3f s\n", (int)r, nm(r), since(t));
  CUprocessState s;
  if (r == CUDA_SUCCESS && which != 0) {
    CUcheckpointCheckpointArgs ca;
    memset(&ca, 0, sizeof ca);
    t = std::chrono::steady_clock::now();
    r = cuCheckpointProcessCheckpoint(pid, &ca);
    printf("  parent checkpoint -> %d %s in %.3f s\n", (int)r, nm(r), since(t));
    cuCheckpointProcessGetState(pid, &s);
    printf("  parent state %d\n", (int)s);
    if (r == CUDA_SUCCESS) {
      CUcheckpointRestoreArgs ra;
      memset(&ra, 0, sizeof ra);
      t = std::chrono::steady_clock::now();
      r = cuCheckpointProcessRestore(pid, &ra);
      printf("  parent restore -> %d %s in %.3f s\n", (int)r, nm(r), since(t));
    }
  }
  CUcheckpointUnlockArgs ua;
  memset(&ua, 0, sizeof ua);
  r = cuCheckpointProcessUnlock(pid, &ua);
  printf("  parent unlock -> %d %s\n", (int)r, nm(r));
  cuCheckpointProcessGetState(pid, &s);
  printf("  parent state %d\n", (int)s);
  fflush(stdout);
  b = 'g';
  if (write(down[1], &b, 1) != 1) return 1;
  int status = 0;
  waitpid(pid, &status, 0);
  printf("  parent child exit %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status));
  return 0;
}
