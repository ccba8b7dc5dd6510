// The gate every wrapped driver call passes through.
//
// State lives in one atomic word (Gate::word_):
//   bit 0  CLOSED   set by close(), cleared by open()
//   bit 1  QUEUED   threads are waiting in the slow path; new arrivals queue behind them
//   bits 2+         number of calls in flight (entered, not yet left)
//
// Fast path (gate open, nobody queued): enter() is one fetch_add(acquire) on the
// word, leave() one fetch_sub(release). The acquire on entry pairs with the
// release in open(), so a thread admitted after a reopen sees everything the
// coordinator wrote while the gate was closed; the release on exit pairs with
// the acquire loads in close(), so once close() has seen the count drain to zero
// every driver call made before it has finished, with its effects visible.
// Both operations are lock-free and async-signal-safe.
//
// Slow path: an arrival that finds CLOSED or QUEUED backs its increment out and
// takes a ticket under mu_; tickets are admitted strictly in order once the gate
// is open, so waiting threads continue in the order they arrived.
//
// Lock order: mu_ is a leaf lock; nothing else is taken while it is held.
// Precondition: a thread never enters the gate while it is already inside it
// (the driver does not call back into its own API on an application thread).
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>

namespace cusnap::shim {

class Gate {
public:
    static constexpr uint64_t kClosed = 1;
    static constexpr uint64_t kQueued = 2;
    static constexpr uint64_t kOne = 4;  ///< one call in flight

    constexpr Gate() = default;
    Gate(const Gate&) = delete;
    Gate& operator=(const Gate&) = delete;

    /// Enters the gate; waits while it is closed. Never fails.
    void enter() noexcept {
        uint64_t old = word_.fetch_add(kOne, std::memory_order_acquire);
        if (__builtin_expect((old & (kClosed | kQueued)) != 0, 0)) enter_slow();
    }
    /// Leaves the gate entered by enter().
    void leave() noexcept { word_.fetch_sub(kOne, std::memory_order_release); }

    /// Closes the gate and waits up to timeout_ms for calls in flight to finish.
    /// Returns 0 when closed and drained. On timeout reopens the gate (the
    /// process keeps running as before) and returns ETIMEDOUT. Returns EALREADY
    /// when the gate was already closed.
    int close(uint64_t timeout_ms) noexcept;
    /// Opens the gate; queued threads continue in arrival order. Returns
    /// EALREADY when the gate was already open.
    int open() noexcept;

    bool is_closed() const noexcept { return (word_.load(std::memory_order_acquire) & kClosed) != 0; }
    uint64_t in_flight() const noexcept { return word_.load(std::memory_order_acquire) / kOne; }
    /// Threads waiting at the gate now.
    uint64_t waiting() const noexcept;

    /// pthread_atfork handlers: the child has one thread, so it starts with an
    /// open, empty gate and fresh locks.
    void atfork_prepare() noexcept;
    void atfork_parent() noexcept;
    void atfork_child() noexcept;

private:
    void enter_slow() noexcept;

    std::atomic<uint64_t> word_{0};
    pthread_mutex_t mu_ = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv_ = PTHREAD_COND_INITIALIZER;
    uint64_t next_ticket_ = 0;  ///< guarded by mu_
    uint64_t serving_ = 0;      ///< guarded by mu_
};

/// The process's gate. Constant-initialized: usable before any constructor runs.
Gate& gate() noexcept;

/// Enters the process gate for the lifetime of the object.
class GateGuard {
public:
    GateGuard() noexcept { gate().enter(); }
    ~GateGuard() { gate().leave(); }
    GateGuard(const GateGuard&) = delete;
    GateGuard& operator=(const GateGuard&) = delete;
};

}  // namespace cusnap::shim
