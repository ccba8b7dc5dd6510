// The gate on its own (linked from the shim's static gate library).
#include <doctest/doctest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
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
    std::atomic<bool> release{false}, closed{false};
    std::thread inside([&] {
      g.enter();
      while (!release) std::this_thread::sleep_for(1ms);
      g.leave();
    });
    REQUIRE(wait_for([&] { return g.in_flight() == 1; }));
    std::thread closer([&] {
      CHECK(g.close(5000) == 0);
      closed = true;
    });
    std::this_thread::sleep_for(50ms);
    CHECK_FALSE(closed.load());
    release = true;
    closer.join();
    inside.join();
    CHECK(closed.load());
    CHECK(g.is_closed());
    CHECK(g.in_flight() == 0);
    CHECK(g.close(10) == EALREADY);
    CHECK(g.open() == 0);
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
    for (int i = 0; i < 4; ++i)
      ts.emplace_back([&] {
        for (int k = 0; k < 20000; ++k) {
          g.enter();
          ++calls;
          g.leave();
        }
      });
    // Close and open while they run: every close drains.
    for (int k = 0; k < 20; ++k) {
      CHECK(g.close(5000) == 0);
      CHECK(g.in_flight() == 0);
      CHECK(g.open() == 0);
    }
    for (auto& t : ts) t.join();
    CHECK(calls.load() == 80000);
    CHECK(g.in_flight() == 0);
  }
}
