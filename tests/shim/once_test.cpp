// OnceNumber and OncePointer (src/shim/once.h): made once, racing threads
// agree, and a fork child whose parent was making the value makes it itself
// where a function-local static's guard would hold it forever.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>
#include <vector>

#include "shim/once.h"

using cusnap::shim::OnceNumber;
using cusnap::shim::OncePointer;
using namespace std::chrono_literals;

TEST_CASE("OnceNumber: made on first use, then kept; racing threads agree") {
  OnceNumber n;
  int calls = 0;
  CHECK(n.get([&] { return ++calls, 42; }) == 42);
  CHECK(n.get([&] { return ++calls, 7; }) == 42);
  CHECK(calls == 1);
  OnceNumber zero;  // 0 is a value like any other
  CHECK(zero.get([] { return 0; }) == 0);
  CHECK(zero.get([] { return 5; }) == 0);

  OnceNumber raced;  // each thread would make its own: all get the one stored first
  std::atomic<int> made{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  std::vector<uint64_t> got(16);
  for (size_t i = 0; i < got.size(); ++i)
    ts.emplace_back([&, i] {
      while (!go) std::this_thread::yield();
      got[i] = raced.get([&] { return ++made, 100 + i; });
    });
  go = true;
  for (auto& t : ts) t.join();
  CHECK(made >= 1);
  CHECK(got[0] >= 100);
  for (uint64_t g : got) CHECK(g == got[0]);
}

TEST_CASE("OncePointer: one object kept, racing threads' extras discarded, a failed make retried") {
  OncePointer<int> p;
  int fails = 0;
  CHECK(p.get([&]() -> int* { return ++fails, nullptr; }, [](int*) {}) == nullptr);
  int* first = p.get([] { return new int(1); }, [](int* x) { delete x; });
  REQUIRE(first != nullptr);
  CHECK(p.get([] { return new int(2); }, [](int* x) { delete x; }) == first);
  CHECK(fails == 1);
  delete first;

  OncePointer<int> raced;
  std::atomic<int> made{0}, discarded{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  std::vector<int*> got(16);
  for (size_t i = 0; i < got.size(); ++i)
    ts.emplace_back([&, i] {
      while (!go) std::this_thread::yield();
      got[i] = raced.get([&] { return ++made, new int(int(i)); },
                         [&](int* x) { ++discarded, delete x; });
    });
  go = true;
  for (auto& t : ts) t.join();
  for (int* g : got) CHECK(g == got[0]);
  CHECK(made - discarded == 1);
  delete got[0];
}

namespace {

/// Forks while another thread is inside make(); the child's own first use
/// must return its own value within `limit` rather than wait on the parent's
/// thread. Returns the child's exit status (0: it did).
template <typename Use>
int fork_while_making(Use use_in_child, std::atomic<bool>* inside, std::atomic<bool>* release) {
  while (!*inside) std::this_thread::sleep_for(1ms);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    alarm(5);  // a child that waits forever is killed: SIGALRM
    _exit(use_in_child() ? 0 : 1);
  }
  *release = true;
  int status = 0;
  pid_t w;
  while ((w = waitpid(child, &status, 0)) < 0 && errno == EINTR) {
  }
  REQUIRE(w == child);
  return status;
}

}  // namespace

TEST_CASE("OnceNumber and OncePointer: a fork child makes the value the parent was making") {
  {
    static OnceNumber n;  // as the shim declares them
    std::atomic<bool> inside{false}, release{false};
    std::thread maker([&] {
      n.get([&] {
        inside = true;
        while (!release) std::this_thread::sleep_for(1ms);
        return 1;
      });
    });
    const int st =
        fork_while_making([] { return n.get([] { return 2; }) == 2; }, &inside, &release);
    maker.join();
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
    CHECK(n.get([] { return 3; }) == 1);  // the parent kept its own
  }
  {
    static OncePointer<int> p;
    static int parents = 1, childs = 2;
    std::atomic<bool> inside{false}, release{false};
    std::thread maker([&] {
      p.get(
          [&] {
            inside = true;
            while (!release) std::this_thread::sleep_for(1ms);
            return &parents;
          },
          [](int*) {});
    });
    const int st = fork_while_making(
        [] { return p.get([] { return &childs; }, [](int*) {}) == &childs; }, &inside, &release);
    maker.join();
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
    CHECK(p.get([] { return &childs; }, [](int*) {}) == &parents);
  }
}
