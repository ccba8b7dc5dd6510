// Every entry point of the list (what cuda.h and cudaProfiler.h declare), as a
// weak definition returning CUDA_ERROR_NOT_SUPPORTED; the files of this
// directory give strong definitions for what the simulated driver implements.
// Anything linked against the real libcuda therefore links and loads against
// this one.
#include "state.h"

#pragma GCC diagnostic ignored "-Wunused-parameter"

#define CUSNAP_CU_ENTRY(symbol, params, args)                                      \
  extern "C" __attribute__((weak, visibility("default"))) CUresult symbol params { \
    return CUDA_ERROR_NOT_SUPPORTED;                                               \
  }
#include "cudaapi/entry_points.inc"
#undef CUSNAP_CU_ENTRY
