// The gate on its own (linked from the shim's static gate library).
#include <doctest/doctest.h>

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "shim/gate.h"

using cusnap::shim::Gate;
using namespace std::chrono_literals;

namespace {
template <class Pred>
bool wait_for(Pred p, std::chrono::milliseconds limit = 2000ms) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (!p()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

struct CancelProbe {
  Gate* g;
  std::atomic<bool> through{false};
};

/// Enters and leaves g (waiting at the closed gate), then waits to be
/// cancelled (usleep is a cancellation point).
void* enter_then_await_cancel(void* p) {
  auto* probe = static_cast<CancelProbe*>(p);
  probe->g->enter();
  probe->g->leave();
  probe->through = true;
  for (;;) {
    pthread_testcancel();
    usleep(1000);
  }
  return nullptr;
}

/// A thread inside g (a call in flight) until release is set.
struct CallInside {
  Gate& g;
  std::atomic<bool> release{false};
  std::thread t{[this] {
    g.enter();
    while (!release) std::this_thread::sleep_for(1ms);
    g.leave();
  }};
  ~CallInside() {
    release = true;
    t.join();
  }
};

/// The gate a SIGUSR1 handler enters and leaves (a handler that calls the
/// driver), and whether it ran.
std::atomic<Gate*> g_handler_gate{nullptr};
std::atomic<int> g_handler_runs{0};
void enter_in_handler(int) {
  Gate* g = g_handler_gate.load();
  g->enter();
  g->leave();
  ++g_handler_runs;
}

void* enter_process_gate_and_exit(void*) {
  cusnap::shim::gate().enter();
  pthread_exit(nullptr);
}
}  // namespace

TEST_SUITE("shim.gate") {
  TEST_CASE("open gate: enter and leave count calls in flight") {
    auto gp = std::make_unique<Gate>();
    Gate& g = *gp;
    CHECK_FALSE(g.is_closed());
    g.enter();
    CHECK(g.in_flight() == 1);
    g.enter();  // nested on the same thread: still one thread inside
    CHECK(g.in_flight() == 1);
    std::thread other([&] {
      g.enter();
      CHECK(g.in_flight() == 2);
      g.leave();
    });
    other.join();
    g.leave();
    g.leave();
    CHECK(g.in_flight() == 0);
    CHECK(g.open() == EALREADY);
  }

  TEST_CASE("close waits for a call inside the driver to finish") {
    auto gp = std::make_unique<Gate>();
    Gate& g = *gp;
    std::atomic<bool> closed{false};
    auto inside = std::make_unique<CallInside>(g);
    REQUIRE(wait_for([&] { return g.in_flight() == 1; }));
    std::thread closer([&] {
      CHECK(g.close(5000) == 0);
      closed = true;
    });
    std::this_thread::sleep_for(50ms);
    CHECK_FALSE(closed.load());
    inside.reset();  // the call returns
    closer.join();
    CHECK(closed.load());
    CHECK(g.is_closed());
    CHECK(g.in_flight() == 0);
    CHECK(g.close(10) == EALREADY);
    CHECK(g.open() == 0);
  }

  TEST_CASE("close with a timeout that would wrap the clock waits for the call") {
    // now + timeout_ms past 2^64 wrapped to a deadline already gone: the
    // close timed out at once.
    for (const uint64_t timeout_ms : {UINT64_MAX, UINT64_MAX - 1000, uint64_t(1) << 63}) {
      CAPTURE(timeout_ms);
      auto gp = std::make_unique<Gate>();
      Gate& g = *gp;
      CallInside inside{g};
      REQUIRE(wait_for([&] { return g.in_flight() == 1; }));
      const auto t0 = std::chrono::steady_clock::now();  // before the releaser's 100 ms
      std::thread releaser([&] {
        std::this_thread::sleep_for(100ms);
        inside.release = true;
      });
      const int rc = g.close(timeout_ms);
      const auto took = std::chrono::steady_clock::now() - t0;
      releaser.join();
      CHECK(rc == 0);
      CHECK(took >= 50ms);
      CHECK(g.is_closed());
      CHECK(g.open() == 0);
    }
  }

  TEST_CASE("close times out, reopens and leaves the process running") {
    auto gp = std::make_unique<Gate>();
    Gate& g = *gp;
    g.enter();
    CHECK(g.close(30) == ETIMEDOUT);
    CHECK_FALSE(g.is_closed());
    g.enter();  // does not block
    g.leave();
    g.leave();
  }

  TEST_CASE("threads wait while closed and continue in arrival order") {
    auto gp = std::make_unique<Gate>();
    Gate& g = *gp;
    REQUIRE(g.close(1000) == 0);
    std::mutex mu;
    std::vector<int> order;
    std::vector<std::thread> ts;
    constexpr int kThreads = 6;
    std::vector<uint64_t> admitted(kThreads, 99);
    for (int i = 0; i < kThreads; ++i) {
      ts.emplace_back([&, i] {
        g.enter();
        admitted[i] = Gate::last_admission();
        {
          std::lock_guard<std::mutex> l(mu);
          order.push_back(i);
        }
        g.leave();
      });
      REQUIRE(wait_for([&] { return g.waiting() == static_cast<uint64_t>(i + 1); }));
    }
    std::this_thread::sleep_for(20ms);
    CHECK(order.empty());
    CHECK(g.in_flight() == 0);
    CHECK(g.open() == 0);
    for (auto& t : ts) t.join();
    REQUIRE(order.size() == kThreads);
    // Admitted strictly in arrival order (what they do after is theirs).
    for (int i = 0; i < kThreads; ++i) CHECK(admitted[i] == static_cast<uint64_t>(i));
    CHECK(g.waiting() == 0);
    g.enter();  // fast path again
    CHECK(g.in_flight() == 1);
    g.leave();
  }

  TEST_CASE("a waiter closed out again keeps its place") {
    auto gp = std::make_unique<Gate>();
    Gate& g = *gp;
    REQUIRE(g.close(1000) == 0);
    std::atomic<int> entered{0};
    std::thread t([&] {
      g.enter();
      ++entered;
      g.leave();
    });
    REQUIRE(wait_for([&] { return g.waiting() == 1; }));
    CHECK(g.open() == 0);
    REQUIRE(wait_for([&] { return entered.load() == 1; }));
    t.join();
    CHECK(g.close(1000) == 0);
    CHECK(g.open() == 0);
  }

  TEST_CASE("fork child: an open, empty gate") {
    auto gp = std::make_unique<Gate>();
    Gate& g = *gp;
    REQUIRE(g.close(1000) == 0);
    g.atfork_prepare();
    g.atfork_child();
    CHECK_FALSE(g.is_closed());
    CHECK(g.in_flight() == 0);
    CHECK(g.waiting() == 0);
    g.enter();
    g.leave();
  }

  TEST_CASE("a nested call inside the gate does not wait") {
    auto gp = std::make_unique<Gate>();
    Gate& g = *gp;
    g.enter();
    std::thread closer([&] { CHECK(g.close(5000) == 0); });
    REQUIRE(wait_for([&] { return g.is_closed(); }));
    g.enter();  // the driver calling back into the API on this thread
    g.leave();
    g.leave();
    closer.join();
    CHECK(g.open() == 0);
  }

  TEST_CASE("slot-less threads take the shared counter") {
    auto gp = std::make_unique<Gate>();
    Gate& g = *gp;
    // A thread past its exit handler has no slot; it is still counted.
    std::thread t([&] {
      Gate::release_thread_slot(reinterpret_cast<void*>(uintptr_t{0}));
      CHECK(Gate::thread_slot() == -1);
      g.enter();
      CHECK(g.in_flight() == 1);
      CHECK(g.close(20) == ETIMEDOUT);
      g.leave();
      CHECK(g.close(1000) == 0);
      CHECK(g.open() == 0);
    });
    t.join();
  }

  TEST_CASE("the fallback process-wide barrier runs") {
    CHECK(cusnap::shim::gate_flush_by_mprotect_for_test());
  }

  TEST_CASE("many threads through an open gate") {
    auto gp = std::make_unique<Gate>();
    Gate& g = *gp;
    std::vector<std::thread> ts;
    std::atomic<long> calls{0};
    std::atomic<bool> stop{false};
    // Set between a close that returned and the open after it: a thread that
    // sees it from inside the gate got through (or stayed in) a closed gate.
    std::atomic<bool> closed{false};
    std::atomic<long> inside_closed{0};
    for (int i = 0; i < 4; ++i)
      ts.emplace_back([&] {
        while (!stop.load()) {
          g.enter();
          for (int w = 0; w < 50; ++w) std::atomic_signal_fence(std::memory_order_seq_cst);
          if (closed.load()) ++inside_closed;
          ++calls;
          g.leave();
        }
      });
    // Close and open while they run: every close drains, and no thread is
    // inside while it is closed. (in_flight() may read 1 for a moment here:
    // a thread that stored its depth after the closer's fence sees CLOSED and
    // backs out.)
    bool stuck = false;  // the threads stopped passing an open gate
    for (int k = 0; k < 50 && !stuck; ++k) {
      const long seen = calls.load();
      const auto until = std::chrono::steady_clock::now() + 10s;
      while (calls.load() < seen + 200 && std::chrono::steady_clock::now() < until)
        std::this_thread::yield();  // they are passing
      if (calls.load() < seen + 200) {
        stuck = true;
        break;
      }
      CHECK(g.close(5000) == 0);
      closed.store(true);
      const long before = calls.load();
      for (int y = 0; y < 200; ++y) std::this_thread::yield();
      CHECK(calls.load() == before);
      closed.store(false);
      CHECK(g.open() == 0);
    }
    stop.store(true);
    for (auto& t : ts) t.join();
    CHECK_FALSE(stuck);
    CHECK(inside_closed.load() == 0);
    CHECK(g.in_flight() == 0);
  }

  TEST_CASE("pthread_cancel of a thread waiting at the closed gate acts once it is through") {
    // Leaked if the cancellation broke it: the thread would have died holding
    // the gate's lock, and opening or destroying it would hang.
    auto* g = new Gate;
    REQUIRE(g->close(1000) == 0);
    CancelProbe probe{g};
    pthread_t t;
    REQUIRE(pthread_create(&t, nullptr, enter_then_await_cancel, &probe) == 0);
    REQUIRE(wait_for([&] { return g->waiting() == 1; }));
    REQUIRE(pthread_cancel(t) == 0);
    std::this_thread::sleep_for(100ms);
    void* ret = nullptr;
    const bool ended_waiting = pthread_tryjoin_np(t, &ret) == 0;
    CHECK_FALSE(ended_waiting);  // cancelled inside the wait
    if (ended_waiting) return;
    CHECK(g->waiting() == 1);
    CHECK_FALSE(probe.through.load());
    CHECK(g->open() == 0);
    // Once through, the pending cancellation ends it at its next cancellation point.
    timespec until{};
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    REQUIRE(pthread_timedjoin_np(t, &ret, &until) == 0);
    CHECK(ret == PTHREAD_CANCELED);
    CHECK(probe.through.load());
    // The gate goes on: nothing in flight or waiting, it closes and opens.
    CHECK(g->waiting() == 0);
    CHECK(g->in_flight() == 0);
    CHECK(g->close(1000) == 0);
    CHECK(g->open() == 0);
    g->enter();
    g->leave();
    delete g;
  }

  TEST_CASE("a signal handler that enters the gate while its thread waits there") {
    // Before: the handler, run on the waiting thread (depth 0), took the
    // ticket after the thread's own and waited for it for good, and so did
    // every later arrival. Leaked in that case (threads wait in it).
    auto* g = new Gate;
    g_handler_gate = g;
    g_handler_runs = 0;
    struct sigaction sa {
    }, old{};
    sa.sa_handler = enter_in_handler;
    sigemptyset(&sa.sa_mask);
    REQUIRE(sigaction(SIGUSR1, &sa, &old) == 0);
    REQUIRE(g->close(1000) == 0);
    std::atomic<bool> through{false};
    std::thread waiter([&] {
      g->enter();
      g->leave();
      through = true;
    });
    REQUIRE(wait_for([&] { return g->waiting() == 1; }));
    REQUIRE(pthread_kill(waiter.native_handle(), SIGUSR1) == 0);
    std::this_thread::sleep_for(100ms);
    CHECK(g->waiting() == 1);  // the handler waits for the gate with its thread
    CHECK(g_handler_runs == 0);
    CHECK(g->open() == 0);
    const bool ok = wait_for([&] { return through.load(); });
    CHECK(ok);
    CHECK(g_handler_runs == 1);
    // Later arrivals get through; the gate closes and opens as before.
    std::atomic<bool> later{false};
    std::thread after([&] {
      g->enter();
      g->leave();
      later = true;
    });
    CHECK(wait_for([&] { return later.load(); }));
    if (!ok || !later) {  // stuck in the gate for good: leave them and the gate
      waiter.detach();
      after.detach();
      sigaction(SIGUSR1, &old, nullptr);
      return;
    }
    waiter.join();
    after.join();
    CHECK(g->close(1000) == 0);
    CHECK(g->open() == 0);
    sigaction(SIGUSR1, &old, nullptr);
    delete g;
  }

  TEST_CASE("a signal left to its default action still ends a process waiting at the gate") {
    // Only signals with a handler are held during the wait: a job whose
    // threads wait at the gate (a suspend) still ends on SIGTERM.
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      signal(SIGTERM, SIG_DFL);
      Gate& g = cusnap::shim::gate();
      if (g.close(1000) != 0) _exit(3);
      std::thread waiter([&] {
        g.enter();
        g.leave();
      });
      // This thread too waits at the gate: no thread of the process is free.
      g.enter();
      _exit(4);
    }
    std::this_thread::sleep_for(300ms);
    REQUIRE(kill(child, SIGTERM) == 0);
    int status = 0;
    const bool ended = wait_for([&] { return waitpid(child, &status, WNOHANG) == child; }, 3000ms);
    if (!ended) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
    }
    CHECK(ended);
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGTERM);
  }

  TEST_CASE("the cancellation state a thread had is restored after the gate's wait") {
    auto gp = std::make_unique<Gate>();
    Gate& g = *gp;
    REQUIRE(g.close(1000) == 0);
    int state_after = -1;
    std::thread t([&] {
      int old = -1;
      pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
      g.enter();  // waits, then restores DISABLE
      g.leave();
      pthread_setcancelstate(old, &state_after);
    });
    REQUIRE(wait_for([&] { return g.waiting() == 1; }));
    CHECK(g.open() == 0);
    t.join();
    CHECK(state_after == PTHREAD_CANCEL_DISABLE);
  }

  TEST_CASE("a thread that exits inside the process gate does not keep it from draining") {
    // As when pthread_cancel is acted on inside the driver: the wrapper's
    // leave() never runs, the thread's exit handler clears its depth.
    Gate& g = cusnap::shim::gate();
    pthread_t t;
    REQUIRE(pthread_create(&t, nullptr, enter_process_gate_and_exit, nullptr) == 0);
    REQUIRE(pthread_join(t, nullptr) == 0);
    CHECK(g.in_flight() == 0);
    CHECK(g.close(200) == 0);
    CHECK(g.open() == 0);
    // The slot's next owner starts outside the gate: a closed gate holds it.
    REQUIRE(g.close(200) == 0);
    std::atomic<bool> entered{false};
    std::thread next([&] {
      g.enter();
      entered = true;
      g.leave();
    });
    std::this_thread::sleep_for(50ms);
    CHECK_FALSE(entered.load());
    CHECK(g.open() == 0);
    next.join();
    CHECK(entered.load());
  }
}
