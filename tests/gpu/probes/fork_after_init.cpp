// fork_after_init.cpp: can a process forked from one that called cuInit use
// the driver's process checkpoint API? A restoring cusnap initializes the
// driver and then forks its guardian, which must be able to unlock or restore
// the job if the supervisor dies; the simulated driver (tests/fakecuda) must
// mirror what the real one does. On a GPU machine, as root:
//   g++ -I/usr/local/cuda/include fork_after_init.cpp -lcuda -o probe && ./probe
//
// A target process (forked before any driver call) makes a context and an
// allocation and waits. Then, for each CASE, a helper process is forked:
//   fresh   its parent never called the driver (the control);
//   init    its parent called cuInit(0) only (what cusnap's supervisor does);
//   context its parent also made a context current.
// The helper calls cuInit, cuDriverGetVersion, cuDeviceGetCount and, on the
// target, cuCheckpointProcessGetState, Lock and Unlock, and prints each result.
// Each CASE runs in its own process so the parent's state is the case's alone.
#include <cuda.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

static const char* nm(CUresult r) {
  const char* s = "?";
  if (cuGetErrorName(r, &s) != CUDA_SUCCESS || !s) return "(no name)";
  return s;
}

static void helper(const char* tag, pid_t target) {
  CUresult r = cuInit(0);
  std::printf("%s: cuInit -> %s\n", tag, nm(r));
  int v = 0, n = 0;
  r = cuDriverGetVersion(&v);
  std::printf("%s: cuDriverGetVersion -> %s (%d)\n", tag, nm(r), v);
  r = cuDeviceGetCount(&n);
  std::printf("%s: cuDeviceGetCount -> %s (%d)\n", tag, nm(r), n);
  CUprocessState st = CU_PROCESS_STATE_RUNNING;
  r = cuCheckpointProcessGetState(target, &st);
  std::printf("%s: cuCheckpointProcessGetState(target) -> %s (state %d)\n", tag, nm(r), int(st));
  CUcheckpointLockArgs la;
  std::memset(&la, 0, sizeof la);
  la.timeoutMs = 5000;
  r = cuCheckpointProcessLock(target, &la);
  std::printf("%s: cuCheckpointProcessLock(target) -> %s\n", tag, nm(r));
  if (r == CUDA_SUCCESS) {
    r = cuCheckpointProcessUnlock(target, nullptr);
    std::printf("%s: cuCheckpointProcessUnlock(target) -> %s\n", tag, nm(r));
  }
  std::fflush(stdout);
}

static void run_case(const char* tag, pid_t target) {
  pid_t c = fork();
  if (c == 0) {
    if (std::strcmp(tag, "fresh") != 0) {
      CUresult r = cuInit(0);
      std::printf("%s parent: cuInit -> %s\n", tag, nm(r));
      if (std::strcmp(tag, "context") == 0) {
        CUdevice d;
        CUcontext ctx;
        cuDeviceGet(&d, 0);
        r = cuDevicePrimaryCtxRetain(&ctx, d);
        if (r == CUDA_SUCCESS) r = cuCtxSetCurrent(ctx);
        std::printf("%s parent: primary context -> %s\n", tag, nm(r));
      }
      std::fflush(stdout);
    }
    pid_t h = fork();
    if (h == 0) {
      helper(tag, target);
      _exit(0);
    }
    int s = 0;
    waitpid(h, &s, 0);
    std::printf("%s: helper exit %d\n", tag, WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s));
    std::fflush(stdout);
    _exit(0);
  }
  waitpid(c, nullptr, 0);
}

int main() {
  int go[2];
  if (pipe(go) != 0) return 1;
  pid_t target = fork();
  if (target == 0) {
    close(go[0]);
    CUdevice d;
    CUcontext ctx;
    CUdeviceptr p = 0;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&d, 0) != CUDA_SUCCESS ||
        cuCtxCreate(&ctx, nullptr, 0, d) != CUDA_SUCCESS || cuMemAlloc(&p, 1 << 20) != CUDA_SUCCESS)
      _exit(2);
    char c = 'r';
    if (write(go[1], &c, 1) != 1) _exit(3);
    pause();
    _exit(0);
  }
  close(go[1]);
  char c;
  if (read(go[0], &c, 1) != 1) {
    std::printf("target failed to start\n");
    return 1;
  }
  for (const char* tag : {"fresh", "init", "context"}) run_case(tag, target);
  kill(target, SIGKILL);
  waitpid(target, nullptr, 0);
  return 0;
}
