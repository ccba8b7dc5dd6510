// SharedMemory's quiesce against a fake shim served by a thread of the test
// process (the shim of process getpid()): its control socket answers one
// connection at a time, as the real shim's listener does.
#include "coord/shared_memory.h"

#include <unistd.h>

#include <doctest/doctest.h>

#include <poll.h>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "proto/shim_messages.h"
#include "proto/wire.h"

using namespace cusnap;
using namespace std::chrono_literals;

namespace {

/// A shim's control socket in a temporary directory, served by one thread.
/// drain_takes: how long a drain request keeps the listener busy;
/// refuse_opens: how many gate-open requests are answered with a failure.
struct FakeShim {
  std::string dir;
  UniqueFd listen;
  std::atomic<bool> closed{false}, stop{false};
  std::atomic<int> opens{0};
  std::chrono::milliseconds drain_takes{0};
  int refuse_opens = 0;
  std::thread thread;

  FakeShim() {
    char t[] = "/tmp/cusnap-shm-XXXXXX";
    REQUIRE(mkdtemp(t));
    dir = t;
    std::string err;
    REQUIRE(proto::listen_unix(proto::shim_control_socket(dir, getpid()), 0600, &listen, &err));
  }
  void start() {
    thread = std::thread([this] { run(); });
  }
  ~FakeShim() {
    stop = true;
    if (thread.joinable()) thread.join();
    (void)!system(("rm -rf " + dir).c_str());
  }

  void run() {
    while (!stop) {
      pollfd p{listen.get(), POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      UniqueFd conn;
      std::string err;
      if (!proto::accept_unix(listen.get(), &conn, &err)) continue;
      proto::Channel ch(std::move(conn), 5000ms);
      for (;;) {
        proto::Message m;
        if (!ch.recv(&m, &err)) break;
        proto::Done d;
        bool sent;
        if (m.type == proto::kMsgShimInspect) {
          proto::ShimRecords r;
          r.pid = getpid();
          sent = ch.send(proto::kMsgShimRecords, r, &err);
        } else {
          if (m.type == proto::kMsgGateClose) {
            d.ok = !closed.exchange(true);
          } else if (m.type == proto::kMsgShimDrain) {
            std::this_thread::sleep_for(drain_takes);
            d.ok = true;
          } else if (m.type == proto::kMsgGateOpen) {
            if (opens++ < refuse_opens) {
              d.error = "refused for the test";
            } else {
              d.code = closed.exchange(false) ? 0 : EALREADY;
              d.ok = true;
            }
          }
          sent = ch.send(proto::kMsgDone, d, &err);
        }
        if (!sent) break;
      }
    }
  }
};

SharedTimeouts short_timeouts() {
  SharedTimeouts t;
  t.control = 300ms;
  t.phase = 300ms;
  return t;
}

}  // namespace

TEST_CASE("shared memory: a quiesce whose drain times out opens the gate again, retrying") {
  FakeShim shim;
  shim.drain_takes = 700ms;  // past the phase: the coordinator gives up on the drain
  shim.refuse_opens = 1;     // and the first open after it fails
  shim.start();
  SharedMemory sm;
  std::string err;
  REQUIRE(sm.inspect(shim.dir, {getpid()}, short_timeouts(), &err));
  CHECK_FALSE(sm.quiesce(&err));
  CHECK(err.find("quiesce phase") != std::string::npos);
  // The open was tried again until the shim, done with the drain, took it.
  CHECK_FALSE(shim.closed.load());
  CHECK(shim.opens.load() >= 2);
  CHECK(sm.gates_left_closed().empty());
  CHECK(err.find("may still be closed") == std::string::npos);
  sm.disconnect();
}

TEST_CASE("shared memory: a gate that cannot be opened again is named, not called unchanged") {
  FakeShim shim;
  shim.drain_takes = 4000ms;  // busy past every try to open the gate again
  shim.start();
  SharedMemory sm;
  std::string err;
  REQUIRE(sm.inspect(shim.dir, {getpid()}, short_timeouts(), &err));
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(sm.quiesce(&err));
  CHECK(std::chrono::steady_clock::now() - t0 < 3500ms);  // bounded, while the shim is busy
  INFO(err);
  CHECK(shim.closed.load());
  REQUIRE(sm.gates_left_closed() == std::vector<pid_t>{getpid()});
  CHECK(err.find("the gate of process " + std::to_string(getpid()) + " may still be closed") !=
        std::string::npos);
  CHECK(err.find("does not run on unchanged") != std::string::npos);
  // Once the shim is free again, an open succeeds and the list empties.
  std::string why;
  bool opened = false;
  for (int i = 0; i < 50 && !opened; ++i) {
    why.clear();
    opened = sm.open_gates(&why);
    if (!opened) std::this_thread::sleep_for(100ms);
  }
  CHECK(opened);
  CHECK_FALSE(shim.closed.load());
  CHECK(sm.gates_left_closed().empty());
  sm.disconnect();
}
