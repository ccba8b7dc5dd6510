// A real CUDA program for the GPU machine (scripts/gpu-test-shim.sh): runtime
// API (cudaMalloc, <<<>>> launches, cudaMemcpy, a CUDA graph, streams) and
// driver API (cuCtxGetCurrent, cuMemAlloc, cuMemcpy, cuModuleLoadData of PTX,
// cuLaunchKernel, cuGetProcAddress, cudaGetDriverEntryPointByVersion) in one
// process. Prints results on stdout, identical with and without the shim;
// prints what it saw of the shim on stderr. Never touches multicast.
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "shim/cusnap_shim.h"

#define RT(call)                                                                                 \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)
#define DRV(call)                                                            \
  do {                                                                       \
    CUresult r_ = (call);                                                    \
    if (r_ != CUDA_SUCCESS) {                                                \
      std::fprintf(stderr, "%s:%d %s: %d\n", __FILE__, __LINE__, #call, r_); \
      return 1;                                                              \
    }                                                                        \
  } while (0)

__global__ void saxpy(int n, float a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

__global__ void scale(int n, float a, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] *= a;
}

static const char kPtx[] =
    ".version 7.0\n.target sm_70\n.address_size 64\n"
    ".visible .entry add_one(.param .u64 p, .param .u32 n)\n{\n"
    "  .reg .pred %p<2>; .reg .b32 %r<6>; .reg .b64 %rd<5>; .reg .f32 %f<3>;\n"
    "  ld.param.u64 %rd1, [p]; ld.param.u32 %r2, [n];\n"
    "  mov.u32 %r3, %ctaid.x; mov.u32 %r4, %ntid.x; mov.u32 %r5, %tid.x;\n"
    "  mad.lo.s32 %r1, %r3, %r4, %r5;\n"
    "  setp.ge.s32 %p1, %r1, %r2; @%p1 bra DONE;\n"
    "  cvta.to.global.u64 %rd2, %rd1; mul.wide.s32 %rd3, %r1, 4; add.s64 %rd4, %rd2, %rd3;\n"
    "  ld.global.f32 %f1, [%rd4]; add.f32 %f2, %f1, 0f3F800000; st.global.f32 [%rd4], %f2;\n"
    "DONE:\n  ret;\n}\n";

static uint64_t fnv(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i)
    h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ull;
  return h;
}

static const char* object_of(const void* fn) {
  Dl_info di{};
  if (!fn || !dladdr(fn, &di) || !di.dli_fname) return "?";
  const char* s = std::strrchr(di.dli_fname, '/');
  return s ? s + 1 : di.dli_fname;
}

int main() {
  const int n = 1 << 20;
  std::vector<float> hx(n), hy(n), out(n);
  for (int i = 0; i < n; ++i) {
    hx[i] = static_cast<float>(i % 1000) * 0.5f;
    hy[i] = static_cast<float>(i % 77);
  }
  // Runtime API.
  float *dx, *dy;
  RT(cudaMalloc(&dx, n * sizeof(float)));
  RT(cudaMalloc(&dy, n * sizeof(float)));
  RT(cudaMemcpy(dx, hx.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  RT(cudaMemcpy(dy, hy.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  saxpy<<<(n + 255) / 256, 256>>>(n, 2.0f, dx, dy);
  RT(cudaGetLastError());
  RT(cudaDeviceSynchronize());
  RT(cudaMemcpy(out.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
  std::printf("runtime saxpy: %016llx\n",
              static_cast<unsigned long long>(fnv(out.data(), n * sizeof(float))));

  // A CUDA graph: capture scale + saxpy on a stream, replay 3 times.
  cudaStream_t s;
  RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  RT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  scale<<<(n + 255) / 256, 256, 0, s>>>(n, 0.5f, dy);
  saxpy<<<(n + 255) / 256, 256, 0, s>>>(n, 1.0f, dx, dy);
  RT(cudaStreamEndCapture(s, &g));
  RT(cudaGraphInstantiate(&ge, g, 0));
  for (int k = 0; k < 3; ++k) RT(cudaGraphLaunch(ge, s));
  RT(cudaStreamSynchronize(s));
  RT(cudaMemcpy(out.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
  std::printf("graph replay: %016llx\n",
              static_cast<unsigned long long>(fnv(out.data(), n * sizeof(float))));

  // Driver API on the runtime's primary context.
  CUcontext ctx = nullptr;
  DRV(cuCtxGetCurrent(&ctx));
  std::printf("driver context current: %s\n", ctx ? "yes" : "no");
  CUdeviceptr dp;
  DRV(cuMemAlloc(&dp, n * sizeof(float)));
  DRV(cuMemcpyHtoD(dp, hy.data(), n * sizeof(float)));
  CUmodule mod;
  CUfunction add_one;
  DRV(cuModuleLoadData(&mod, kPtx));
  DRV(cuModuleGetFunction(&add_one, mod, "add_one"));
  int nn = n;
  void* args[] = {&dp, &nn};
  DRV(cuLaunchKernel(add_one, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
  // The runtime kernel through the driver launch API.
  cudaFunction_t rf;
  RT(cudaGetFuncBySymbol(&rf, reinterpret_cast<const void*>(&scale)));
  float three = 3.0f;
  void* args2[] = {&nn, &three, &dp};
  DRV(cuLaunchKernel(reinterpret_cast<CUfunction>(rf), (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr,
                     args2, nullptr));
  DRV(cuCtxSynchronize());
  DRV(cuMemcpyDtoH(out.data(), dp, n * sizeof(float)));
  std::printf("driver add_one+scale: %016llx\n",
              static_cast<unsigned long long>(fnv(out.data(), n * sizeof(float))));

  // Resolvers: the pointers they return work.
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult st;
  RT(cudaGetDriverEntryPointByVersion("cuMemsetD32", &fn, 12000, cudaEnableDefault, &st));
  DRV(reinterpret_cast<decltype(&cuMemsetD32)>(fn)(dp, 0x3f800000u, n));
  void* gfn = nullptr;
  CUdriverProcAddressQueryResult gst;
  DRV(cuGetProcAddress("cuMemcpyDtoH", &gfn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &gst));
  DRV(reinterpret_cast<decltype(&cuMemcpyDtoH)>(gfn)(out.data(), dp, n * sizeof(float)));
  std::printf("resolved memset+copy: %016llx\n",
              static_cast<unsigned long long>(fnv(out.data(), n * sizeof(float))));

  // What the shim looks like from here (stderr: differs with and without it).
  auto* info = static_cast<const cusnap_shim_info*>(dlsym(RTLD_DEFAULT, "cusnap_shim_build_info"));
  std::fprintf(stderr,
               "shim: %s; cudaGetDriverEntryPointByVersion -> %s; cuGetProcAddress -> %s; dlsym "
               "cuMemAlloc_v2 -> %s\n",
               info ? info->version : "absent", object_of(fn), object_of(gfn),
               object_of(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2")));
  if (info) {
    // The gate holds a real runtime call and lets it go.
    const auto* ctl = info->control;
    if (ctl->gate_close(5000) != 0) {
      std::fprintf(stderr, "gate: close failed\n");
      return 1;
    }
    std::atomic<bool> done{false};
    std::thread t([&] {
      cudaMemcpy(out.data(), dy, sizeof(float), cudaMemcpyDeviceToHost);
      done = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    uint64_t waiting = 0;
    ctl->gate_state(nullptr, nullptr, &waiting);
    const bool held = !done && waiting >= 1;
    ctl->gate_open();
    t.join();
    std::fprintf(stderr, "gate: a cudaMemcpy %s while closed and %s after opening\n",
                 held ? "waited" : "DID NOT WAIT", done ? "completed" : "DID NOT COMPLETE");
    if (!held || !done) return 1;
  }

  DRV(cuModuleUnload(mod));
  DRV(cuMemFree(dp));
  RT(cudaGraphExecDestroy(ge));
  RT(cudaGraphDestroy(g));
  RT(cudaStreamDestroy(s));
  RT(cudaFree(dx));
  RT(cudaFree(dy));
  std::printf("ok\n");
  return 0;
}
