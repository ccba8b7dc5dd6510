// The gate in a process that has used up its pthread keys (PTHREAD_KEYS_MAX)
// before the gate's first use: ctest shim.gate_no_key, a program of its own
// (the gate's registry is set up once per process). The registry gets no key
// of its own, so no thread gets a slot (none would be freed at its exit):
// every thread takes the shared path, the gate still closes, drains and
// opens, and no other library's thread-specific value is touched. Without
// the fix the registry took a slot and wrote its index into key 0, which its
// key_create had left in g_key: here one of the program's own keys.
#include <pthread.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

#include "shim/gate.h"

using cusnap::shim::Gate;

#define CHECK(cond)                                                      \
  do {                                                                   \
    if (!(cond)) {                                                       \
      fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond); \
      return 1;                                                          \
    }                                                                    \
  } while (0)

namespace {

int g_marks[PTHREAD_KEYS_MAX];

/// Whether every key in keys still holds its mark on this thread.
bool marks_kept(const std::vector<pthread_key_t>& keys) {
  for (size_t i = 0; i < keys.size(); ++i)
    if (pthread_getspecific(keys[i]) != &g_marks[i]) return false;
  return true;
}

}  // namespace

int main() {
  std::vector<pthread_key_t> keys;
  for (;;) {
    pthread_key_t k;
    const int rc = pthread_key_create(&k, nullptr);
    if (rc != 0) {
      CHECK(rc == EAGAIN);
      break;
    }
    CHECK(keys.size() < PTHREAD_KEYS_MAX);
    keys.push_back(k);
  }
  bool owns_key0 = false;
  for (size_t i = 0; i < keys.size(); ++i) {
    CHECK(pthread_setspecific(keys[i], &g_marks[i]) == 0);
    owns_key0 = owns_key0 || keys[i] == 0;
  }
  fprintf(stderr, "%zu keys taken by the program (key 0 %s)\n", keys.size(),
          owns_key0 ? "among them" : "taken before");

  Gate g;
  g.enter();  // the registry's set-up: no key left for it
  g.leave();
  CHECK(Gate::thread_slot() == -1);  // the shared path
  CHECK(marks_kept(keys));
  int other_slot = 0;
  std::thread([&] {
    g.enter();
    g.leave();
    other_slot = Gate::thread_slot();
  }).join();
  CHECK(other_slot == -1);

  // The gate works on the shared path: a call in flight holds up a close
  // until it leaves; a close with none drains at once.
  std::atomic<int> phase{0};
  std::thread inside([&] {
    g.enter();
    phase = 1;
    while (phase.load() != 2) std::this_thread::yield();
    g.leave();
  });
  while (phase.load() != 1) std::this_thread::yield();
  CHECK(g.in_flight() == 1);
  CHECK(g.close(50) == ETIMEDOUT);
  phase = 2;
  inside.join();
  CHECK(g.close(1000) == 0);
  CHECK(g.open() == 0);
  CHECK(marks_kept(keys));
  fprintf(stderr, "gate_no_key: passed\n");
  return 0;
}
