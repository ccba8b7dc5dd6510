// The cost of the shim's range check on copies and memsets (docs/shim.md,
// "the ranges of copies and memsets"), measured in one process: 16-byte
// cuMemsetD8Async calls into a 2 MiB block, timed in alternating rounds while
// no block the shim serves has a tail (sizes of whole granules: the check is
// a few atomic loads) and while one does (a 1 MiB block is held: every copy and
// memset is looked up in the shim's table of blocks with a tail). The best round of each is
// reported with the ratio. Run under the preloaded shim with tracking on
// (scripts/gpu-test-shim.sh); run without it, the two rounds are the same
// calls and the ratio is the noise. With --threads T, T threads make the calls
// at once, each into its own block on its own stream, and a round's time is
// the wall time of all of them divided by one thread's calls: what the check
// costs when threads contend for it.
//
//   copy_check [--calls N] [--rounds R] [--threads T]
//
// Build: g++ -std=c++20 -O2 -pthread -o copy_check copy_check.cpp -I$CUDA/include -lcuda
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

bool ok(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return true;
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  std::fprintf(stderr, "copy_check: %s: %s\n", what, name ? name : "?");
  return false;
}

/// ns per call of `calls` memsets into p, the stream synchronized at the end;
/// negative on a failure.
double round_ns(CUdeviceptr p, CUstream st, long calls) {
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < calls; ++i)
    if (!ok(cuMemsetD8Async(p + (i % 4096) * 16, static_cast<unsigned char>(i), 16, st),
            "cuMemsetD8Async"))
      return -1;
  if (!ok(cuStreamSynchronize(st), "cuStreamSynchronize")) return -1;
  const std::chrono::duration<double, std::nano> d = std::chrono::steady_clock::now() - t0;
  return d.count() / static_cast<double>(calls);
}

struct Lane {
  CUdeviceptr block = 0;
  CUstream stream = nullptr;
};

/// One round on every lane at once (a thread each, the context made current
/// in each): wall ns per call of one lane; negative on a failure.
double round_ns(CUcontext ctx, const std::vector<Lane>& lanes, long calls) {
  if (lanes.size() == 1) return round_ns(lanes[0].block, lanes[0].stream, calls);
  std::vector<int> failed(lanes.size(), 0);
  std::vector<std::thread> threads;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < lanes.size(); ++i)
    threads.emplace_back([&, i] {
      failed[i] = !ok(cuCtxSetCurrent(ctx), "cuCtxSetCurrent") ||
                  round_ns(lanes[i].block, lanes[i].stream, calls) < 0;
    });
  for (auto& t : threads) t.join();
  const std::chrono::duration<double, std::nano> d = std::chrono::steady_clock::now() - t0;
  for (int f : failed)
    if (f) return -1;
  return d.count() / static_cast<double>(calls);
}

}  // namespace

int main(int argc, char** argv) {
  long calls = 200000;
  int rounds = 9;
  int threads = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--calls") == 0) calls = std::atol(argv[i + 1]);
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--threads") == 0) threads = std::atoi(argv[i + 1]);
  }
  if (calls <= 0 || rounds <= 0 || threads <= 0 || threads > 256) {
    std::fprintf(stderr, "usage: copy_check [--calls N] [--rounds R] [--threads T (1-256)]\n");
    return 2;
  }
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (!ok(cuInit(0), "cuInit") || !ok(cuDeviceGet(&dev, 0), "cuDeviceGet") ||
      !ok(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain") ||
      !ok(cuCtxSetCurrent(ctx), "cuCtxSetCurrent"))
    return 1;
  std::vector<Lane> lanes(static_cast<size_t>(threads));
  for (Lane& l : lanes)
    if (!ok(cuStreamCreate(&l.stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate") ||
        !ok(cuMemAlloc(&l.block, 2u << 20), "cuMemAlloc"))
      return 1;
  if (round_ns(ctx, lanes, calls) < 0) return 1;  // warm-up
  double none = 1e30, tailed = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const double a = round_ns(ctx, lanes, calls);
    CUdeviceptr held = 0;
    if (a < 0 || !ok(cuMemAlloc(&held, 1u << 20), "cuMemAlloc")) return 1;
    const double b = round_ns(ctx, lanes, calls);
    if (b < 0 || !ok(cuMemFree(held), "cuMemFree")) return 1;
    none = std::min(none, a);
    tailed = std::min(tailed, b);
  }
  std::printf(
      "  cuMemsetD8Async  no tail %8.1f ns  a tail held %8.1f ns  added %+6.1f ns/call  ratio "
      "%.3f  (best of %d rounds of %ld, %d thread%s)\n",
      none, tailed, tailed - none, tailed / none, rounds, calls, threads, threads == 1 ? "" : "s");
  for (Lane& l : lanes) {
    cuMemFree(l.block);
    cuStreamDestroy(l.stream);
  }
  cuDevicePrimaryCtxRelease(dev);
  return 0;
}
