// Every resolver path returns the shim's wrappers:
//  - cuGetProcAddress, _v2, _v2_ptsz: the Hook specializations call
//    get_proc_address(), which asks the real driver and answers with a wrapper;
//  - cudaGetDriverEntryPoint, ...ByVersion and their _ptsz forms (runtime API):
//    exported here, forwarded to the runtime that follows the shim, and the
//    pointer it returns is mapped to a wrapper.
// What cannot be mapped to a wrapper fails closed: no pointer, CUDA_ERROR_NOT_SUPPORTED.
#include <cuda_runtime_api.h>

#include <cstring>
#include <type_traits>

#include "shim/elf_lookup.h"
#include "shim/hooks.h"
#include "shim/real_driver.h"
#include "shim/track.h"

namespace cusnap::shim {

namespace {

bool per_thread_stream(bool ptsz_variant, cuuint64_t flags) {
  if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) return true;
  if (flags & CU_GET_PROC_ADDRESS_LEGACY_STREAM) return false;
  // CU_GET_PROC_ADDRESS_DEFAULT: legacy, except through the _ptsz entry point
  // (what code built with per-thread default streams calls), as cuda.h says.
  return ptsz_variant;
}

/// The wrapper to hand out for `symbol`, given the real driver's answer `real`.
void* choose_wrapper(const char* symbol, int cuda_version, bool per_thread, void* real) {
  ProcAnswer a;
  // The table decides for versions it is complete for, provided the driver
  // exports the entry it names (the driver said the symbol exists).
  if (lookup_proc(symbol, cuda_version, per_thread, &a) == ProcLookup::kFound &&
      cuda_version <= a.authoritative && real_entry(a.index) != nullptr)
    return wrapper_of(a.index);
  // Otherwise the driver's answer decides, when it is an entry point we know.
  size_t i;
  if (entry_of_address(real, &i) && real_entry(i) != nullptr) return wrapper_of(i);
  return nullptr;
}

}  // namespace

CUresult get_proc_address(GetProcAddressV2 real_v2, GetProcAddressV1 real_v1, bool ptsz,
                          const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                          CUdriverProcAddressQueryResult* status) noexcept {
  track::note_activity();  // a forked child's first CUDA activity may be a resolution
  // What the caller's outputs hold, so that a failing driver leaves them as
  // it would without the shim (untouched); copied as bytes: the caller's
  // status may hold any value, or none yet.
  void* const before = pfn ? *pfn : nullptr;
  void* got = before;
  CUdriverProcAddressQueryResult st;
  if (status) std::memcpy(&st, status, sizeof st);
  CUresult rc =
      real_v2 ? real_v2(symbol, pfn ? &got : nullptr, cuda_version, flags, status ? &st : nullptr)
              : real_v1(symbol, pfn ? &got : nullptr, cuda_version, flags);
  if (status && !real_v2 && rc == CUDA_SUCCESS) st = CU_GET_PROC_ADDRESS_SUCCESS;  // v1 has none
  if (status) std::memcpy(status, &st, sizeof st);
  if (!pfn) return rc;
  if (rc != CUDA_SUCCESS || got == nullptr) {
    // As the driver left it, but never an address the shim did not map.
    *pfn = got == before ? before : nullptr;
    return rc;
  }
  void* w = choose_wrapper(symbol, cuda_version, per_thread_stream(ptsz, flags), got);
  if (!w) {
    debug_log("cuGetProcAddress: no wrapper for what the driver returned; failing closed", symbol);
    *pfn = nullptr;
    if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  *pfn = w;
  return CUDA_SUCCESS;
}

namespace {

char g_anchor;

/// Maps what the runtime's resolver returned to a wrapper; fails closed.
cudaError_t map_runtime_answer(cudaError_t rc, const char* symbol, void** funcPtr,
                               cudaDriverEntryPointQueryResult* status) {
  if (rc != cudaSuccess || !funcPtr || !*funcPtr) return rc;
  size_t i;
  if (entry_of_address(*funcPtr, &i) && real_entry(i) != nullptr) {
    *funcPtr = wrapper_of(i);
    return rc;
  }
  debug_log("cudaGetDriverEntryPoint: no wrapper for what the runtime returned; failing closed",
            symbol);
  *funcPtr = nullptr;
  if (status) *status = cudaDriverEntryPointSymbolNotFound;
  return cudaErrorNotSupported;
}

/// The runtime's own function: past the shim (preloaded), else from the start.
template <class Fn>
Fn next_runtime(const char* name) {
  void* p = elf_find_next(&g_anchor, name, nullptr);
  if (!p) p = elf_find_next(nullptr, name, nullptr);
  return reinterpret_cast<Fn>(p);
}

using EntryPointFn = cudaError_t (*)(const char*, void**, unsigned long long,
                                     cudaDriverEntryPointQueryResult*);
using ByVersionFn = cudaError_t (*)(const char*, void**, unsigned int, unsigned long long,
                                    cudaDriverEntryPointQueryResult*);

cudaError_t entry_point(const char* which, const char* symbol, void** funcPtr,
                        unsigned long long flags, cudaDriverEntryPointQueryResult* status) {
  auto real = next_runtime<EntryPointFn>(which);
  if (!real) {
    if (funcPtr) *funcPtr = nullptr;
    return cudaErrorNotSupported;
  }
  return map_runtime_answer(real(symbol, funcPtr, flags, status), symbol, funcPtr, status);
}

cudaError_t by_version(const char* which, const char* symbol, void** funcPtr,
                       unsigned int cudaVersion, unsigned long long flags,
                       cudaDriverEntryPointQueryResult* status) {
  auto real = next_runtime<ByVersionFn>(which);
  if (!real) {
    if (funcPtr) *funcPtr = nullptr;
    return cudaErrorNotSupported;
  }
  return map_runtime_answer(real(symbol, funcPtr, cudaVersion, flags, status), symbol, funcPtr,
                            status);
}

}  // namespace
}  // namespace cusnap::shim

// The runtime's entry points, as libcudart exports them (cuda_runtime_api.h
// declares the first two; the _ptsz forms are what code built with per-thread
// default streams calls).
#define CUSNAP_EXPORT extern "C" __attribute__((visibility("default")))

CUSNAP_EXPORT cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** funcPtr,
                                                  unsigned long long flags,
                                                  cudaDriverEntryPointQueryResult* driverStatus) {
  return cusnap::shim::entry_point("cudaGetDriverEntryPoint", symbol, funcPtr, flags, driverStatus);
}
CUSNAP_EXPORT cudaError_t
cudaGetDriverEntryPoint_ptsz(const char* symbol, void** funcPtr, unsigned long long flags,
                             cudaDriverEntryPointQueryResult* driverStatus) {
  return cusnap::shim::entry_point("cudaGetDriverEntryPoint_ptsz", symbol, funcPtr, flags,
                                   driverStatus);
}
CUSNAP_EXPORT cudaError_t cudaGetDriverEntryPointByVersion(
    const char* symbol, void** funcPtr, unsigned int cudaVersion, unsigned long long flags,
    cudaDriverEntryPointQueryResult* driverStatus) {
  return cusnap::shim::by_version("cudaGetDriverEntryPointByVersion", symbol, funcPtr, cudaVersion,
                                  flags, driverStatus);
}
CUSNAP_EXPORT cudaError_t cudaGetDriverEntryPointByVersion_ptsz(
    const char* symbol, void** funcPtr, unsigned int cudaVersion, unsigned long long flags,
    cudaDriverEntryPointQueryResult* driverStatus) {
  return cusnap::shim::by_version("cudaGetDriverEntryPointByVersion_ptsz", symbol, funcPtr,
                                  cudaVersion, flags, driverStatus);
}
static_assert(std::is_same_v<decltype(&cudaGetDriverEntryPoint), cusnap::shim::EntryPointFn>);
static_assert(
    std::is_same_v<decltype(&cudaGetDriverEntryPointByVersion), cusnap::shim::ByVersionFn>);
