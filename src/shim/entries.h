// The shim's view of the driver API: one enumerator per entry point of the
// generated list (src/cudaapi/entry_points.inc) plus the rows of
// extra_entries.inc, the cuGetProcAddress table built from the same lists, and
// the wrapper each entry point is answered with.
#pragma once

#ifndef __CUDA_API_VERSION_INTERNAL
#define __CUDA_API_VERSION_INTERNAL
#endif
#include "cudaapi/cuda_headers.h"

#include <cstddef>
#include <cstdint>

// Declarations for the entry points the toolkit headers do not carry yet.
#define CUSNAP_CU_ENTRY(name, params, args) extern "C" CUresult CUDAAPI name params;
#define CUSNAP_CU_PROC(...)
#include "shim/extra_entries.inc"
#undef CUSNAP_CU_ENTRY
#undef CUSNAP_CU_PROC

// cuda.h declares cuGetProcAddress_v2_ptsz only when built for per-thread
// default streams, as cuGetProcAddress_v2 renamed: the same type.
extern "C" decltype(cuGetProcAddress_v2) cuGetProcAddress_v2_ptsz;

namespace cusnap::shim {

enum class Entry : uint16_t {
#define CUSNAP_CU_ENTRY(name, params, args) name,
#define CUSNAP_CU_PROC(...)
#include "cudaapi/entry_points.inc"
#include "shim/extra_entries.inc"
#undef CUSNAP_CU_ENTRY
#undef CUSNAP_CU_PROC
  kEnd_
};

/// Entries of the generated list; the extras follow them.
inline constexpr size_t kGeneratedCount = 0
#define CUSNAP_CU_ENTRY(name, params, args) +1
#define CUSNAP_CU_PROC(...)
#include "cudaapi/entry_points.inc"
#undef CUSNAP_CU_ENTRY
#undef CUSNAP_CU_PROC
    ;
inline constexpr size_t kEntryCount = static_cast<size_t>(Entry::kEnd_);

/// Dense index 0..kEntryCount-1 of an entry.
constexpr size_t index_of(Entry e) {
  return static_cast<size_t>(e);
}

/// Exported symbol name of entry i.
const char* entry_name(size_t i) noexcept;
/// Index of the entry exported as `name`; false when the shim has no such entry.
bool find_entry(const char* name, size_t* index) noexcept;
/// The shim's wrapper for entry i.
void* wrapper_of(size_t i) noexcept;

/// Outcome of looking a cuGetProcAddress request up in the table.
enum class ProcLookup { kFound, kNotFound, kVersionTooLow };

struct ProcAnswer {
  size_t index = 0;       ///< entry that answers the request (kFound)
  int authoritative = 0;  ///< the table is complete for requests up to this CUDA version
};

/// What a caller asking cuGetProcAddress for `name` at `cuda_version` gets;
/// per_thread selects the per-thread-default-stream (_ptds/_ptsz) rows where
/// the name has them.
ProcLookup lookup_proc(const char* name, int cuda_version, bool per_thread,
                       ProcAnswer* out) noexcept;

/// Number of rows of the cuGetProcAddress table and row i, for tests.
size_t proc_row_count() noexcept;
struct ProcRow {
  const char* name;
  int version;
  int flavour;  ///< 0 default, 1 ptds, 2 ptsz
  size_t index;
};
ProcRow proc_row(size_t i) noexcept;

}  // namespace cusnap::shim
