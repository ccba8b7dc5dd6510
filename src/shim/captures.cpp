// The stream captures under way in this process (captures.h).
#include "shim/captures.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <new>

#include "shim/pthread_lock.h"
#include "shim/real_driver.h"

#define REAL(name) reinterpret_cast<decltype(&::name)>(real_entry(index_of(Entry::name)))

namespace cusnap::shim::captures {

namespace {

// A capture's origin stream; the per-thread default stream is one per
// thread, so it is keyed with the thread. Captures are few: a fixed table,
// no allocation. When it is full a further capture is not recorded, and the
// shim behaves as it did before captures were followed (it may synchronize).
constexpr unsigned kMax = 256;
struct Origin {
  uintptr_t stream = 0;
  long tid = 0;             // the thread, for the per-thread default stream; else 0
  uint64_t generation = 0;  // which recording: a stream may capture again
  bool used = false;
};
uint64_t g_generation = 0;  // under g_mu
Origin g_origins[kMax];
pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
std::atomic<unsigned> g_count{0};

bool per_thread(CUstream s, bool ptsz) {
  return s == CU_STREAM_PER_THREAD || (ptsz && s == nullptr);
}

Origin key_of(CUstream s, bool ptsz) {
  Origin o;
  o.used = true;
  if (per_thread(s, ptsz)) {
    o.stream = reinterpret_cast<uintptr_t>(CU_STREAM_PER_THREAD);
    o.tid = static_cast<long>(::syscall(SYS_gettid));
  } else {
    o.stream = reinterpret_cast<uintptr_t>(s);
  }
  return o;
}

/// The slot of k, or nullptr. Under g_mu.
Origin* find_locked(const Origin& k) {
  for (Origin& o : g_origins)
    if (o.used && o.stream == k.stream && o.tid == k.tid) return &o;
  return nullptr;
}

void drop_locked(Origin* o) {
  o->used = false;
  g_count.fetch_sub(1, std::memory_order_release);
}

bool still_capturing(CUstream s, bool ptsz) {
  const bool pt = per_thread(s, ptsz);
  auto is = pt ? REAL(cuStreamIsCapturing_ptsz) : REAL(cuStreamIsCapturing);
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  return is && is(pt ? nullptr : s, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/// Whether thread tid of this process has exited (errno kept). Late: a
/// thread's id is cleared for pthread_join before the kernel lets it go, so
/// for a moment after a join the thread is still found (thread_exiting is
/// what drops its captures on time; this, those of a thread that ran no
/// destructors).
bool thread_gone(long tid) {
  const int saved = errno;
  const bool gone = ::syscall(SYS_tgkill, ::getpid(), tid, 0) != 0 && errno == ESRCH;
  errno = saved;
  return gone;
}

/// Run as a thread that began a capture on its default stream exits (a
/// thread-specific value's destructor, before the thread's id is cleared):
/// its captures can never end, so they are dropped.
void thread_exiting(void*) noexcept {
  if (g_count.load(std::memory_order_acquire) == 0) return;
  const long self = static_cast<long>(::syscall(SYS_gettid));
  PthreadLock l(&g_mu);
  for (Origin& o : g_origins)
    if (o.used && o.tid == self) drop_locked(&o);
}

pthread_once_t g_exit_once = PTHREAD_ONCE_INIT;
pthread_key_t g_exit_key;
bool g_exit_key_made = false;  // written once, under g_exit_once

void make_exit_key() {
  g_exit_key_made = pthread_key_create(&g_exit_key, thread_exiting) == 0;
}

/// Arms thread_exiting in the calling thread (no key: thread_gone only).
void on_thread_exit() noexcept {
  pthread_once(&g_exit_once, make_exit_key);
  if (g_exit_key_made && !pthread_getspecific(g_exit_key))
    pthread_setspecific(g_exit_key, reinterpret_cast<void*>(1));
}

}  // namespace

void began(CUstream s, bool ptsz) noexcept {
  const Origin k = key_of(s, ptsz);
  if (k.tid) on_thread_exit();
  PthreadLock l(&g_mu);
  if (find_locked(k)) return;
  for (Origin& o : g_origins)
    if (!o.used) {
      o = k;
      o.generation = ++g_generation;
      g_count.fetch_add(1, std::memory_order_release);
      return;
    }
}

void ended(CUstream s, bool ptsz, CUresult r) noexcept {
  // Measured (docs/gpu-runs/capture-joins-h200.log): an end on the origin
  // ends its capture when it succeeds and when it fails UNJOINED or
  // INVALIDATED; ILLEGAL_STATE says the stream was not capturing. Another
  // thread's end in GLOBAL or THREAD_LOCAL mode (WRONG_THREAD) leaves it.
  if (r == CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD || r == CUDA_ERROR_STREAM_CAPTURE_UNMATCHED)
    return;
  if (g_count.load(std::memory_order_acquire) == 0) return;
  PthreadLock l(&g_mu);
  if (Origin* o = find_locked(key_of(s, ptsz))) drop_locked(o);
}

void destroyed(CUstream s) noexcept {
  if (g_count.load(std::memory_order_acquire) == 0 || per_thread(s, false)) return;
  PthreadLock l(&g_mu);
  if (Origin* o = find_locked(key_of(s, false))) drop_locked(o);
}

bool any() noexcept {
  if (g_count.load(std::memory_order_acquire) == 0) return false;
  // A capture that ended where the hooks did not see it (its stream went
  // with its context, say) would count for ever: ask again about the ones
  // this thread can ask about.
  const long self = static_cast<long>(::syscall(SYS_gettid));
  Origin seen[kMax];
  {
    PthreadLock l(&g_mu);
    for (unsigned i = 0; i < kMax; ++i) seen[i] = g_origins[i];
  }
  for (const Origin& o : seen) {
    if (!o.used) continue;
    if (o.tid != 0 && o.tid != self) {
      // Another thread's default stream: only that thread may ask. One that
      // exited capturing can never end its capture, which would count for
      // ever (frees deferred for good, every drain refused).
      if (!thread_gone(o.tid)) continue;
    } else {
      CUstream s = o.tid ? CU_STREAM_PER_THREAD : reinterpret_cast<CUstream>(o.stream);
      if (still_capturing(s, false)) continue;
    }
    PthreadLock l(&g_mu);
    Origin* f = find_locked(o);
    if (f && f->generation == o.generation) drop_locked(f);
  }
  return g_count.load(std::memory_order_acquire) != 0;
}

void atfork_prepare() noexcept {
  pthread_mutex_lock(&g_mu);
}
void atfork_parent() noexcept {
  pthread_mutex_unlock(&g_mu);
}
void atfork_child() noexcept {
  new (&g_mu) pthread_mutex_t(PTHREAD_MUTEX_INITIALIZER);
  for (Origin& o : g_origins) o.used = false;
  g_count.store(0, std::memory_order_relaxed);
}

}  // namespace cusnap::shim::captures
