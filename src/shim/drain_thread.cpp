// The drain of a checkpoint's quiesce on a thread of its own, waited for a
// bounded time (track_state.h: drain_within).
//
// The drain synchronizes every context of the process: it waits for every
// kernel. A kernel may wait on a thread the gate holds (one polling a flag
// that thread would write through the driver; a collective whose progress
// needs a proxy thread's driver call) and then never ends while the gate is
// closed. Run on the control listener, such a drain held the listener: no
// gate-open reached the shim, no hold ran out, and the workload stood still
// for good. On its own thread the drain is waited for at most the request's
// time; then the listener answers ETIMEDOUT and goes on serving, the
// coordinator's gate-open lets the held thread on, the kernel ends, and the
// drain's thread with it: given up, it synchronizes nothing more (the
// application runs again, and a synchronize would invalidate a capture it
// begins). A request that names no time (an older client's) is waited for
// as long as the gate's hold (track_control.cpp, serve_control), never
// without end.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>

#include "proto/control.h"
#include "shim/gate.h"
#include "shim/once.h"
#include "shim/thread_start.h"
#include "shim/track_ckpt_internal.h"
#include "shim/track_state.h"

namespace cusnap::shim::track {

namespace {

struct Run {
  proto::Done result;
  bool done = false;
  /// The listener answered without it: it stops before its next
  /// synchronize (the application runs again once the gate opens, and may
  /// begin a capture that a synchronize would invalidate).
  std::atomic<bool> abandoned{false};
};

struct Drains {
  std::mutex mu;
  std::condition_variable cv;
  std::shared_ptr<Run> running;  ///< the run whose thread has not ended
};

/// Never destroyed: a drain thread may outlive the process's static
/// destructors (it ends with the process).
Drains& drains() {
  static OncePointer<Drains> d;
  return *d.get([] { return new Drains; }, [](Drains* extra) { delete extra; });
}

struct ThreadArg {
  State* s;
  std::shared_ptr<Run> run;
};

void* drain_main(void* p) noexcept {
  std::unique_ptr<ThreadArg> a(static_cast<ThreadArg*>(p));
  const std::shared_ptr<Run> run = a->run;
  proto::Done d;
  // Nothing may leave the thread (std::terminate): the predicate's
  // std::function may allocate, and a failure to is the drain's failure.
  try {
    d = drain(*a->s, [run] { return !run->abandoned.load() && gate().is_closed(); });
  } catch (...) {
    d.ok = false;
    d.error = "out of memory";  // within the string's own buffer: no allocation
  }
  Drains& ds = drains();
  std::lock_guard lk(ds.mu);
  a->run->result = std::move(d);
  a->run->done = true;
  if (ds.running == a->run) ds.running.reset();
  ds.cv.notify_all();
  return nullptr;
}

}  // namespace

proto::Done drain_within(State& s, uint64_t timeout_ms) noexcept {
  try {
    Drains& ds = drains();
    const uint64_t cap = uint64_t(proto::kMaxTimeoutMs);
    const uint64_t ms = timeout_ms < cap ? timeout_ms : cap;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    std::unique_lock lk(ds.mu);
    // Never unbounded: this is the control listener's thread, the only one
    // that serves a gate-open and opens a gate left unattended, and a drain
    // may never finish while the gate is closed (above). The caller chooses
    // the bound of a request that names none.
    auto wait = [&](auto until) { return ds.cv.wait_until(lk, deadline, until); };
    const std::string within = " within " + std::to_string(ms) + " ms";
    if (!wait([&] { return !ds.running; }))
      return fail("the device work that an earlier drain waits for did not finish" + within,
                  ETIMEDOUT);
    auto run = std::make_shared<Run>();
    auto* arg = new ThreadArg{&s, run};
    if (const int rc = start_detached(drain_main, arg); rc != 0) {
      delete arg;  // a drain on the listener could hold every later request
      return fail(std::string("no thread for the drain: ") + std::strerror(rc), EAGAIN);
    }
    ds.running = run;
    if (!wait([&] { return run->done; })) {
      run->abandoned = true;
      return fail("the device work did not finish" + within +
                      " (a kernel still runs; one that waits on a thread held at the gate ends "
                      "only once the gate opens); the drain is given up",
                  ETIMEDOUT);
    }
    return run->result;
  } catch (...) {
    return fail("out of memory");
  }
}

void drain_atfork_prepare() noexcept {
  drains().mu.lock();
}
void drain_atfork_parent() noexcept {
  drains().mu.unlock();
}
void drain_atfork_child() noexcept {
  Drains& ds = drains();
  ds.running.reset();  // its thread is the parent's
  new (&ds.cv) std::condition_variable;  // the parent's waiters are not ours
  ds.mu.unlock();
}

}  // namespace cusnap::shim::track
