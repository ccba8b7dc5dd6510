#include "shim/real_driver.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "shim/elf_lookup.h"
#include "shim/stderr_line.h"

namespace cusnap::shim {

namespace detail {
void* g_real[kEntryCount];
constinit std::atomic<int> g_state{0};
}  // namespace detail

using detail::g_state;

namespace {

enum : int { kUnloaded = 0, kLoaded = 1, kFailed = 2, kLoading = 3 };

thread_local bool t_loading = false;  // this thread is inside ensure_loaded()
void* g_handle = nullptr;

// Reverse map from address to entry: the real addresses and the wrappers,
// sorted by address; written once before g_state becomes kLoaded.
struct AddrEntry {
  const void* addr;
  size_t index;
};
AddrEntry g_by_addr[2 * kEntryCount];
size_t g_by_addr_len = 0;

std::atomic<unsigned char> g_reported[kEntryCount];

char g_anchor;  // an address inside the shim: ELF lookups start past it

}  // namespace

void debug_log(const char* what, const char* name) noexcept {
  if (!debug_enabled()) return;
  char buf[512];
  size_t n = 0;
  auto put = [&](const char* s) {
    while (s && *s && n < sizeof buf - 1) buf[n++] = *s++;
  };
  put("cusnap-shim: ");
  put(what);
  if (name) {
    put(": ");
    put(name);
  }
  buf[n++] = '\n';
  write_stderr(buf, n);
}

namespace {

constexpr char kDefaultDriver[] = "libcuda.so.1";

/// $CUSNAP_REAL_LIBCUDA, or nullptr when unset or empty.
const char* named_driver() noexcept {
  const char* path = getenv("CUSNAP_REAL_LIBCUDA");
  return path && *path ? path : nullptr;
}

/// Set once the file $CUSNAP_REAL_LIBCUDA names would not load: the loader's
/// own search for the default driver is used from then on.
std::atomic<bool> g_named_failed{false};

bool is_default(const char* path) noexcept {
  return std::strcmp(path, kDefaultDriver) == 0;
}

}  // namespace

namespace detail {

const char* driver_path() noexcept {
  const char* named = named_driver();
  return named && !g_named_failed.load(std::memory_order_acquire) ? named : kDefaultDriver;
}

// No lock of the shim's is held across dlopen or dlsym: they take the
// dynamic loader's lock, and a thread holding that one (running a library's
// constructor) may call the driver and so come here (the deadlock two
// opposite lock orders made: a plugin's constructor calling the driver while
// another thread made the process's first driver call). One thread loads;
// another that comes meanwhile looks its entry up by itself (entry_meanwhile).
bool ensure_loaded() noexcept {
  int s = g_state.load(std::memory_order_acquire);
  if (s == kLoaded) return true;
  if (s == kFailed || t_loading) return false;  // a driver constructor calling back in
  int expected = kUnloaded;
  if (!g_state.compare_exchange_strong(expected, kLoading, std::memory_order_acq_rel))
    return expected == kLoaded;  // another thread loads (or just did, or failed)
  t_loading = true;
  const char* path = driver_path();
  DlsymFn dls = real_dlsym();
  g_handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  // A file named by $CUSNAP_REAL_LIBCUDA that does not load (a stale path, a
  // library of another machine): the application's own driver, as found
  // without the shim, rather than no driver at all. Said once, below.
  const char* named_failed = nullptr;
  char why[512] = "";
  if (!g_handle && !is_default(path)) {
    named_failed = path;
    if (const char* e = dlerror()) {
      std::strncpy(why, e, sizeof why - 1);
      why[sizeof why - 1] = 0;
    }
    g_named_failed.store(true, std::memory_order_release);
    path = kDefaultDriver;
    g_handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  }
  if (g_handle && dls) {
    size_t n = 0;
    for (size_t i = 0; i < kEntryCount; ++i) {
      void* p = dls(g_handle, entry_name(i));
      // Never forward to ourselves (a "driver" that is the shim).
      if (p && elf_same_object(p, &g_anchor)) p = nullptr;
      g_real[i] = p;
      if (p) g_by_addr[n++] = {p, i};
      g_by_addr[n++] = {wrapper_of(i), i};
    }
    std::sort(g_by_addr, g_by_addr + n,
              [](const AddrEntry& a, const AddrEntry& b) { return a.addr < b.addr; });
    g_by_addr_len = n;
    s = kLoaded;
  } else {
    debug_log("cannot load the real driver", path);
    s = kFailed;
  }
  t_loading = false;
  g_state.store(s, std::memory_order_release);
  if (named_failed)
    say("CUSNAP_REAL_LIBCUDA=%s does not load (%s); using %s%s", named_failed, why, kDefaultDriver,
        g_handle ? "" : ", which does not load either");
  return s == kLoaded;
}

void* entry_meanwhile(size_t i) noexcept {
  if (g_state.load(std::memory_order_acquire) != kLoading || t_loading) return nullptr;
  // Another thread is loading the driver: this one may hold the loader's
  // lock that one waits for, so it cannot wait. The loader's own reference
  // counting makes this dlopen harmless; the handle is never closed.
  DlsymFn dls = real_dlsym();
  const char* path = driver_path();
  void* h = dls ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (dls && !h && !is_default(path)) h = dlopen(kDefaultDriver, RTLD_NOW | RTLD_LOCAL);
  void* p = h ? dls(h, entry_name(i)) : nullptr;
  return p && !elf_same_object(p, &g_anchor) ? p : nullptr;
}

}  // namespace detail

bool entry_of_address(const void* fn, size_t* index) noexcept {
  if (!fn) return false;
  if (!detail::ensure_loaded()) {
    for (size_t i = 0; i < kEntryCount; ++i)
      if (wrapper_of(i) == fn) {
        *index = i;
        return true;
      }
    // Another thread is loading the driver (the table is not ready): the
    // address's own symbol names the entry, when it is the driver's.
    if (g_state.load(std::memory_order_acquire) != kLoading || t_loading) return false;
    Dl_info info;
    size_t i;
    if (::dladdr(fn, &info) == 0 || !info.dli_sname || info.dli_saddr != fn ||
        !find_entry(info.dli_sname, &i) || elf_same_object(fn, &g_anchor) ||
        detail::entry_meanwhile(i) != fn)
      return false;
    *index = i;
    return true;
  }
  auto end = g_by_addr + g_by_addr_len;
  auto it = std::lower_bound(g_by_addr, end, fn,
                             [](const AddrEntry& a, const void* p) { return a.addr < p; });
  if (it == end || it->addr != fn) return false;
  *index = it->index;
  return true;
}

CUresult fail_closed(size_t i) noexcept {
  if (i < kEntryCount && g_reported[i].exchange(1, std::memory_order_relaxed) == 0)
    debug_log(
        "the real driver does not provide this entry point; returning CUDA_ERROR_NOT_SUPPORTED",
        entry_name(i));
  return CUDA_ERROR_NOT_SUPPORTED;
}

bool driver_in_process() noexcept {
  if (detail::loaded()) return true;
  // The default driver counts too: the shim uses it when the named file
  // does not load, and without the shim a lookup would find it.
  const char* path = detail::driver_path();
  void* h = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
  if (!h && !is_default(path)) h = dlopen(kDefaultDriver, RTLD_LAZY | RTLD_NOLOAD);
  if (h) dlclose(h);
  return h != nullptr;
}

void loader_atfork_child() noexcept {
  // A load under way in the parent has no thread to finish it here.
  int loading = kLoading;
  g_state.compare_exchange_strong(loading, kUnloaded, std::memory_order_acq_rel);
}

}  // namespace cusnap::shim
