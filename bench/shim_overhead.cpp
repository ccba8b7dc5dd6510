// The shim's overhead, measured in one process: each driver function is called
// through two pointers, the real driver's (dlsym on the driver's handle) and
// the shim's wrapper (dlsym on the shim, dlopen'ed locally, never preloaded),
// in alternating rounds; the best round of each is reported with the ratio.
//
//   shim_overhead [--shim PATH] [--driver PATH] [--calls N] [--launches N] [--rounds R]
//
// Measures a cheap call (cuCtxGetCurrent, per call) and kernel-launch
// throughput (cuLaunchKernel of an empty kernel from embedded PTX, launches per
// second including the final cuStreamSynchronize). Exit 0 when both ran.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cuda.h>

namespace {

// An empty kernel, PTX loaded with cuModuleLoadData (JIT-compiled for the GPU).
const char kPtx[] =
    ".version 7.0\n"
    ".target sm_70\n"
    ".address_size 64\n"
    ".visible .entry cusnap_empty()\n"
    "{\n"
    "  ret;\n"
    "}\n";

struct Api {
  decltype(&cuInit) init;
  decltype(&cuDeviceGet) device_get;
  decltype(&cuDevicePrimaryCtxRetain) primary_retain;
  decltype(&cuCtxSetCurrent) set_current;
  decltype(&cuCtxGetCurrent) get_current;
  decltype(&cuModuleLoadData) module_load;
  decltype(&cuModuleGetFunction) get_function;
  decltype(&cuStreamCreate) stream_create;
  decltype(&cuStreamSynchronize) stream_sync;
  decltype(&cuLaunchKernel) launch;
};

template <class T>
bool load(void* h, const char* name, T& out) {
  out = reinterpret_cast<T>(dlsym(h, name));
  if (!out) std::fprintf(stderr, "shim_overhead: %s missing: %s\n", name, dlerror());
  return out != nullptr;
}

bool load_api(void* h, Api& a) {
  return load(h, "cuInit", a.init) & load(h, "cuDeviceGet", a.device_get) &
         load(h, "cuDevicePrimaryCtxRetain", a.primary_retain) &
         load(h, "cuCtxSetCurrent", a.set_current) & load(h, "cuCtxGetCurrent", a.get_current) &
         load(h, "cuModuleLoadData", a.module_load) &
         load(h, "cuModuleGetFunction", a.get_function) &
         load(h, "cuStreamCreate", a.stream_create) &
         load(h, "cuStreamSynchronize", a.stream_sync) & load(h, "cuLaunchKernel", a.launch);
}

double now_ns() {
  return std::chrono::duration<double, std::nano>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string default_shim(const char* argv0) {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  std::string dir = n > 0 ? std::string(exe, static_cast<size_t>(n)) : std::string(argv0);
  dir = dir.substr(0, dir.rfind('/'));
  return dir + "/../lib/libcusnap_shim.so";
}

#define OK(call)                                                          \
  do {                                                                    \
    CUresult rc_ = (call);                                                \
    if (rc_ != CUDA_SUCCESS) {                                            \
      std::fprintf(stderr, "shim_overhead: %s failed: %d\n", #call, rc_); \
      return 1;                                                           \
    }                                                                     \
  } while (0)

}  // namespace

int main(int argc, char** argv) {
  std::string shim_path = default_shim(argv[0]);
  std::string driver_path = "libcuda.so.1";
  long calls = 2000000, launches = 100000;
  int rounds = 11;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--shim")
      shim_path = argv[i + 1];
    else if (k == "--driver")
      driver_path = argv[i + 1];
    else if (k == "--calls")
      calls = std::atol(argv[i + 1]);
    else if (k == "--launches")
      launches = std::atol(argv[i + 1]);
    else if (k == "--rounds")
      rounds = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr,
                   "usage: shim_overhead [--shim PATH] [--driver PATH] [--calls N] [--launches N] "
                   "[--rounds R]\n");
      return 2;
    }
  }
  if (getenv("LD_PRELOAD") && std::strstr(getenv("LD_PRELOAD"), "cusnap_shim")) {
    std::fprintf(stderr, "shim_overhead: run it without LD_PRELOAD; it loads the shim itself\n");
    return 2;
  }
  setenv("CUSNAP_REAL_LIBCUDA", driver_path.c_str(), 1);
  void* drv = dlopen(driver_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!drv) {
    std::fprintf(stderr, "shim_overhead: cannot load the driver %s: %s\n", driver_path.c_str(),
                 dlerror());
    return 1;
  }
  void* shim = dlopen(shim_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!shim) {
    std::fprintf(stderr, "shim_overhead: cannot load the shim %s: %s\n", shim_path.c_str(),
                 dlerror());
    return 1;
  }
  Api real{}, wrapped{};
  if (!load_api(drv, real) || !load_api(shim, wrapped)) return 1;
  if (reinterpret_cast<void*>(real.get_current) == reinterpret_cast<void*>(wrapped.get_current)) {
    std::fprintf(stderr, "shim_overhead: the shim's pointer is the driver's\n");
    return 1;
  }

  OK(wrapped.init(0));
  CUdevice dev;
  CUcontext ctx;
  OK(wrapped.device_get(&dev, 0));
  OK(wrapped.primary_retain(&ctx, dev));
  OK(wrapped.set_current(ctx));
  CUmodule mod;
  CUfunction fn;
  CUstream stream;
  OK(wrapped.module_load(&mod, kPtx));
  OK(wrapped.get_function(&fn, mod, "cusnap_empty"));
  OK(wrapped.stream_create(&stream, CU_STREAM_NON_BLOCKING));

  // Interleaved blocks: within a round, blocks through the driver and through
  // the shim alternate (which goes first alternates too), so load from other
  // processes hits both alike; each round's totals give one ratio, and the
  // best round (least disturbed) and the median are reported.
  const Api* apis[2] = {&real, &wrapped};
  constexpr int kBlocks = 20;
  const long call_block = std::max(1L, calls / kBlocks),
             launch_block = std::max(1L, launches / kBlocks);
  std::vector<double> call_ns[2], launch_ns[2];
  for (int r = 0; r < rounds; ++r) {
    double call_t[2] = {0, 0}, launch_t[2] = {0, 0};
    for (int b = 0; b < 2 * kBlocks; ++b) {
      const int which = (b + r) % 2;
      const Api& a = *apis[which];
      CUcontext cur;
      double t0 = now_ns();
      for (long i = 0; i < call_block; ++i) a.get_current(&cur);
      call_t[which] += now_ns() - t0;
      t0 = now_ns();
      for (long i = 0; i < launch_block; ++i)
        OK(a.launch(fn, 1, 1, 1, 1, 1, 1, 0, stream, nullptr, nullptr));
      OK(a.stream_sync(stream));
      launch_t[which] += now_ns() - t0;
    }
    for (int w = 0; w < 2; ++w) {
      call_ns[w].push_back(call_t[w] / static_cast<double>(call_block * kBlocks));
      launch_ns[w].push_back(launch_t[w] / static_cast<double>(launch_block * kBlocks));
    }
  }
  auto best = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double c0 = best(call_ns[0]), c1 = best(call_ns[1]);
  const double l0 = best(launch_ns[0]), l1 = best(launch_ns[1]);
  const double cm0 = median(call_ns[0]), cm1 = median(call_ns[1]);
  const double lm0 = median(launch_ns[0]), lm1 = median(launch_ns[1]);
  std::printf("shim_overhead: driver %s, %d rounds of %ld calls and %ld launches each way\n",
              driver_path.c_str(), rounds, call_block * kBlocks, launch_block * kBlocks);
  std::printf(
      "  cuCtxGetCurrent  direct %8.2f ns  shim %8.2f ns  added %+7.2f ns/call  ratio %.3f"
      "  (median: %+.2f ns, %.3f)\n",
      c0, c1, c1 - c0, c1 / c0, cm1 - cm0, cm1 / cm0);
  std::printf(
      "  cuLaunchKernel   direct %8.0f/s  shim %8.0f/s  added %+7.2f ns/launch  throughput %+.2f%%"
      "  (median: %+.2f%%)\n",
      1e9 / l0, 1e9 / l1, l1 - l0, (l0 / l1 - 1) * 100, (lm0 / lm1 - 1) * 100);
  std::printf(
      "  targets: < 20 ns added per call: %s; launch throughput within 2%% (meaningful on a GPU): "
      "%s\n",
      c1 - c0 < 20 ? "met" : "NOT met", (l1 / l0 - 1) * 100 < 2 ? "met" : "NOT met");
  return 0;
}
