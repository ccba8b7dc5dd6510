// state_and_lock.cu: what the driver's process checkpoint API answers about
// processes at each stage of their use of the driver, and what a lock with a
// timeout answers when the process's device work outlasts it. The simulated
// driver (tests/fakecuda) and the coordinator's checks (engine_common.cpp:
// which processes it skips, how it words a lock that timed out) follow what
// this prints. On a GPU machine, as root:
//   nvcc -arch=sm_90 state_and_lock.cu -lcuda -o probe && ./probe
//
// Targets, each forked before this process calls the driver:
//   exec     executes /bin/sleep (libcuda never loaded)
//   loaded   libcuda loaded (linked) but cuInit never called
//   init     cuInit(0) only
//   context  a context and an allocation
//   busy     a context whose kernel spins for 4 s, its thread in
//            cudaDeviceSynchronize
// For each: cuCheckpointProcessGetState, then Lock (timeoutMs 500) with the
// time it took, the state after it, and Unlock when the lock succeeded. For
// busy, a second Lock with timeoutMs 10000 follows.
#include <cuda.h>
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

__global__ void spin(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

static const char* nm(CUresult r) {
  const char* s = nullptr;
  if (cuGetErrorName(r, &s) != CUDA_SUCCESS || !s) return "(no name)";
  return s;
}

static const char* state_name(CUprocessState s) {
  switch (s) {
    case CU_PROCESS_STATE_RUNNING:
      return "RUNNING";
    case CU_PROCESS_STATE_LOCKED:
      return "LOCKED";
    case CU_PROCESS_STATE_CHECKPOINTED:
      return "CHECKPOINTED";
    case CU_PROCESS_STATE_FAILED:
      return "FAILED";
  }
  return "?";
}

struct Target {
  const char* tag;
  pid_t pid;
};

// Forks a target that runs body, then tells the parent it is ready (one
// byte on a pipe) and waits to be killed.
template <class F>
static Target fork_target(const char* tag, F body) {
  int p[2];
  if (pipe(p) != 0) std::exit(2);
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    body(p[1]);
    char c = 1;
    if (write(p[1], &c, 1) != 1) _exit(3);
    for (;;) pause();
  }
  close(p[1]);
  char c = 0;
  if (read(p[0], &c, 1) != 1) std::printf("%s: target %d failed to start\n", tag, pid);
  close(p[0]);
  return {tag, pid};
}

static void probe(const Target& t, unsigned lock_ms) {
  CUprocessState st = CU_PROCESS_STATE_FAILED;
  CUresult r = cuCheckpointProcessGetState(t.pid, &st);
  std::printf("%-8s GetState -> %s (%s)\n", t.tag, nm(r), r == CUDA_SUCCESS ? state_name(st) : "-");
  CUcheckpointLockArgs args{};
  args.timeoutMs = lock_ms;
  const auto t0 = std::chrono::steady_clock::now();
  r = cuCheckpointProcessLock(t.pid, &args);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%-8s Lock(timeoutMs %u) -> %s after %.0f ms\n", t.tag, lock_ms, nm(r), ms);
  CUresult s = cuCheckpointProcessGetState(t.pid, &st);
  std::printf("%-8s GetState after the lock -> %s (%s)\n", t.tag, nm(s),
              s == CUDA_SUCCESS ? state_name(st) : "-");
  if (r == CUDA_SUCCESS) {
    CUresult u = cuCheckpointProcessUnlock(t.pid, nullptr);
    std::printf("%-8s Unlock -> %s\n", t.tag, nm(u));
  }
}

int main() {
  std::vector<Target> targets;
  targets.push_back(fork_target("exec", [](int ready) {
    char c = 1;
    if (write(ready, &c, 1) != 1) _exit(3);
    execl("/bin/sleep", "sleep", "600", static_cast<char*>(nullptr));
    _exit(4);
  }));
  targets.push_back(fork_target("loaded", [](int) {}));
  targets.push_back(fork_target("init", [](int) { cuInit(0); }));
  targets.push_back(fork_target("context", [](int) {
    void* p = nullptr;
    if (cudaMalloc(&p, 64 << 20) != cudaSuccess) _exit(5);
  }));
  // busy: ready once its kernel runs; its thread then waits in the sync.
  int p[2];
  if (pipe(p) != 0) return 2;
  pid_t busy = fork();
  if (busy == 0) {
    close(p[0]);
    void* m = nullptr;
    if (cudaMalloc(&m, 64 << 20) != cudaSuccess) _exit(5);
    cudaDeviceSynchronize();
    spin<<<1, 1>>>(4000000000ull);
    char c = 1;
    if (write(p[1], &c, 1) != 1) _exit(3);
    cudaError_t e = cudaDeviceSynchronize();
    std::printf("busy     its sync returned %s\n", cudaGetErrorName(e));
    std::fflush(stdout);
    for (;;) pause();
  }
  close(p[1]);
  char c = 0;
  if (read(p[0], &c, 1) != 1) std::printf("busy: target failed to start\n");
  close(p[0]);

  CUresult r = cuInit(0);
  std::printf("this process: cuInit -> %s\n", nm(r));
  for (const Target& t : targets) probe(t, 500);
  usleep(200000);  // the kernel is running well before the lock
  probe({"busy", busy}, 500);
  probe({"busy", busy}, 10000);
  for (const Target& t : targets) kill(t.pid, SIGKILL);
  kill(busy, SIGKILL);
  while (wait(nullptr) > 0) {
  }
  return 0;
}
