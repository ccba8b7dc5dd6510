// The real driver: dlopen'ed on first use ("libcuda.so.1", or the file named by
// $CUSNAP_REAL_LIBCUDA), never linked. Each entry point's real address comes
// from the real dlsym on that handle, so the shim's own exports never shadow it.
//
// State: g_state (atomic) moves 0 -> loading -> loaded|failed once, under
// g_load_mu. Readers on the fast path load g_state with acquire; the slot table
// is written before the release store that publishes "loaded" and never again.
// Lock order: g_load_mu is taken inside the gate, never under Gate::mu_.
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
}  // namespace detail

/// Real address of entry i, loading the driver on first use; nullptr when the
/// driver is missing or does not export it (the caller fails closed).
inline void* real_entry(size_t i) noexcept {
  if (__builtin_expect(!detail::loaded(), 0) && !detail::ensure_loaded()) return nullptr;
  return detail::g_real[i];
}

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

/// pthread_atfork handlers for the loader state.
void loader_atfork_prepare() noexcept;
void loader_atfork_parent() noexcept;
void loader_atfork_child() noexcept;

}  // namespace cusnap::shim
