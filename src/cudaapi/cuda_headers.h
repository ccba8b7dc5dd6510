// The toolkit headers that scripts/gen-entry-points.py makes entry_points.inc and
// proc_table.inc from (its HEADERS): include this, not <cuda.h> alone, before
// expanding the rows with their parameter lists or taking their symbols'
// addresses (cuProfilerInitialize's CUoutput_mode and the cuProfiler*
// declarations come from cudaProfiler.h, not cuda.h).
//
// The includer decides about __CUDA_API_VERSION_INTERNAL (defined: no
// cuMemAlloc -> cuMemAlloc_v2 renaming macros, no deprecation attributes).
#pragma once

#include <cuda.h>
#include <cudaProfiler.h>
