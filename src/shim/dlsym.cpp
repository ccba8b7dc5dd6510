// dlsym and dlvsym, interposed so that looking a driver entry point up by name
// returns the shim's wrapper, whatever the handle: a dlopen'ed libcuda (or any
// handle whose scope reaches it), RTLD_DEFAULT and RTLD_NEXT.
//
// Only names of driver entry points are touched. For every other name the C
// library's function runs unchanged; for RTLD_NEXT that matters, because glibc
// finds "next" from its caller's return address: dlsym_entry.S jumps straight to
// the real dlsym (tail call, caller's return address intact) unless
// cusnap_dl_next_wants() claims the name, and then the search is emulated here
// from the caller's address with an ELF lookup over the objects after it.
//
// These run before the shim's constructors, and before AddressSanitizer has
// mapped its shadow memory, when a sanitizer runtime preloaded ahead of the
// shim resolves its interceptors: they allocate nothing, touch only
// constant-initialized state until a driver name is asked for, and this file,
// elf_lookup.cpp and entries.cpp are built without ASan instrumentation
// (src/shim/CMakeLists.txt).
#include <dlfcn.h>

#include <atomic>

#include "shim/elf_lookup.h"
#include "shim/entries.h"
#include "shim/real_driver.h"

namespace cusnap::shim {
namespace {

char g_anchor;  // an address inside the shim: lookups of the C library start past it
std::atomic<DlsymFn> g_dlsym{nullptr};
std::atomic<DlvsymFn> g_dlvsym{nullptr};
const char* const kDlVersions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", nullptr};

// Past the shim first (it is preloaded: the C library follows it), then from
// the start (the shim was dlopen'ed after the C library); never the shim's own.
template <class Fn>
Fn find_libc(const char* name) {
  for (const void* after :
       {static_cast<const void*>(&g_anchor), static_cast<const void*>(nullptr)}) {
    if (void* p = elf_find_next(after, name, nullptr)) return reinterpret_cast<Fn>(p);
    for (const char* const* v = kDlVersions; *v; ++v)
      if (void* p = elf_find_next(after, name, *v)) return reinterpret_cast<Fn>(p);
  }
  return nullptr;
}

}  // namespace

DlsymFn real_dlsym() noexcept {
  DlsymFn f = g_dlsym.load(std::memory_order_acquire);
  if (!f) {
    f = find_libc<DlsymFn>("dlsym");
    g_dlsym.store(f, std::memory_order_release);
  }
  return f;
}

DlvsymFn real_dlvsym() noexcept {
  DlvsymFn f = g_dlvsym.load(std::memory_order_acquire);
  if (!f) {
    f = find_libc<DlvsymFn>("dlvsym");
    g_dlvsym.store(f, std::memory_order_release);
  }
  return f;
}

namespace {

/// The answer for driver entry i when the loader found `found`.
void* map_driver_symbol(size_t i, void* found) {
  if (!found) return nullptr;
  if (found == wrapper_of(i)) {
    // The shim itself answered (it is ahead of the driver in the global
    // scope): hand the wrapper out only if the driver provides the entry.
    // Without a driver in the process the lookup finds nothing, as it would
    // without the shim: a probe for a loaded driver must not load one.
    if (!driver_in_process()) return nullptr;
    return real_entry(i) ? found : nullptr;
  }
  if (real_entry(i) == found) return wrapper_of(i);
  return found;  // some other library's function of that name: not the driver's
}

}  // namespace
}  // namespace cusnap::shim

using cusnap::shim::find_entry;

// Hidden helpers called from dlsym_entry.S.
extern "C" {
__attribute__((visibility("hidden"))) void* cusnap_real_dlsym_ptr = nullptr;
__attribute__((visibility("hidden"))) void* cusnap_real_dlvsym_ptr = nullptr;
}

/// 1: the shim answers this RTLD_NEXT lookup; 0: jump to the real function,
/// whose pointer is then set.
extern "C" __attribute__((visibility("hidden"))) int cusnap_dl_next_wants(const char* name) {
  size_t i;
  if (find_entry(name, &i)) return 1;
  auto* d = reinterpret_cast<void*>(cusnap::shim::real_dlsym());
  auto* v = reinterpret_cast<void*>(cusnap::shim::real_dlvsym());
  __atomic_store_n(&cusnap_real_dlsym_ptr, d, __ATOMIC_RELEASE);
  __atomic_store_n(&cusnap_real_dlvsym_ptr, v, __ATOMIC_RELEASE);
  return (d && v) ? 0 : 1;
}

extern "C" __attribute__((visibility("hidden"))) void* cusnap_dlsym_handle(void* handle,
                                                                           const char* name) {
  auto real = cusnap::shim::real_dlsym();
  if (!real) return nullptr;
  void* found = real(handle, name);
  size_t i;
  if (!find_entry(name, &i)) return found;
  return cusnap::shim::map_driver_symbol(i, found);
}

extern "C" __attribute__((visibility("hidden"))) void* cusnap_dlvsym_handle(void* handle,
                                                                            const char* name,
                                                                            const char* version) {
  auto real = cusnap::shim::real_dlvsym();
  if (!real) return nullptr;
  void* found = real(handle, name, version);
  size_t i;
  if (!find_entry(name, &i)) return found;
  return cusnap::shim::map_driver_symbol(i, found);
}

extern "C" __attribute__((visibility("hidden"))) void* cusnap_dlsym_next(void*, const char* name,
                                                                         const void* caller) {
  size_t i;
  if (!find_entry(name, &i))
    return nullptr;  // not reached: the stub only calls this for driver names
  return cusnap::shim::map_driver_symbol(i, cusnap::shim::elf_find_next(caller, name, nullptr));
}

extern "C" __attribute__((visibility("hidden"))) void* cusnap_dlvsym_next(void*, const char* name,
                                                                          const char* version,
                                                                          const void* caller) {
  size_t i;
  if (!find_entry(name, &i)) return nullptr;
  return cusnap::shim::map_driver_symbol(i, cusnap::shim::elf_find_next(caller, name, version));
}

#if !defined(__x86_64__)
// Without the assembly stub RTLD_NEXT is answered as seen from the shim, which
// is right for callers loaded before it (the program, other preloads).
extern "C" __attribute__((visibility("default"))) void* dlsym(void* handle, const char* name) {
  if (handle == RTLD_NEXT) {
    size_t i;
    if (find_entry(name, &i))
      return cusnap_dlsym_next(handle, name,
                               __builtin_extract_return_addr(__builtin_return_address(0)));
    auto real = cusnap::shim::real_dlsym();
    return real ? real(RTLD_NEXT, name) : nullptr;
  }
  return cusnap_dlsym_handle(handle, name);
}
extern "C" __attribute__((visibility("default"))) void* dlvsym(void* handle, const char* name,
                                                               const char* version) {
  if (handle == RTLD_NEXT) {
    size_t i;
    if (find_entry(name, &i))
      return cusnap_dlvsym_next(handle, name, version,
                                __builtin_extract_return_addr(__builtin_return_address(0)));
    auto real = cusnap::shim::real_dlvsym();
    return real ? real(RTLD_NEXT, name, version) : nullptr;
  }
  return cusnap_dlvsym_handle(handle, name, version);
}
#endif
