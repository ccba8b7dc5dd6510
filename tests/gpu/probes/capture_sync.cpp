// capture_sync.cpp: what the real driver does with synchronous, allocating and
// other-stream calls made while a stream captures, in each capture mode; the
// simulated driver (tests/fakecuda/capture.cpp) mirrors it. On a GPU machine:
//   nvcc capture_sync.cpp -lcuda -o probe && ./probe
// Output of 2026-12-01 on an H200: docs/gpu-runs/capture-sync-h200.log.
#include <cuda.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
static const char* nm(CUresult r) { const char* s = "?"; cuGetErrorName(r, &s); return s; }
static const char* st(CUstreamCaptureStatus s) {
  return s == CU_STREAM_CAPTURE_STATUS_NONE ? "NONE" : s == CU_STREAM_CAPTURE_STATUS_ACTIVE ? "ACTIVE" : "INVALIDATED";
}
static CUfunction k;
static void status(const char* what, CUstream s) {
  CUstreamCaptureStatus c; CUresult r = cuStreamIsCapturing(s, &c);
  printf("    %-28s %s %s\n", what, nm(r), st(c));
}
typedef CUresult (*Op)(CUstream other, CUdeviceptr buf);
static CUresult op_ctx_sync(CUstream, CUdeviceptr) { return cuCtxSynchronize(); }
static CUresult op_alloc(CUstream, CUdeviceptr) { CUdeviceptr p; CUresult r = cuMemAlloc(&p, 1 << 20); if (!r) cuMemFree(p); return r; }
static CUresult op_free(CUstream, CUdeviceptr b) { return cuMemFree(b); }
static CUresult op_htod(CUstream, CUdeviceptr b) { int x = 1; return cuMemcpyHtoD(b, &x, sizeof x); }
static CUresult op_other_sync(CUstream o, CUdeviceptr) { return cuStreamSynchronize(o); }
static CUresult op_other_query(CUstream o, CUdeviceptr) { return cuStreamQuery(o); }
static CUresult op_legacy_sync(CUstream, CUdeviceptr) { return cuStreamSynchronize(CU_STREAM_LEGACY); }
static CUresult op_memset_other(CUstream o, CUdeviceptr b) { return cuMemsetD8Async(b, 0, 16, o); }
static CUresult op_vmm(CUstream, CUdeviceptr) {
  CUmemAllocationProp p{}; p.type = CU_MEM_ALLOCATION_TYPE_PINNED; p.location.type = CU_MEM_LOCATION_TYPE_DEVICE; p.location.id = 0;
  size_t g = 0; cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  CUmemGenericAllocationHandle h; CUresult r = cuMemCreate(&h, g, &p, 0); if (!r) cuMemRelease(h); return r;
}
static CUresult op_malloc_host(CUstream, CUdeviceptr) { void* p; CUresult r = cuMemAllocHost(&p, 4096); if (!r) cuMemFreeHost(p); return r; }
struct Case { const char* name; Op op; };
int main() {
  CUdevice d; CUcontext c; CUmodule m;
  cuInit(0); cuDeviceGet(&d, 0); cuDevicePrimaryCtxRetain(&c, d); cuCtxSetCurrent(c);
  const char* ptx = ".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry k() { ret; }\n";
  cuModuleLoadData(&m, ptx); cuModuleGetFunction(&k, m, "k");
  int v; cuDriverGetVersion(&v); printf("driver API %d\n", v);
  Case cases[] = {{"cuCtxSynchronize", op_ctx_sync}, {"cuMemAlloc+Free", op_alloc}, {"cuMemFree (made before)", op_free},
                  {"cuMemcpyHtoD (sync)", op_htod}, {"cuStreamSynchronize(other)", op_other_sync},
                  {"cuStreamQuery(other)", op_other_query}, {"cuStreamSynchronize(LEGACY)", op_legacy_sync},
                  {"cuMemsetD8Async(other)", op_memset_other}, {"cuMemCreate+Release", op_vmm},
                  {"cuMemAllocHost+FreeHost", op_malloc_host}};
  CUstreamCaptureMode modes[3] = {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, CU_STREAM_CAPTURE_MODE_RELAXED};
  const char* mn[3] = {"GLOBAL", "THREAD_LOCAL", "RELAXED"};
  for (auto& cs : cases)
    for (int mi = 0; mi < 3; ++mi) {
      CUstream A, O; cuStreamCreate(&A, CU_STREAM_NON_BLOCKING); cuStreamCreate(&O, CU_STREAM_NON_BLOCKING);
      CUdeviceptr buf; cuMemAlloc(&buf, 4096);
      printf("%s in %s capture:\n", cs.name, mn[mi]);
      CUresult r = cuStreamBeginCapture(A, modes[mi]);
      cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, A, nullptr, nullptr);
      r = cs.op(O, buf);
      printf("    %-28s %d %s\n", "call", (int)r, nm(r));
      status("capture after", A);
      CUgraph g = nullptr; r = cuStreamEndCapture(A, &g);
      printf("    %-28s %d %s graph %s\n", "end", (int)r, nm(r), g ? "yes" : "NULL");
      if (g) cuGraphDestroy(g);
      cuCtxSynchronize();
      if (cs.op != op_free) cuMemFree(buf);
      cuStreamDestroy(A); cuStreamDestroy(O);
    }
  puts("done");
  return 0;
}
