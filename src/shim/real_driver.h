// The real driver: dlopen'ed on first use ("libcuda.so.1", or the file named by
// $CUSNAP_REAL_LIBCUDA; "libcuda.so.1" after all, with a line on stderr, when
// that file does not load), never linked. Each entry point's real address comes
// from the real dlsym on that handle, so the shim's own exports never shadow it.
//
// State: g_state (atomic) moves unloaded -> loading -> loaded|failed once;
// the thread whose compare-exchange took it to loading loads, holding no lock
// (the loader's lock may be held by a thread that calls the driver from a
// library's constructor: it must not wait for us). Readers on the fast path
// load g_state with acquire; the slot table is written before the release
// store that publishes "loaded" and never again. A thread that finds another
// loading looks its entry up itself (entry_meanwhile).
#pragma once

#include <atomic>
#include <cstddef>

#include "shim/entries.h"

namespace cusnap::shim {

namespace detail {
extern void* g_real[kEntryCount];
/// 1 once the driver is loaded and g_real is final (release store).
extern std::atomic<int> g_state;
bool ensure_loaded() noexcept;
inline bool loaded() noexcept {
  return g_state.load(std::memory_order_acquire) == 1;
}
/// Entry i looked up without the table, while another thread loads the driver.
void* entry_meanwhile(size_t i) noexcept;
/// The file the driver is loaded from (the named one until it failed to load).
const char* driver_path() noexcept;
}  // namespace detail

/// Real address of entry i, loading the driver on first use; nullptr when the
/// driver is missing or does not export it (the caller fails closed).
inline void* real_entry(size_t i) noexcept {
  if (__builtin_expect(!detail::loaded(), 0) && !detail::ensure_loaded())
    return detail::entry_meanwhile(i);
  return detail::g_real[i];
}

/// Whether the driver is in the process already (loaded by the shim or by
/// anyone), without loading it.
bool driver_in_process() noexcept;

/// Which entry `fn` is: a real driver address or one of the shim's wrappers.
/// Loads the driver when needed. False for anything else.
bool entry_of_address(const void* fn, size_t* index) noexcept;

/// The C library's dlsym and dlvsym (found by ELF lookup past the shim).
using DlsymFn = void* (*)(void*, const char*);
using DlvsymFn = void* (*)(void*, const char*, const char*);
DlsymFn real_dlsym() noexcept;
DlvsymFn real_dlvsym() noexcept;

/// Returns CUDA_ERROR_NOT_SUPPORTED for a call the real driver cannot take,
/// saying so once per entry on stderr when $CUSNAP_SHIM_DEBUG is set.
CUresult fail_closed(size_t i) noexcept;
/// Writes one diagnostic line (async-signal-safe) when $CUSNAP_SHIM_DEBUG is set.
void debug_log(const char* what, const char* name) noexcept;

/// The pthread_atfork child handler for the loader state.
void loader_atfork_child() noexcept;

}  // namespace cusnap::shim
