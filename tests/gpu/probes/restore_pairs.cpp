// restore_pairs.cpp: what the real driver's process restore does with GPU
// pairs (CUcheckpointRestoreArgs::gpuPairs) that name a GPU the process does
// not have, that leave out one it has, or that map onto a GPU that is not
// there; whether a process whose restore was refused stays checkpointed and
// restores afterwards without pairs; and what the simulated driver
// (tests/fakecuda) must mirror. It decides whether cusnap may give every
// process of a job the whole device map, or must give each only the pairs of
// the GPUs it has. On a GPU machine, as root:
//   g++ -I/usr/local/cuda/include restore_pairs.cpp -lcuda -o probe
//   for c in 0 1 2 3 4 5; do ./probe $c; done
// CASE: 0 no arguments; 1 [own->own]; 2 [own->own, other->own]; 3
// [other->own] (its own GPU left out); 4 [own->other]; 5 [own->own,
// own->own]. "other" is a UUID no GPU here has.
//
// A child (forked before cuInit) fills 64 MiB of device memory with a
// pattern, tells the parent, and waits on a pipe. The parent locks and
// checkpoints it, restores it with CASE's pairs, and if that was refused,
// prints the state and restores it without pairs; then unlocks it and lets it
// go: the child checks the pattern and prints how many words differ.
#include <cuda.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static const char* nm(CUresult r) {
  const char* s = "?";
  cuGetErrorName(r, &s);
  return s;
}

static constexpr size_t kWords = 16u << 20;  // 64 MiB

static void child(int to_parent, int from_parent) {
  CUdevice d;
  CUcontext c;
  if (cuInit(0) || cuDeviceGet(&d, 0) || cuDevicePrimaryCtxRetain(&c, d) || cuCtxSetCurrent(c))
    _exit(2);
  CUdeviceptr p;
  std::vector<unsigned> h(kWords);
  for (size_t i = 0; i < kWords; ++i) h[i] = unsigned(i * 2654435761u);
  if (cuMemAlloc(&p, kWords * 4) || cuMemcpyHtoD(p, h.data(), kWords * 4)) _exit(3);
  char b = 'c';
  if (write(to_parent, &b, 1) != 1) _exit(4);
  if (read(from_parent, &b, 1) != 1) _exit(5);
  alarm(60);  // a process left checkpointed blocks in its next driver call
  std::vector<unsigned> back(kWords);
  CUresult r = cuMemcpyDtoH(back.data(), p, kWords * 4);
  size_t bad = 0;
  for (size_t i = 0; i < kWords; ++i) bad += back[i] != h[i];
  printf("  child  read back -> %d %s, %zu of %zu words differ\n", (int)r, nm(r), bad, kWords);
  fflush(stdout);
  _exit(r == CUDA_SUCCESS && bad == 0 ? 0 : 6);
}

static double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

static void state(pid_t pid) {
  CUprocessState s = CU_PROCESS_STATE_RUNNING;
  CUresult r = cuCheckpointProcessGetState(pid, &s);
  printf("  parent state -> %d %s, %d (0 running, 1 locked, 2 checkpointed, 3 failed)\n", (int)r,
         nm(r), (int)s);
}

int main(int argc, char** argv) {
  const int which = argc > 1 ? atoi(argv[1]) : 0;
  static const char* names[] = {"no arguments",           "[own->own]",
                                "[own->own, other->own]", "[other->own] (own GPU left out)",
                                "[own->other]",           "[own->own, own->own]"};
  if (which < 0 || which > 5) return 2;
  printf("== case %d: %s\n", which, names[which]);
  fflush(stdout);
  int up[2], down[2];
  if (pipe(up) || pipe(down)) return 1;
  pid_t pid = fork();
  if (pid == 0) child(up[1], down[0]);
  CUresult r = cuInit(0);
  CUdevice d;
  CUuuid own, other;
  cuDeviceGet(&d, 0);
  cuDeviceGetUuid(&own, d);
  memcpy(&other, &own, sizeof other);
  other.bytes[15] ^= 0x5a;  // a UUID no GPU here has
  char b;
  if (read(up[0], &b, 1) != 1) {
    puts("  parent child died before its memory was filled");
    return 1;
  }
  CUcheckpointLockArgs la;
  memset(&la, 0, sizeof la);
  la.timeoutMs = 10000;
  r = cuCheckpointProcessLock(pid, &la);
  printf("  parent lock -> %d %s\n", (int)r, nm(r));
  CUcheckpointCheckpointArgs ca;
  memset(&ca, 0, sizeof ca);
  auto t = std::chrono::steady_clock::now();
  r = cuCheckpointProcessCheckpoint(pid, &ca);
  printf("  parent checkpoint -> %d %s in %.3f s\n", (int)r, nm(r), since(t));
  state(pid);
  CUcheckpointGpuPair pairs[2];
  unsigned n = 0;
  auto add = [&](const CUuuid& a, const CUuuid& z) {
    pairs[n].oldUuid = a;
    pairs[n].newUuid = z;
    ++n;
  };
  switch (which) {
    case 1:
      add(own, own);
      break;
    case 2:
      add(own, own), add(other, own);
      break;
    case 3:
      add(other, own);
      break;
    case 4:
      add(own, other);
      break;
    case 5:
      add(own, own), add(own, own);
      break;
    default:
      break;
  }
  CUcheckpointRestoreArgs ra;
  memset(&ra, 0, sizeof ra);
  ra.gpuPairs = n ? pairs : nullptr;
  ra.gpuPairsCount = n;
  t = std::chrono::steady_clock::now();
  r = cuCheckpointProcessRestore(pid, n ? &ra : nullptr);
  printf("  parent restore with %u pairs -> %d %s in %.3f s\n", n, (int)r, nm(r), since(t));
  state(pid);
  if (r != CUDA_SUCCESS) {
    t = std::chrono::steady_clock::now();
    r = cuCheckpointProcessRestore(pid, nullptr);
    printf("  parent restore again without pairs -> %d %s in %.3f s\n", (int)r, nm(r), since(t));
    state(pid);
  }
  CUcheckpointUnlockArgs ua;
  memset(&ua, 0, sizeof ua);
  r = cuCheckpointProcessUnlock(pid, &ua);
  printf("  parent unlock -> %d %s\n", (int)r, nm(r));
  state(pid);
  fflush(stdout);
  b = 'g';
  if (write(down[1], &b, 1) != 1) return 1;
  int status = 0;
  waitpid(pid, &status, 0);
  printf("  parent child exit %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status));
  return 0;
}
