// cusnap-collective-pair: two ranks that meet in a collective kernel every
// step, like two ranks of an NCCL job (for the simulated driver only).
//
//   cusnap-collective-pair [--steps N] [--mib M] [--interval-ms T] [--lag-ms L]
//                          [--print-every K] [--graph G] [--capture-ms C] [--churn]
//                          [--late-ms E] [--depth D [--gap-us U]]
//
// Forks rank 1 first (before any driver call); the parent is rank 0. Rank R
// runs on device R (device 0 for both when there is one device), creates an
// exportable VMM allocation (cuMemCreate, POSIX file descriptor handle) with
// read-write access for both ranks' devices, exports it, passes the
// descriptor to the other rank over a Unix socketpair (SCM_RIGHTS) and
// imports and maps the other rank's. Each allocation holds this rank's flag
// (8 bytes at offset 0) and two data slots of M MiB (default 1) from 64 KiB.
//
// Step s = 1, 2, ...: fill slot s%2 of the own allocation with value(R, s)
// (cuMemsetD32), launch "ncclDevKernel_Handshake_Pair" (mangled; own flag, peer flag,
// s) on a stream, cuStreamSynchronize, then read the peer's slot s%2 through
// the imported mapping (cuMemcpyDtoH) and check every word is value(1-R, s).
// The handshake kernel of the simulated driver (tests/fakecuda) stores s into
// the own flag and completes when the peer's flag reaches s: neither rank's
// kernel completes until the other rank has launched its own, so a stopped
// rank keeps the other's kernel spinning on the device, as a collective in
// flight does. The two slots make the check race-free: a rank writes slot s%2
// again only at step s+2, after the other rank's kernel s+1, which the other
// rank launches only after reading step s.
//
// --graph G (G >= 1): as a job that replays its collectives from a CUDA graph.
// Each rank captures G launches of the handshake kernel with step 0 ("the
// next step": the simulated driver reads it from the own flag when the node
// runs, as NCCL keeps its counters in device memory) on its stream into a
// graph (cuStreamBeginCapture_v2 .. cuStreamEndCapture, cuGraphInstantiate-
// WithFlags), and step s launches that graph (cuGraphLaunch) instead of one
// kernel: the flags advance by G per step, so a rank's collective count is
// G times its step. The fill and check are as above (the graph's last node
// completes only once the peer's graph of the same step has begun).
//
// --capture-ms C (C >= 1): after each step's check, the rank records a CUDA
// graph on a second stream for C ms (cuStreamBeginCapture_v2 in global mode,
// a host sleep of C ms, cuStreamEndCapture, cuGraphDestroy), as a job that
// captures while it runs (PyTorch tracing a model): a checkpoint then mostly
// finds a capture under way, during which the device cannot be synchronized.
//
// --churn: at the end of each step (after its capture), the rank replaces a
// scratch allocation of one granule that it never exports (cuMemCreate with
// a POSIX descriptor handle type, as PyTorch's expandable segments ask for,
// mapped; the previous one unmapped and released), as PyTorch's allocator
// maps and unmaps segments while it runs: what the shim tracks of the rank
// changes from step to step, between a checkpoint's first look and its cut.
//
// --depth D (1 to 64, default 1): each step launches D handshake kernels in a
// row (steps (s-1)*D+1 .. s*D) before its one synchronize, as a data-parallel
// training step queues its all-reduces on NCCL's stream without waiting: a
// rank may then be up to D collectives ahead of the other, and the cut holds
// a rank that must launch several to reach the common count, maybe in the
// middle of a step. A rank's collective count is D times its step at the end
// of a step; the fill and check are as above (the last kernel of step s
// completes only once the peer launched its own). --gap-us U: a sleep of U
// microseconds between the launches of a step, so that a cut often finds a
// rank in the middle of its step's launches.
//
// --late-ms E: rank 1 sleeps E ms after it printed "ready", before its first
// step, as a rank that reaches its first collective late (still loading its
// data): rank 0 meanwhile waits in its first collective, rank 1 has launched
// none.
//
// Prints "rank R ready pid P device D", then "rank R count S ok" (S: the step
// just verified) at step 1, every K steps (default 100) and at the last step,
// sleeping T ms between steps (default 0; rank 0 sleeps L ms more, so that
// rank 1 mostly waits in a collective for rank 0, the case a checkpoint
// without a cut cannot drain), until N steps (0, the default: for
// ever), then "rank R done"; the lines fit the e2e helpers with the prefixes
// "rank 0 " and "rank 1 " (last_count, wait_count, ready_pids). Exit status: 2
// a driver call failed (also when the driver is not the simulated one: its
// module image is a placeholder), 3 a byte was wrong, 4 the other rank
// ended, 64 bad usage.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <string>
#include <thread>
#include <vector>

#include "share_util.h"

using namespace workload::share;

namespace {

constexpr size_t kSlotsOffset = 64 << 10;
// Mangled, as the real driver names NCCL's kernels (cuFuncGetName gives
// "_Z39ncclDevKernel_AllReduce_Sum_u64_RING_LL..."): the shim's cut must
// recognise collectives by their mangled names.
constexpr const char* kKernel = "_Z28ncclDevKernel_Handshake_Pairmmm";

struct Options {
  long steps = 0;
  size_t mib = 1;
  long interval_ms = 0;
  long lag_ms = 0;
  long print_every = 100;
  long graph = 0;  ///< collectives per graph launch; 0: plain launches
  long capture_ms = 0;  ///< a side capture this long after each step; 0: none
  bool churn = false;   ///< replace an unexported scratch allocation every step
  long late_ms = 0;     ///< rank 1's sleep before its first step
  long depth = 1;       ///< plain launches per step, before its synchronize
  long gap_us = 0;      ///< sleep between the launches of a step
};

uint32_t value(unsigned rank, long step) {
  return uint32_t(step) * 2654435761u + rank * 0x01000193u + 0x5eed;
}

/// An exportable allocation of one granule, mapped, never exported; replaced
/// every step (--churn).
struct Scratch {
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr ptr = 0;
  size_t size = 0;
};
void replace_scratch(Scratch* s, CUdevice dev, size_t gran, const std::vector<CUdevice>& devs,
                     const char* who) {
  Scratch next;
  CUmemAllocationProp prop = posix_fd_prop(dev);
  next.size = gran;
  WL_CHECK(cuMemCreate(&next.h, next.size, &prop, 0), who);
  next.ptr = map_for(next.h, next.size, devs, who);
  if (s->ptr) {
    WL_CHECK(cuMemUnmap(s->ptr, s->size), who);
    WL_CHECK(cuMemAddressFree(s->ptr, s->size), who);
    WL_CHECK(cuMemRelease(s->h), who);
  }
  *s = next;
}

/// Rank 0 watches rank 1: exits 4 as soon as it fails (the kernel of rank 0
/// would otherwise wait for it for ever). Stores a clean exit's status.
void watch_child(pid_t child, std::atomic<int>* status) {
  std::thread([child, status] {
    for (;;) {
      int st = 0;
      pid_t r = waitpid(child, &st, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r == child && WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        status->store(0);
        return;
      }
      if (r == child)
        std::fprintf(stderr, "cusnap-collective-pair 0: rank 1 (pid %d) ended (%s %d)\n",
                     int(child), WIFEXITED(st) ? "exit status" : "signal",
                     WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
      _exit(4);
    }
  }).detach();
}

/// Rank 1 watches rank 0 (its parent).
void watch_parent(pid_t parent) {
  std::thread([parent] {
    while (getppid() == parent) usleep(100 * 1000);
    std::fprintf(stderr, "cusnap-collective-pair 1: rank 0 (pid %d) ended\n", int(parent));
    _exit(4);
  }).detach();
}

int run(const Options& o, unsigned rank, pid_t child, int sock) {
  std::string who_s = "cusnap-collective-pair " + std::to_string(rank);
  const char* who = who_s.c_str();
  pid_t parent = getppid();
  std::atomic<int> child_status{-1};
  if (rank == 0)
    watch_child(child, &child_status);
  else
    watch_parent(parent);

  WL_CHECK(cuInit(0), who);
  int count = 0;
  WL_CHECK(cuDeviceGetCount(&count), who);
  CUdevice dev;
  WL_CHECK(cuDeviceGet(&dev, int(rank) < count ? int(rank) : 0), who);
  CUcontext ctx;
  WL_CHECK(cuDevicePrimaryCtxRetain(&ctx, dev), who);
  WL_CHECK(cuCtxSetCurrent(ctx), who);
  std::vector<CUdevice> devs;
  for (int d = 0; d < count && d < 2; ++d) devs.push_back(d);

  // The module: a placeholder image that only the simulated driver accepts.
  CUfunction fn = load_fake_kernel(kKernel, who);

  CUmemAllocationProp prop = posix_fd_prop(dev);
  size_t gran = 0;
  WL_CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), who);
  size_t slot = std::max<size_t>(o.mib << 20, 4096);
  size_t size = (kSlotsOffset + 2 * slot + gran - 1) / gran * gran;
  CUmemGenericAllocationHandle own_h;
  WL_CHECK(cuMemCreate(&own_h, size, &prop, 0), who);
  CUdeviceptr own = map_for(own_h, size, devs, who);
  WL_CHECK(cuMemsetD8(own, 0, kSlotsOffset), who);  // the flag starts at 0
  int fd = export_fd(own_h, who);
  send_fd(sock, fd);
  close(fd);
  int in = recv_fd(sock);
  if (in < 0) {
    std::fprintf(stderr, "%s: no descriptor from rank %u\n", who, 1 - rank);
    return 2;
  }
  close(sock);
  CUmemGenericAllocationHandle peer_h;
  WL_CHECK(cuMemImportFromShareableHandle(&peer_h, reinterpret_cast<void*>(intptr_t(in)),
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
           who);
  close(in);
  CUdeviceptr peer = map_for(peer_h, size, devs, who);
  CUstream stream, side;
  WL_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), who);
  WL_CHECK(cuStreamCreate(&side, CU_STREAM_NON_BLOCKING), who);
  std::printf("rank %u ready pid %d device %d\n", rank, int(getpid()), int(dev));

  CUgraphExec exec = nullptr;
  if (o.graph > 0) {
    CUdeviceptr my_flag = own, peer_flag = peer;
    uint64_t next = 0;  // the next step, read on the device
    void* params[] = {&my_flag, &peer_flag, &next};
    WL_CHECK(cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), who);
    for (long k = 0; k < o.graph; ++k)
      WL_CHECK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, params, nullptr), who);
    CUgraph graph;
    WL_CHECK(cuStreamEndCapture(stream, &graph), who);
    WL_CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0), who);
    WL_CHECK(cuGraphDestroy(graph), who);
  }
  std::vector<uint32_t> words(slot / 4);
  Scratch scratch;
  if (rank == 1 && o.late_ms > 0) usleep(useconds_t(o.late_ms * 1000));
  for (long step = 1; o.steps == 0 || step <= o.steps; ++step) {
    size_t off = kSlotsOffset + size_t(step % 2) * slot;
    WL_CHECK(cuMemsetD32(own + off, value(rank, step), slot / 4), who);
    CUdeviceptr my_flag = own, peer_flag = peer;
    if (exec) {
      WL_CHECK(cuGraphLaunch(exec, stream), who);
    } else {
      // The driver copies the parameters at each launch.
      for (long k = 1; k <= o.depth; ++k) {
        if (k > 1 && o.gap_us > 0) usleep(useconds_t(o.gap_us));
        uint64_t s = uint64_t((step - 1) * o.depth + k);
        void* params[] = {&my_flag, &peer_flag, &s};
        WL_CHECK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, params, nullptr), who);
      }
    }
    WL_CHECK(cuStreamSynchronize(stream), who);
    WL_CHECK(cuMemcpyDtoH(words.data(), peer + off, slot), who);
    uint32_t want = value(1 - rank, step);
    for (size_t k = 0; k < words.size(); ++k)
      if (words[k] != want) {
        std::fprintf(stderr,
                     "%s: pattern mismatch at step %ld: word %zu of rank %u's slot %ld reads 0x%08x, "
                     "expected 0x%08x\n",
                     who, step, k, 1 - rank, step % 2, words[k], want);
        return 3;
      }
    bool last = o.steps != 0 && step == o.steps;
    if (step % o.print_every == 0 || last || step == 1)
      std::printf("rank %u count %ld ok\n", rank, step);
    if (o.capture_ms > 0) {
      WL_CHECK(cuStreamBeginCapture_v2(side, CU_STREAM_CAPTURE_MODE_GLOBAL), who);
      usleep(useconds_t(o.capture_ms * 1000));
      CUgraph recorded;
      WL_CHECK(cuStreamEndCapture(side, &recorded), who);
      WL_CHECK(cuGraphDestroy(recorded), who);
    }
    if (o.churn) replace_scratch(&scratch, dev, gran, devs, who);
    const long pause_ms = o.interval_ms + (rank == 0 ? o.lag_ms : 0);
    if (pause_ms > 0) usleep(useconds_t(pause_ms * 1000));
  }
  std::printf("rank %u done\n", rank);
  if (rank == 0) {
    while (child_status.load() < 0) usleep(10 * 1000);  // the watcher exits 4 on a failure
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args(argc, argv, "cusnap-collective-pair", {"--churn"},
            {"--steps", "--mib", "--interval-ms", "--lag-ms", "--print-every", "--graph",
             "--capture-ms", "--late-ms", "--depth", "--gap-us"});
  Options o;
  o.churn = args.flag("--churn");
  o.steps = args.num("--steps", 0);
  o.mib = size_t(args.num("--mib", 1));
  o.interval_ms = args.num("--interval-ms", 0);
  o.lag_ms = args.num("--lag-ms", 0);
  o.print_every = args.num("--print-every", 100);
  o.graph = args.num("--graph", 0);
  o.capture_ms = args.num("--capture-ms", 0);
  o.late_ms = args.num("--late-ms", 0);
  o.depth = args.num("--depth", 1);
  o.gap_us = args.num("--gap-us", 0);
  if (o.depth < 1 || o.depth > 64 || (o.depth > 1 && o.graph > 0) || o.gap_us < 0 ||
      o.gap_us > 1000000) {
    std::fprintf(stderr,
                 "cusnap-collective-pair: --depth must be 1 to 64, and 1 with --graph; --gap-us 0 "
                 "to 1000000\n");
    return 64;
  }
  if (o.steps < 0 || o.print_every < 1 || o.interval_ms < 0 || o.lag_ms < 0 || args.num("--mib", 1) < 0 ||
      o.graph < 0 || o.graph > 64 || o.capture_ms < 0) {
    std::fprintf(stderr, "cusnap-collective-pair: --steps, --mib, --interval-ms, --lag-ms, "
                         "--capture-ms must be >= 0, --print-every >= 1, --graph 0 to 64\n");
    return 64;
  }
  if (o.late_ms < 0) {
    std::fprintf(stderr, "cusnap-collective-pair: --late-ms must be >= 0\n");
    return 64;
  }
  setvbuf(stdout, nullptr, _IOLBF, 0);
  auto [importer, child, sock] = fork_pair();
  return run(o, importer ? 1 : 0, child, sock);
}
