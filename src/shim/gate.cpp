#include "shim/gate.h"

#include <cerrno>
#include <ctime>
#include <new>

namespace cusnap::shim {

namespace {
constinit Gate g_gate;

uint64_t now_ms() noexcept {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000u + static_cast<uint64_t>(ts.tv_nsec) / 1000000u;
}
}  // namespace

Gate& gate() noexcept { return g_gate; }

void Gate::enter_slow() noexcept {
    // Back out the optimistic increment: this thread is not in flight yet.
    word_.fetch_sub(kOne, std::memory_order_relaxed);
    pthread_mutex_lock(&mu_);
    const uint64_t ticket = next_ticket_++;
    word_.fetch_or(kQueued, std::memory_order_relaxed);
    // CLOSED only changes under mu_, so the test below cannot race with close().
    while ((word_.load(std::memory_order_acquire) & kClosed) != 0 || serving_ != ticket)
        pthread_cond_wait(&cv_, &mu_);
    word_.fetch_add(kOne, std::memory_order_acquire);
    ++serving_;
    if (serving_ == next_ticket_) word_.fetch_and(~kQueued, std::memory_order_relaxed);
    pthread_cond_broadcast(&cv_);
    pthread_mutex_unlock(&mu_);
}

int Gate::close(uint64_t timeout_ms) noexcept {
    pthread_mutex_lock(&mu_);
    const uint64_t old = word_.fetch_or(kClosed, std::memory_order_acq_rel);
    pthread_mutex_unlock(&mu_);
    if (old & kClosed) return EALREADY;
    const uint64_t deadline = now_ms() + timeout_ms;
    // Calls already inside the driver finish; new ones wait at the gate. A thread
    // that raced in between its fetch_add and noticing CLOSED backs out shortly.
    for (unsigned spins = 0;; ++spins) {
        if (word_.load(std::memory_order_acquire) / kOne == 0) return 0;
        if (now_ms() >= deadline) break;
        if (spins < 64) continue;
        timespec pause{0, spins < 1024 ? 20000 : 200000};
        nanosleep(&pause, nullptr);
    }
    open();
    return ETIMEDOUT;
}

int Gate::open() noexcept {
    pthread_mutex_lock(&mu_);
    const uint64_t old = word_.fetch_and(~kClosed, std::memory_order_release);
    pthread_cond_broadcast(&cv_);
    pthread_mutex_unlock(&mu_);
    return (old & kClosed) ? 0 : EALREADY;
}

uint64_t Gate::waiting() const noexcept {
    auto* self = const_cast<Gate*>(this);
    pthread_mutex_lock(&self->mu_);
    const uint64_t n = next_ticket_ - serving_;
    pthread_mutex_unlock(&self->mu_);
    return n;
}

void Gate::atfork_prepare() noexcept { pthread_mutex_lock(&mu_); }
void Gate::atfork_parent() noexcept { pthread_mutex_unlock(&mu_); }
void Gate::atfork_child() noexcept {
    // Only the forking thread exists in the child; it was not inside the gate
    // (fork is not a driver call), so nothing is in flight or queued.
    new (&mu_) pthread_mutex_t(PTHREAD_MUTEX_INITIALIZER);
    new (&cv_) pthread_cond_t(PTHREAD_COND_INITIALIZER);
    next_ticket_ = serving_ = 0;
    word_.store(0, std::memory_order_relaxed);
}

}  // namespace cusnap::shim
