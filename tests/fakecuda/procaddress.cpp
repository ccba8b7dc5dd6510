// cuGetProcAddress and _v2: resolves through the generated proc table to this
// library's own entry points. A caller asking for CUDA >= 13.1 gets the
// device-explicit multicast bind forms.
#include "gate.h"
#include "state.h"

#include <cstring>

// Extra exports not in the 13.0 headers (multicast.cpp defines them).
FC_EXPORT CUresult cuMulticastBindMem_v2(CUmemGenericAllocationHandle, CUdevice, size_t,
                                         CUmemGenericAllocationHandle, size_t, size_t,
                                         unsigned long long);
FC_EXPORT CUresult cuMulticastBindAddr_v2(CUmemGenericAllocationHandle, CUdevice, size_t,
                                          CUdeviceptr, size_t, unsigned long long);

namespace {

enum Flavour { CUSNAP_PROC_DEFAULT, CUSNAP_PROC_PTDS, CUSNAP_PROC_PTSZ };

struct ProcRow {
  const char* name;
  int version;
  Flavour flavour;
  void* fn;
};

const ProcRow kRows[] = {
#define CUSNAP_CU_PROC(name, version, flavour, symbol) \
  {name, version, flavour, reinterpret_cast<void*>(&symbol)},
#include "cudaapi/proc_table.inc"
#undef CUSNAP_CU_PROC
    {"cuMulticastBindMem", 13010, CUSNAP_PROC_DEFAULT,
     reinterpret_cast<void*>(&cuMulticastBindMem_v2)},
    {"cuMulticastBindAddr", 13010, CUSNAP_PROC_DEFAULT,
     reinterpret_cast<void*>(&cuMulticastBindAddr_v2)},
};

CUresult resolve(const char* symbol, void** pfn, int version, cuuint64_t flags,
                 CUdriverProcAddressQueryResult* status) {
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  if (flags & ~static_cast<cuuint64_t>(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                                       CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
    return CUDA_ERROR_INVALID_VALUE;
  bool per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  const ProcRow* best = nullptr;
  const ProcRow* best_pt = nullptr;
  bool named = false;
  for (const ProcRow& r : kRows) {
    if (strcmp(r.name, symbol) != 0) continue;
    named = true;
    if (r.version > version) continue;
    if (r.flavour == CUSNAP_PROC_DEFAULT) {
      if (!best || r.version >= best->version) best = &r;
    } else if (!best_pt || r.version >= best_pt->version) {
      best_pt = &r;
    }
  }
  const ProcRow* pick = (per_thread && best_pt) ? best_pt : best;
  *pfn = pick ? pick->fn : nullptr;
  if (status) {
    *status = pick ? CU_GET_PROC_ADDRESS_SUCCESS
                   : (named ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                            : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  }
  return pick ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

}  // namespace

FC_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                    cuuint64_t flags) {
  FC_ENTER_UNGATED("cuGetProcAddress");
  return resolve(symbol, pfn, cudaVersion, flags, nullptr);
}

FC_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                       cuuint64_t flags,
                                       CUdriverProcAddressQueryResult* symbolStatus) {
  FC_ENTER_UNGATED("cuGetProcAddress");
  return resolve(symbol, pfn, cudaVersion, flags, symbolStatus);
}

FC_EXPORT CUresult cuGetProcAddress_v2_ptsz(const char* symbol, void** funcPtr, int driverVersion,
                                            cuuint64_t flags,
                                            CUdriverProcAddressQueryResult* symbolStatus) {
  FC_ENTER_UNGATED("cuGetProcAddress");
  return resolve(symbol, funcPtr, driverVersion, flags, symbolStatus);
}
