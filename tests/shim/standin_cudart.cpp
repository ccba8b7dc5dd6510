// A stand-in libcudart.so.13 exporting the runtime's driver-entry-point
// resolvers the way the CUDA 12/13 runtime implements them: through the
// driver's cuGetProcAddress, found with dlopen + dlsym on libcuda.so.1.
#include <dlfcn.h>

#define __CUDA_API_VERSION_INTERNAL
#include <cuda.h>
#include <cuda_runtime_api.h>

namespace {
using Gpa = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

Gpa driver_gpa(bool ptsz) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  return h ? reinterpret_cast<Gpa>(
                 dlsym(h, ptsz ? "cuGetProcAddress_v2_ptsz" : "cuGetProcAddress_v2"))
           : nullptr;
}

cudaError_t run(bool ptsz, const char* symbol, void** fn, unsigned int version,
                unsigned long long flags, cudaDriverEntryPointQueryResult* st) {
  Gpa gpa = driver_gpa(ptsz);
  if (!gpa) return cudaErrorInitializationError;
  CUdriverProcAddressQueryResult s = CU_GET_PROC_ADDRESS_SUCCESS;
  cuuint64_t f = 0;
  if (flags & cudaEnableLegacyStream) f |= CU_GET_PROC_ADDRESS_LEGACY_STREAM;
  if (flags & cudaEnablePerThreadDefaultStream) f |= CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  CUresult rc = gpa(symbol, fn, static_cast<int>(version), f, &s);
  if (st) *st = static_cast<cudaDriverEntryPointQueryResult>(s);
  if (rc == CUDA_SUCCESS) return cudaSuccess;
  return rc == CUDA_ERROR_NOT_SUPPORTED ? cudaErrorNotSupported : cudaErrorSymbolNotFound;
}
}  // namespace

#define EXPORT extern "C" __attribute__((visibility("default")))
EXPORT cudaError_t cudaGetDriverEntryPoint(const char* s, void** fn, unsigned long long flags,
                                           cudaDriverEntryPointQueryResult* st) {
  return run(false, s, fn, CUDA_VERSION, flags, st);
}
EXPORT cudaError_t cudaGetDriverEntryPoint_ptsz(const char* s, void** fn, unsigned long long flags,
                                                cudaDriverEntryPointQueryResult* st) {
  return run(true, s, fn, CUDA_VERSION, flags, st);
}
EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char* s, void** fn, unsigned int v,
                                                    unsigned long long flags,
                                                    cudaDriverEntryPointQueryResult* st) {
  return run(false, s, fn, v, flags, st);
}
EXPORT cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char* s, void** fn, unsigned int v,
                                                         unsigned long long flags,
                                                         cudaDriverEntryPointQueryResult* st) {
  return run(true, s, fn, v, flags, st);
}
