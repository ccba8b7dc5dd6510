// cusnap-collective-multi: one process that drives a collective on two GPUs
// every step, like single-process multi-GPU NCCL (torch.nn.DataParallel's
// broadcast and reduce), for the simulated driver only.
//
//   cusnap-collective-multi [--steps N] [--gap-ms G] [--interval-ms T]
//                           [--print-every K] [--mib M]
//
// Needs two devices. GPU g (0, 1) has a context, a stream and an allocation
// of its own (cuMemCreate on g, mapped with read-write access for both GPUs):
// g's flag (8 bytes at offset 0) and two data slots of M MiB (default 1) from
// 64 KiB.
//
// Step s = 1, 2, ...: for g = 0, then 1, in g's context, fill slot s%2 of g's
// allocation with value(g, s) (cuMemsetD32) and launch
// "ncclDevKernel_Handshake_Pair" (mangled; g's flag, the other GPU's flag, s)
// on g's stream, sleeping G ms (default 0) between the two launches; then
// synchronize both streams, read both slots s%2 back (cuMemcpyDtoH) and check
// every word, and that each flag reads s. The simulated driver's handshake
// kernel stores s into its own flag and completes when the other flag
// reaches s: GPU 0's kernel of step s completes only once GPU 1's is
// launched, as a collective's part on one GPU waits for the others. A
// checkpoint whose cut fell between the two launches of a step, holding the
// second, would leave GPU 0's kernel spinning for ever.
//
// Prints "ready pid P devices 2", then "count S ok" (S: the step just
// verified) at step 1, every K steps (default 100) and at the last step,
// sleeping T ms between steps (default 0), until N steps (0, the default: for
// ever), then "done". Exit status: 2 a driver call failed (also on the real
// driver: its module image is a placeholder), 3 a byte was wrong, 64 bad
// usage.
#include <unistd.h>

#include <string>
#include <vector>

#include "share_util.h"

using namespace workload::share;

namespace {

constexpr size_t kSlotsOffset = 64 << 10;
constexpr const char* kKernel = "_Z28ncclDevKernel_Handshake_Pairmmm";
constexpr const char* kWho = "cusnap-collective-multi";
constexpr int kGpus = 2;

struct Options {
  long steps = 0;
  long gap_ms = 0;
  long interval_ms = 0;
  long print_every = 100;
  size_t mib = 1;
};

uint32_t value(int gpu, long step) {
  return uint32_t(step) * 2654435761u + uint32_t(gpu) * 0x01000193u + 0x5eed;
}

struct Gpu {
  CUcontext ctx = nullptr;
  CUfunction fn = nullptr;
  CUstream stream = nullptr;
  CUdeviceptr mem = 0;
};

/// GPU g's context, kernel, stream and allocation of `size` bytes, mapped for
/// both GPUs, its flag at 0.
Gpu set_up(int g, size_t size) {
  Gpu out;
  WL_CHECK(cuDevicePrimaryCtxRetain(&out.ctx, g), kWho);
  WL_CHECK(cuCtxSetCurrent(out.ctx), kWho);
  out.fn = load_fake_kernel(kKernel, kWho);
  WL_CHECK(cuStreamCreate(&out.stream, CU_STREAM_NON_BLOCKING), kWho);
  CUmemAllocationProp prop = posix_fd_prop(g);
  CUmemGenericAllocationHandle h;
  WL_CHECK(cuMemCreate(&h, size, &prop, 0), kWho);
  out.mem = map_for(h, size, {0, 1}, kWho);
  WL_CHECK(cuMemsetD8(out.mem, 0, kSlotsOffset), kWho);
  return out;
}

int run(const Options& o) {
  WL_CHECK(cuInit(0), kWho);
  int count = 0;
  WL_CHECK(cuDeviceGetCount(&count), kWho);
  if (count < kGpus) {
    std::fprintf(stderr, "%s: needs %d GPUs, the driver has %d (FAKECUDA_DEVICES)\n", kWho, kGpus,
                 count);
    return 2;
  }
  CUmemAllocationProp prop = posix_fd_prop(0);
  size_t gran = 0;
  WL_CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), kWho);
  const size_t slot = std::max<size_t>(o.mib << 20, 4096);
  const size_t size = (kSlotsOffset + 2 * slot + gran - 1) / gran * gran;
  Gpu gpu[kGpus] = {set_up(0, size), set_up(1, size)};
  std::printf("ready pid %d devices %d\n", int(getpid()), kGpus);

  std::vector<uint32_t> words(slot / 4);
  for (long step = 1; o.steps == 0 || step <= o.steps; ++step) {
    const size_t off = kSlotsOffset + size_t(step % 2) * slot;
    for (int g = 0; g < kGpus; ++g) {
      if (g > 0 && o.gap_ms > 0) usleep(useconds_t(o.gap_ms * 1000));
      WL_CHECK(cuCtxSetCurrent(gpu[g].ctx), kWho);
      WL_CHECK(cuMemsetD32(gpu[g].mem + off, value(g, step), slot / 4), kWho);
      CUdeviceptr mine = gpu[g].mem, other = gpu[1 - g].mem;
      uint64_t s = uint64_t(step);
      void* params[] = {&mine, &other, &s};
      WL_CHECK(cuLaunchKernel(gpu[g].fn, 1, 1, 1, 32, 1, 1, 0, gpu[g].stream, params, nullptr),
               kWho);
    }
    for (int g = 0; g < kGpus; ++g) {
      WL_CHECK(cuCtxSetCurrent(gpu[g].ctx), kWho);
      WL_CHECK(cuStreamSynchronize(gpu[g].stream), kWho);
    }
    for (int g = 0; g < kGpus; ++g) {
      WL_CHECK(cuCtxSetCurrent(gpu[g].ctx), kWho);
      uint64_t flag = 0;
      WL_CHECK(cuMemcpyDtoH(&flag, gpu[g].mem, sizeof flag), kWho);
      WL_CHECK(cuMemcpyDtoH(words.data(), gpu[g].mem + off, slot), kWho);
      const uint32_t want = value(g, step);
      for (size_t k = 0; k < words.size(); ++k)
        if (words[k] != want || flag != uint64_t(step)) {
          std::fprintf(stderr,
                       "%s: pattern mismatch at step %ld: GPU %d's flag reads %llu, word %zu of "
                       "its slot %ld reads 0x%08x, expected 0x%08x\n",
                       kWho, step, g, (unsigned long long)flag, k, step % 2, words[k], want);
          return 3;
        }
    }
    if (step % o.print_every == 0 || (o.steps != 0 && step == o.steps) || step == 1)
      std::printf("count %ld ok\n", step);
    if (o.interval_ms > 0) usleep(useconds_t(o.interval_ms * 1000));
  }
  std::printf("done\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args(argc, argv, kWho, {},
            {"--steps", "--gap-ms", "--interval-ms", "--print-every", "--mib"});
  Options o;
  o.steps = args.num("--steps", 0);
  o.gap_ms = args.num("--gap-ms", 0);
  o.interval_ms = args.num("--interval-ms", 0);
  o.print_every = args.num("--print-every", 100);
  const long mib = args.num("--mib", 1);
  if (o.steps < 0 || o.gap_ms < 0 || o.interval_ms < 0 || o.print_every < 1 || mib < 0) {
    std::fprintf(stderr,
                 "%s: --steps, --gap-ms, --interval-ms, --mib must be >= 0, "
                 "--print-every >= 1\n",
                 kWho);
    return 64;
  }
  o.mib = size_t(mib);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  return run(o);
}
