#include "shim/gate.h"
#include "shim/once.h"

#include <linux/membarrier.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <new>

namespace cusnap::shim {

namespace detail {
constinit Gate g_process_gate;
constinit std::atomic<int> g_fence_mode{0};
}  // namespace detail

using detail::g_fence_mode;

namespace {

// Slot registry, shared by every Gate: a thread's index is the same in all.
// g_used[i] is 1 while a live thread owns index i; g_high bounds the indices
// ever handed out (the closer scans below it).
std::atomic<uint8_t> g_used[Gate::kMaxThreads];
std::atomic<unsigned> g_high{0};

pthread_once_t g_once = PTHREAD_ONCE_INIT;
pthread_key_t g_key;
/// Whether g_key is the shim's. Without a key of its own (the process used
/// up PTHREAD_KEYS_MAX) no thread gets a slot, since none would be freed at
/// its exit: every thread takes the shared path. g_key's value is then not
/// the shim's (0 is the first key handed out, likely another library's) and
/// is never used.
bool g_key_ok = false;

long membarrier(int cmd) {
  return syscall(__NR_membarrier, cmd, 0, 0);
}

void release_slot(void* v) {
  Gate::release_thread_slot(v);
}

void init_once() {
  g_key_ok = pthread_key_create(&g_key, release_slot) == 0;
  const long q = membarrier(MEMBARRIER_CMD_QUERY);
  const bool ok = q > 0 && (q & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
                  membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
  g_fence_mode.store(ok ? 1 : 2, std::memory_order_seq_cst);
}

uint64_t now_ms() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000u + static_cast<uint64_t>(ts.tv_nsec) / 1000000u;
}

// Serializes every CPU running a thread of this process without membarrier:
// revoking access to a page this process has touched makes the kernel
// shoot down its TLB entries on each such CPU, an interrupt that drains the
// CPU's store buffer.
bool flush_by_mprotect() {
  static OncePointer<void> made;
  void* const page = made.get(
      [] {
        void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? nullptr : p;
      },
      [](void* extra) { munmap(extra, 4096); });
  if (!page) return false;
  if (mprotect(page, 4096, PROT_READ | PROT_WRITE) != 0) return false;
  static_cast<volatile char*>(page)[0] = 1;
  return mprotect(page, 4096, PROT_NONE) == 0;
}

// Makes every thread's earlier depth store visible before the closer reads
// the depths, or makes the closed bit visible to its next load (see gate.h).
// A process restored by CRIU may have lost its membarrier registration:
// register again; failing that, use the global barrier or the mprotect
// flush, and make every later entry fence for itself.
void closer_fence() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (g_fence_mode.load(std::memory_order_acquire) != 1) return;
  if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return;
  if (membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0 &&
      membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0)
    return;
  g_fence_mode.store(2, std::memory_order_seq_cst);
  if (membarrier(MEMBARRIER_CMD_GLOBAL) == 0) return;
  flush_by_mprotect();
}

}  // namespace

void Gate::release_thread_slot(void* v) noexcept {
  const auto i = static_cast<unsigned>(reinterpret_cast<uintptr_t>(v) - 1);
  t_slot_ = -1;  // thread-exit destructors that call the driver use the shared counter
  if (i >= kMaxThreads) return;
  // A thread that left a driver call by unwinding (pthread_cancel acted on
  // inside the driver, pthread_exit from a callback) never ran the wrapper's
  // leave(): its depth would keep every later close from draining, and pass
  // the next owner of the slot through a closed gate as a nested call. The
  // exiting thread is in no call.
  detail::g_process_gate.slots_[i].depth.store(0, std::memory_order_release);
  g_used[i].store(0, std::memory_order_release);
}

int Gate::claim_slot() noexcept {
  if (t_slot_ == -1) return -1;  // none left, or released at thread exit
  pthread_once(&g_once, init_once);
  if (!g_key_ok) {
    t_slot_ = -1;
    return -1;
  }
  for (unsigned i = 0; i < kMaxThreads; ++i) {
    uint8_t expect = 0;
    if (g_used[i].load(std::memory_order_relaxed) == 0 &&
        g_used[i].compare_exchange_strong(expect, 1, std::memory_order_acq_rel)) {
      unsigned high = g_high.load(std::memory_order_relaxed);
      while (high < i + 1 &&
             !g_high.compare_exchange_weak(high, i + 1, std::memory_order_acq_rel)) {
      }
      pthread_setspecific(g_key, reinterpret_cast<void*>(static_cast<uintptr_t>(i) + 1));
      t_slot_ = static_cast<int>(i);
      return t_slot_;
    }
  }
  t_slot_ = -1;
  return -1;
}

bool Gate::drained() const noexcept {
  if (word_.load(std::memory_order_acquire) / kOne != 0) return false;
  const unsigned high = g_high.load(std::memory_order_acquire);
  for (unsigned i = 0; i < high; ++i)
    if (slots_[i].depth.load(std::memory_order_acquire) != 0) return false;
  return true;
}

uint64_t Gate::in_flight() const noexcept {
  uint64_t n = word_.load(std::memory_order_acquire) / kOne;
  const unsigned high = g_high.load(std::memory_order_acquire);
  for (unsigned i = 0; i < high; ++i) n += slots_[i].depth.load(std::memory_order_acquire) != 0;
  return n;
}

size_t Gate::in_flight_calls(uint32_t* out, size_t max) const noexcept {
  size_t n = 0;
  const unsigned high = g_high.load(std::memory_order_acquire);
  for (unsigned i = 0; i < high && n < max; ++i)
    if (slots_[i].depth.load(std::memory_order_acquire) != 0)
      out[n++] = slots_[i].what.load(std::memory_order_relaxed);
  return n;
}

namespace {
/// Blocks, for the lifetime of the object, the signals that have a handler
/// of the application's (only a handler runs its code on this thread),
/// restoring the thread's mask after. Signals left to their default action
/// stay deliverable: SIGTERM and Ctrl-C still end a job whose threads wait
/// at the gate (during a suspend, for as long as it lasts).
class SignalsHeld {
 public:
  SignalsHeld() noexcept {
    sigset_t handled;
    sigemptyset(&handled);
    for (int sig = 1; sig < NSIG; ++sig) {
      struct sigaction sa {};
      if (sig == SIGKILL || sig == SIGSTOP || ::sigaction(sig, nullptr, &sa) != 0) continue;
      const bool runs_code = (sa.sa_flags & SA_SIGINFO) != 0
                                 ? sa.sa_sigaction != nullptr
                                 : sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN;
      if (runs_code) sigaddset(&handled, sig);
    }
    pthread_sigmask(SIG_BLOCK, &handled, &old_);
  }
  ~SignalsHeld() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  SignalsHeld(const SignalsHeld&) = delete;
  SignalsHeld& operator=(const SignalsHeld&) = delete;

 private:
  sigset_t old_{};
};
}  // namespace

void Gate::enter_slow(int slot) noexcept {
  // pthread_cond_wait is a cancellation point: a pthread_cancel acted on here
  // would unwind with mu_ held (the wait takes it again first) and the ticket
  // never served, stalling every later arrival and open(), or abort the
  // process where the unwinding meets a noexcept frame. Cancellation waits
  // until the thread is through; the application's next cancellation point
  // acts on a request that came meanwhile.
  const NoCancel no_cancel;
  // So do the thread's signals. A handler run here that calls the driver
  // (an application's SIGINT handler resetting its device, say) would find
  // the thread's depth 0, take the ticket after the thread's own and wait for
  // it for good, as would every later arrival (tickets are served in order);
  // one run while the thread holds mu_ would wait for mu_. Held until the
  // thread is through (its depth 1), such a handler's call is a nested one and
  // passes; a process-directed signal meanwhile goes to a thread not waiting.
  const SignalsHeld signals_held;
  pthread_mutex_lock(&mu_);
  const uint64_t ticket = next_ticket_++;
  word_.fetch_or(kQueued, std::memory_order_relaxed);
  // CLOSED only changes under mu_, so the test below cannot race with close().
  while ((word_.load(std::memory_order_acquire) & kClosed) != 0 || serving_ != ticket)
    pthread_cond_wait(&cv_, &mu_);
  if (slot >= 0)
    slots_[slot].depth.store(1, std::memory_order_relaxed);
  else
    word_.fetch_add(kOne, std::memory_order_relaxed);
  t_admission_ = serving_++;
  if (serving_ == next_ticket_) word_.fetch_and(~kQueued, std::memory_order_relaxed);
  pthread_cond_broadcast(&cv_);
  pthread_mutex_unlock(&mu_);
}

int Gate::close(uint64_t timeout_ms) noexcept {
  pthread_once(&g_once, init_once);
  pthread_mutex_lock(&mu_);
  const uint64_t old = word_.fetch_or(kClosed, std::memory_order_seq_cst);
  pthread_mutex_unlock(&mu_);
  if (old & kClosed) return EALREADY;
  closer_fence();
  // Saturated: a timeout past the clock's range (UINT64_MAX and the like, from
  // any caller in the process) waits until the calls drain, never wraps to a
  // deadline already gone.
  const uint64_t now = now_ms();
  const uint64_t deadline = timeout_ms > UINT64_MAX - now ? UINT64_MAX : now + timeout_ms;
  // Calls already inside the driver finish; new ones wait at the gate. A thread
  // that raced in before seeing CLOSED backs out shortly.
  for (unsigned spins = 0;; ++spins) {
    if (drained()) return 0;
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

/// Test hook: the fallback barrier, for the unit tests.
bool gate_flush_by_mprotect_for_test() noexcept {
  return flush_by_mprotect();
}

void Gate::atfork_prepare() noexcept {
  pthread_mutex_lock(&mu_);
}
void Gate::atfork_parent() noexcept {
  pthread_mutex_unlock(&mu_);
}
void Gate::atfork_child() noexcept {
  // Only the forking thread exists in the child; it was not inside the gate
  // (fork is not a driver call), so nothing is in flight or queued.
  new (&mu_) pthread_mutex_t(PTHREAD_MUTEX_INITIALIZER);
  new (&cv_) pthread_cond_t(PTHREAD_COND_INITIALIZER);
  next_ticket_ = serving_ = 0;
  word_.store(0, std::memory_order_relaxed);
  for (Slot& s : slots_) s.depth.store(0, std::memory_order_relaxed);
}

void gate_slots_atfork_child() noexcept {
  // Other threads' indices died with them; keep only the caller's.
  for (unsigned i = 0; i < Gate::kMaxThreads; ++i)
    if (static_cast<int>(i) != Gate::thread_slot()) g_used[i].store(0, std::memory_order_relaxed);
  // The child is a new process for membarrier: register it again.
  if (g_fence_mode.load(std::memory_order_relaxed) == 1 &&
      membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) != 0)
    g_fence_mode.store(2, std::memory_order_seq_cst);
}

}  // namespace cusnap::shim
