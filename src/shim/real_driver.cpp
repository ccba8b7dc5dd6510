#include "shim/real_driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "shim/elf_lookup.h"

namespace cusnap::shim {

namespace detail {
void* g_real[kEntryCount];
constinit std::atomic<int> g_state{0};
}  // namespace detail

using detail::g_state;

namespace {

enum : int { kUnloaded = 0, kLoaded = 1, kFailed = 2 };

pthread_mutex_t g_load_mu = PTHREAD_MUTEX_INITIALIZER;
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

bool debug_enabled() noexcept {
  static std::atomic<int> on{-1};
  int v = on.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = getenv("CUSNAP_SHIM_DEBUG");
    v = (e && *e && std::strcmp(e, "0") != 0) ? 1 : 0;
    on.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

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
  ssize_t r = write(STDERR_FILENO, buf, n);
  (void)r;
}

namespace detail {

bool ensure_loaded() noexcept {
  int s = g_state.load(std::memory_order_acquire);
  if (s == kLoaded) return true;
  if (s == kFailed || t_loading) return false;  // a driver constructor calling back in
  pthread_mutex_lock(&g_load_mu);
  s = g_state.load(std::memory_order_acquire);
  if (s == kUnloaded) {
    t_loading = true;
    const char* path = getenv("CUSNAP_REAL_LIBCUDA");
    if (!path || !*path) path = "libcuda.so.1";
    DlsymFn dls = real_dlsym();
    g_handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
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
  }
  pthread_mutex_unlock(&g_load_mu);
  return s == kLoaded;
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
    return false;
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

void loader_atfork_prepare() noexcept {
  pthread_mutex_lock(&g_load_mu);
}
void loader_atfork_parent() noexcept {
  pthread_mutex_unlock(&g_load_mu);
}
void loader_atfork_child() noexcept {
  new (&g_load_mu) pthread_mutex_t(PTHREAD_MUTEX_INITIALIZER);
}

}  // namespace cusnap::shim
