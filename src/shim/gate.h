// The gate every wrapped driver call passes through.
//
// Fast path: each application thread owns a slot (a per-thread call-depth
// counter on its own cache line). enter() bumps the depth with a plain store,
// then makes one atomic load of the shared gate word; leave() drops the depth
// with a release store. No read-modify-write, no fence instruction: on x86 both
// are plain moves. The one shared atomic the fast path reads is word_:
//   bit 0  CLOSED   set by close(), cleared by open()
//   bit 1  QUEUED   threads wait in the slow path; new arrivals queue behind them
//   bits 2+         calls in flight of threads without a slot (more than
//                   kMaxThreads threads, or no pthread key left for the
//                   registry), counted with fetch_add/fetch_sub
//
// Memory ordering (store-buffering pattern, asymmetric fence): a thread stores
// its depth, then loads word_; close() sets CLOSED with a read-modify-write and
// then issues membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), which executes a
// full fence on every CPU running a thread of this process. So either the
// closer sees the thread's depth (and waits for it), or the thread sees CLOSED
// (and backs out to wait). Where membarrier is unavailable the fast path
// issues a seq_cst fence itself (slower, still correct). The release store in
// leave() pairs with the closer's acquire loads of the depths: once close()
// returns, every driver call made before it has finished and its effects are
// visible. The acquire load of word_ in enter() pairs with the release in
// open(), so an admitted thread sees what the coordinator wrote while closed.
// enter()/leave() are async-signal-safe on the fast path.
//
// A thread already inside the gate (depth > 0: the driver calling back into
// the API on the same thread, or a signal handler) passes through without
// waiting, so a close can always drain. A thread in the slow path holds the
// signals that have a handler until it is through (depth 1), so a handler
// that calls the driver never waits behind its own thread's ticket; signals
// at their default action stay deliverable (SIGTERM still ends the process).
//
// Slow path: an arrival that finds CLOSED or QUEUED backs its depth out and
// takes a ticket under mu_; tickets are admitted strictly in order once the
// gate is open, so waiting threads continue in the order they arrived.
//
// Lock order: mu_ is a leaf lock; nothing else is taken while it is held.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>

namespace cusnap::shim {

namespace detail {
/// How enter() orders its depth store before its load of the gate word:
/// 0 undecided, 1 membarrier registered (compiler barrier suffices), 2 fence.
extern std::atomic<int> g_fence_mode;
}  // namespace detail

class Gate {
 public:
  static constexpr uint64_t kClosed = 1;
  static constexpr uint64_t kQueued = 2;
  static constexpr uint64_t kOne = 4;  ///< one slot-less call in flight
  static constexpr unsigned kMaxThreads = 1024;

  constexpr Gate() = default;
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  /// Enters the gate; waits while it is closed. Never fails. what (0: not
  /// said) names the call for in_flight_calls(): the wrappers pass their
  /// entry index plus one. The wait is no cancellation point: a
  /// pthread_cancel meanwhile is acted on at the thread's next one.
  __attribute__((always_inline)) void enter(uint32_t what = 0) noexcept {
    const int t = thread_slot();
    if (__builtin_expect(t >= 0, 1)) {
      Slot& s = slots_[t];
      const uint32_t depth = s.depth.load(std::memory_order_relaxed);
      s.depth.store(depth + 1, std::memory_order_relaxed);
      if (depth != 0) return;  // nested: already counted
      s.what.store(what, std::memory_order_relaxed);
      store_load_fence();
      if (__builtin_expect((word_.load(std::memory_order_acquire) & (kClosed | kQueued)) == 0, 1))
        return;
      s.depth.store(0, std::memory_order_release);
      enter_slow(t);
      return;
    }
    uint64_t old = word_.fetch_add(kOne, std::memory_order_acq_rel);
    if (__builtin_expect((old & (kClosed | kQueued)) != 0, 0)) {
      word_.fetch_sub(kOne, std::memory_order_relaxed);
      enter_slow(-1);
    }
  }
  /// Leaves the gate entered by enter().
  __attribute__((always_inline)) void leave() noexcept {
    const int t = thread_slot();
    if (__builtin_expect(t >= 0, 1)) {
      Slot& s = slots_[t];
      s.depth.store(s.depth.load(std::memory_order_relaxed) - 1, std::memory_order_release);
      return;
    }
    word_.fetch_sub(kOne, std::memory_order_release);
  }

  /// Closes the gate and waits up to timeout_ms for calls in flight to finish
  /// (any value: the deadline saturates, so UINT64_MAX waits until they do).
  /// Returns 0 when closed and drained. On timeout reopens the gate (the
  /// process keeps running as before) and returns ETIMEDOUT. Returns EALREADY
  /// when the gate was already closed.
  int close(uint64_t timeout_ms) noexcept;
  /// Opens the gate; queued threads continue in arrival order. Returns
  /// EALREADY when the gate was already open.
  int open() noexcept;

  /// Whether this thread entered more than once (a driver call nested in
  /// another, or a signal handler's); false for threads without a slot.
  bool nested() const noexcept {
    const int t = t_slot_;
    return t >= 0 && slots_[t].depth.load(std::memory_order_relaxed) > 1;
  }

  bool is_closed() const noexcept { return (word_.load(std::memory_order_acquire) & kClosed) != 0; }
  /// Calls in flight now (threads inside the driver).
  uint64_t in_flight() const noexcept;
  /// The `what` of up to max calls in flight now (threads with a slot); for
  /// saying which calls a close waited for in vain. Returns how many.
  size_t in_flight_calls(uint32_t* out, size_t max) const noexcept;
  /// Threads waiting at the gate now.
  uint64_t waiting() const noexcept;

  /// pthread_atfork handlers: the child has one thread, so it starts with an
  /// open, empty gate and fresh locks.
  void atfork_prepare() noexcept;
  void atfork_parent() noexcept;
  void atfork_child() noexcept;

  /// Position (0, 1, ...) in which this thread was last admitted through the
  /// slow path of any gate, counted per gate; for tests of the admission order.
  static uint64_t last_admission() noexcept { return t_admission_; }

  /// This thread's slot index, or -1 when every slot is taken (or the
  /// process had no pthread key left for the registry: no slot is given).
  __attribute__((always_inline)) static int thread_slot() noexcept {
    int t = t_slot_;
    return __builtin_expect(t >= 0, 1) ? t : claim_slot();
  }

  /// Thread-exit handler of the slot registry (a pthread key destructor):
  /// frees the index, its depth in the process gate set to 0 (a thread that
  /// unwound out of a driver call never left it); later calls on this
  /// thread use the shared counter.
  static void release_thread_slot(void* index_plus_one) noexcept;

 private:
  struct alignas(64) Slot {
    std::atomic<uint32_t> depth{0};
    std::atomic<uint32_t> what{0};  ///< of the outermost call in flight (diagnostics)
  };

  __attribute__((always_inline)) static void store_load_fence() noexcept {
    if (__builtin_expect(detail::g_fence_mode.load(std::memory_order_relaxed) == 1, 1))
      std::atomic_signal_fence(std::memory_order_seq_cst);
    else
      std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  static int claim_slot() noexcept;
  void enter_slow(int slot) noexcept;
  bool drained() const noexcept;

  // Constant-initialized: no thread_local wrapper on access.
  static inline constinit thread_local int t_slot_ __attribute__((tls_model("initial-exec"))) = -2;
  static inline constinit thread_local uint64_t t_admission_
      __attribute__((tls_model("initial-exec"))) = 0;

  std::atomic<uint64_t> word_{0};
  pthread_mutex_t mu_ = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv_ = PTHREAD_COND_INITIALIZER;
  uint64_t next_ticket_ = 0;  ///< guarded by mu_
  uint64_t serving_ = 0;      ///< guarded by mu_
  Slot slots_[kMaxThreads];
};

namespace detail {
extern Gate g_process_gate;
}
/// The process's gate. Constant-initialized: usable before any constructor runs.
inline Gate& gate() noexcept {
  return detail::g_process_gate;
}

/// Holds off pthread_cancel for the lifetime of the object (restoring the
/// thread's state after), around the shim's own blocking waits inside a hook:
/// a cancellation acted on there would unwind with the shim's locks held,
/// through noexcept frames (std::terminate) or into a catch (...) that does
/// not rethrow (glibc aborts). A request made meanwhile stays pending until
/// the application's next cancellation point.
class NoCancel {
 public:
  NoCancel() noexcept { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old_); }
  ~NoCancel() { pthread_setcancelstate(old_, nullptr); }
  NoCancel(const NoCancel&) = delete;
  NoCancel& operator=(const NoCancel&) = delete;

 private:
  int old_ = PTHREAD_CANCEL_ENABLE;
};

/// Enters the process gate for the lifetime of the object.
class GateGuard {
 public:
  __attribute__((always_inline)) explicit GateGuard(uint32_t what = 0) noexcept {
    gate().enter(what);
  }
  __attribute__((always_inline)) ~GateGuard() { gate().leave(); }
  GateGuard(const GateGuard&) = delete;
  GateGuard& operator=(const GateGuard&) = delete;
};

/// The barrier close() falls back to without membarrier; true when it ran.
bool gate_flush_by_mprotect_for_test() noexcept;

/// Releases the calling thread's slot registry state in a forked child.
void gate_slots_atfork_child() noexcept;

}  // namespace cusnap::shim
