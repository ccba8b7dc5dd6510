// A stand-in libcuda.so.1 for the shim's tests: every entry point of the list
// records its own name (standin_last_called) and returns CUDA_SUCCESS, so a test
// can tell that a wrapper reached exactly the function it stands for. Its
// cuGetProcAddress answers with internal (unexported) addresses, as the real
// driver may, and resolves "cusnapStandinUnknown" and "cuGLGetDevices" (which
// the real driver exports, from cudaGL.h: outside the generated list) to a
// function that is in no table, to exercise the shim's fail-closed path.
#include <cstring>

#include "shim/entries.h"

#define CUSNAP_CU_PROC(...)

namespace {
thread_local const char* t_last = "";
CUresult unknown_function() {
  return CUDA_SUCCESS;
}
}  // namespace

extern "C" __attribute__((visibility("default"))) const char* standin_last_called() {
  return t_last;
}
extern "C" __attribute__((visibility("default"))) void standin_reset() {
  t_last = "";
}

namespace {

CUresult resolve(const char* symbol, void** pfn, int version, cuuint64_t flags, bool ptsz,
                 CUdriverProcAddressQueryResult* status);

template <cusnap::shim::Entry E, class... A>
CUresult act(A...) {
  return CUDA_SUCCESS;
}
template <>
CUresult act<cusnap::shim::Entry::cuGetProcAddress>(const char* s, void** p, int v, cuuint64_t f) {
  return resolve(s, p, v, f, false, nullptr);
}
template <>
CUresult act<cusnap::shim::Entry::cuGetProcAddress_v2>(const char* s, void** p, int v, cuuint64_t f,
                                                       CUdriverProcAddressQueryResult* st) {
  return resolve(s, p, v, f, false, st);
}
template <>
CUresult act<cusnap::shim::Entry::cuGetProcAddress_v2_ptsz>(const char* s, void** p, int v,
                                                            cuuint64_t f,
                                                            CUdriverProcAddressQueryResult* st) {
  return resolve(s, p, v, f, true, st);
}
template <>
CUresult act<cusnap::shim::Entry::cuDriverGetVersion>(int* v) {
  if (v) *v = CUDA_VERSION;
  return CUDA_SUCCESS;
}
}  // namespace

#define CUSNAP_CU_ENTRY(name, params, args)                                            \
  extern "C" __attribute__((visibility("hidden"))) CUresult CUDAAPI si_##name params { \
    t_last = #name;                                                                    \
    return act<cusnap::shim::Entry::name> args;                                        \
  }                                                                                    \
  extern "C" __attribute__((visibility("default"), alias("si_" #name)))                \
  CUresult CUDAAPI name params;
#include "cudaapi/entry_points.inc"
#include "shim/extra_entries.inc"
#undef CUSNAP_CU_ENTRY

namespace {
void* const kImpl[] = {
#define CUSNAP_CU_ENTRY(name, params, args) reinterpret_cast<void*>(&si_##name),
#include "cudaapi/entry_points.inc"
#include "shim/extra_entries.inc"
#undef CUSNAP_CU_ENTRY
};

CUresult resolve(const char* symbol, void** pfn, int version, cuuint64_t flags, bool ptsz,
                 CUdriverProcAddressQueryResult* status) {
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  if (std::strcmp(symbol, "cusnapStandinUnknown") == 0 ||
      std::strcmp(symbol, "cuGLGetDevices") == 0) {
    *pfn = reinterpret_cast<void*>(&unknown_function);
    if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
  }
  bool pt = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ||
            (ptsz && !(flags & CU_GET_PROC_ADDRESS_LEGACY_STREAM));
  cusnap::shim::ProcAnswer a;
  auto r = cusnap::shim::lookup_proc(symbol, version, pt, &a);
  if (r != cusnap::shim::ProcLookup::kFound) {
    *pfn = nullptr;
    if (status)
      *status = r == cusnap::shim::ProcLookup::kNotFound
                    ? CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
                    : CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    return CUDA_ERROR_NOT_FOUND;
  }
  *pfn = kImpl[a.index];
  if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}
}  // namespace
