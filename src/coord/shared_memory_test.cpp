// SharedMemory's quiesce against a fake shim served by a thread of the test
// process (the shim of process getpid()): its control socket answers one
// connection at a time, as the real shim's listener does.
#include "coord/shared_memory.h"

#include <signal.h>
#include <sys/wait.h>
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
/// refuse_opens: how many gate-open requests are answered with a failure;
/// close_times_out: a gate-close is answered ETIMEDOUT (the shim opened its
/// gate again), after close_takes. The cut: the process made `launched`
/// collective launches; armed until a release or a gate-open without keep_cut.
struct FakeShim {
  std::string dir;
  UniqueFd listen;
  std::atomic<bool> closed{false}, stop{false}, armed{false};
  std::atomic<int> opens{0}, releases{0};
  std::atomic<uint64_t> launched{0}, hold_ms{0};
  std::atomic<uint32_t> held{0};
  /// On "target": reach it (launched = target, nothing held any more), then
  /// go past it by `past` launches (a shim that dropped the cut).
  bool reach_target = false;
  uint64_t past = 0;
  /// Once its gate is closed, "status" reports the fewest launches on a GPU
  /// as this many (a first collective on a GPU after the cut), when not ~0.
  uint64_t closed_launched = ~0ull;
  std::chrono::milliseconds drain_takes{0}, close_takes{0};
  bool close_times_out = false;
  int refuse_opens = 0;
  bool refuse_releases = false;  ///< "release" answered with a failure
  /// What an inspect answers (its pid set to getpid()).
  proto::ShimRecords records;
  std::thread thread;

  /// In dir (a new temporary one when empty); the socket of process getpid().
  explicit FakeShim(std::string in = "") : dir(std::move(in)) {
    char t[] = "/tmp/cusnap-shm-XXXXXX";
    if (dir.empty()) {
      REQUIRE(mkdtemp(t));
      dir = t;
    }
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
          proto::ShimRecords r = records;
          r.pid = getpid();
          sent = ch.send(proto::kMsgShimRecords, r, &err);
        } else if (m.type == proto::kMsgShimCut) {
          proto::CutRequest req;
          proto::CutState st;
          st.ok = m.get(&req, &err);
          if (req.op == "arm") {
            armed = true;
            hold_ms = req.hold_ms;
          }
          if (req.op == "target" && reach_target) {
            launched = req.target + past;
            held = 0;
          }
          if (req.op == "release") {
            if (refuse_releases) {
              st.ok = false;
              st.error = "refused for the test";
            } else {
              armed = false;
            }
            ++releases;
          }
          st.armed = armed;
          st.reserved = st.launched = launched;
          if (closed && closed_launched != ~0ull) st.launched = closed_launched;
          st.held = held;
          st.target = req.target;
          sent = ch.send(proto::kMsgShimCutState, st, &err);
        } else {
          if (m.type == proto::kMsgGateClose) {
            std::this_thread::sleep_for(close_takes);
            if (close_times_out)
              d.code = ETIMEDOUT;
            else
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
              proto::GateOpen g;
              if (!m.get(&g, &err) || !g.keep_cut) armed = false;
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

TEST_CASE(
    "shared memory: a foreign import refuses, naming IPC handles of blocks left to the driver") {
  FakeShim shim;
  shim.records.foreign_imports_alive = 1;
  shim.records.foreign_imports_total = 1;
  shim.start();
  SharedMemory sm;
  std::string err;
  CHECK_FALSE(sm.inspect(shim.dir, {getpid()}, short_timeouts(), &err));
  CHECK(err.find("holds 1 imported allocation(s) or IPC mapping(s) that did not come from a "
                 "cusnap shim") != std::string::npos);
  CHECK(err.find("left to the driver") == std::string::npos);  // none handed out
  shim.records.driver_blocks = 1;
  shim.records.driver_ipc_exports = 2;
  shim.records.driver_block_why = "cuMemCreate gave 2";
  CHECK_FALSE(sm.inspect(shim.dir, {getpid()}, short_timeouts(), &err));
  CHECK(err.find("Likely where they came from: process " + std::to_string(getpid()) +
                 " handed out 2 IPC handle(s) of cuMemAlloc blocks its shim left to the driver "
                 "(cuMemCreate gave 2)") != std::string::npos);
  CHECK(err.find("error 2 (CUDA_ERROR_OUT_OF_MEMORY) is a GPU nearly full") != std::string::npos);
  // Handed out but opened by no one: nothing refuses.
  shim.records.foreign_imports_alive = 0;
  CHECK(sm.inspect(shim.dir, {getpid()}, short_timeouts(), &err));
  sm.disconnect();
}

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

TEST_CASE("shared memory: a gate close that times out after the cut lets the cut go") {
  FakeShim shim;
  shim.launched = 3;
  shim.close_times_out = true;  // a driver call outlasts the wait: the shim opened its gate again
  shim.start();
  SharedMemory sm;
  std::string err;
  REQUIRE(sm.inspect(shim.dir, {getpid()}, short_timeouts(), &err));
  REQUIRE(sm.cut(&err));
  CHECK(shim.armed.load());
  CHECK_FALSE(sm.quiesce(&err));
  INFO(err);
  // No gate was closed, so no gate-open lets the held launches go: the
  // quiesce must release the cut itself, or the job stalls at its next
  // collective launch.
  CHECK_FALSE(shim.armed.load());
  CHECK(sm.gates_left_closed().empty());
  sm.disconnect();
}

TEST_CASE("shared memory: the cut is let go through a new connection after one was dropped") {
  FakeShim shim;
  shim.launched = 3;
  shim.close_times_out = true;
  shim.close_takes = 900ms;  // answered after the coordinator's exchange gave up (600 ms)
  shim.start();
  SharedMemory sm;
  std::string err;
  REQUIRE(sm.inspect(shim.dir, {getpid()}, short_timeouts(), &err));
  REQUIRE(sm.cut(&err));
  CHECK_FALSE(sm.quiesce(&err));
  INFO(err);
  CHECK_FALSE(shim.armed.load());
  CHECK(shim.releases.load() >= 1);
  CHECK(err.find("letting the cut go failed") == std::string::npos);
  sm.disconnect();
}

TEST_CASE("shared memory: the cut is armed for as long as the operation may need it") {
  FakeShim shim;
  shim.launched = 3;
  shim.start();
  SharedMemory sm;
  std::string err;
  REQUIRE(sm.inspect(shim.dir, {getpid()}, short_timeouts(), &err));
  REQUIRE(sm.cut(&err));
  // The cut's wait and the quiesce's tries (the phase each), the gate close
  // and drain of its one process (the phase each) and the exchanges.
  CHECK(shim.hold_ms.load() == (2 + 2) * 300 + (4 + 2) * 300);
  sm.cut_release();
  sm.disconnect();
}

TEST_CASE("shared memory: a process past the cut's target fails the cut, which is let go") {
  // Let go, or, where its shim refuses the release, named as still held.
  for (const bool refuse : {false, true}) {
    CAPTURE(refuse);
    FakeShim shim;
    shim.launched = 3;
    shim.reach_target = true;
    shim.past = 1;  // its shim let a held launch go: one collective past the others
    shim.refuse_releases = refuse;
    shim.start();
    SharedMemory sm;
    std::string err;
    REQUIRE(sm.inspect(shim.dir, {getpid()}, short_timeouts(), &err));
    CHECK_FALSE(sm.cut(&err));
    INFO(err);
    CHECK(err.find("past the cut at 3") != std::string::npos);
    CHECK(sm.cut_counts().empty());
    CHECK(shim.armed.load() == refuse);
    CHECK(sm.cut_left_armed() == refuse);
    // Not "nothing changed": its launches stay held until its shim drops the cut.
    CHECK((err.find("then letting the cut go failed (") != std::string::npos) == refuse);
    if (refuse) {
      CHECK(err.find("process " + std::to_string(getpid())) != std::string::npos);
      // The hold it asked for (short_timeouts: (2 + 2) * 0.3 s + (4 + 2) * 0.3 s, 3 s).
      CHECK(err.find("the hold this operation asked for (3 s)") != std::string::npos);
      CHECK(shim.releases.load() >= 3);  // tried kReopenAttempts times
      shim.refuse_releases = false;
      CHECK(sm.cut_release());
    }
    sm.disconnect();
  }
}

TEST_CASE("shared memory: a GPU not at the cut once the gate closed fails the quiesce") {
  FakeShim shim;
  shim.launched = 3;
  shim.closed_launched = 1;  // a first collective on another GPU passed the target of 3
  shim.start();
  SharedMemory sm;
  std::string err;
  REQUIRE(sm.inspect(shim.dir, {getpid()}, short_timeouts(), &err));
  REQUIRE(sm.cut(&err));
  CHECK_FALSE(sm.quiesce(&err));  // the fake's drain would succeed
  INFO(err);
  CHECK(err.find("process " + std::to_string(getpid()) +
                 " is not at the cut's 3 collective "
                 "launches (the most on one of its GPUs 3, the fewest 1") != std::string::npos);
  CHECK(err.find("nothing was changed") != std::string::npos);
  // The gate is open again and the cut let go: the job runs on.
  CHECK_FALSE(shim.closed.load());
  CHECK_FALSE(shim.armed.load());
  CHECK(sm.gates_left_closed().empty());
  sm.disconnect();
}

TEST_CASE("shared memory: a rank at count 0 holding at its first collective joins the cut") {
  FakeShim shim;
  shim.launched = 3;
  // The other rank, a child process (the coordinator checks who serves each
  // socket): no collective launched yet, one thread holding at the first.
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    FakeShim rank(shim.dir);
    rank.held = 1;
    rank.reach_target = true;
    rank.run();
    _exit(0);
  }
  // Ended however the case ends: a child left running holds the test's
  // output open, and the run then never ends.
  struct KillChild {
    pid_t pid;
    ~KillChild() {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  } end_child{child};
  shim.start();
  const std::string sock = proto::shim_control_socket(shim.dir, child);
  for (int i = 0; i < 250 && access(sock.c_str(), F_OK) != 0; ++i)
    std::this_thread::sleep_for(20ms);  // until the child listens
  SharedMemory sm;
  std::string err;
  INFO(err);
  // Two processes on a loaded machine: no timing is tested here.
  SharedTimeouts timeouts;
  timeouts.control = 5s;
  timeouts.phase = 5s;
  REQUIRE(sm.inspect(shim.dir, {getpid(), child}, timeouts, &err));
  REQUIRE(sm.processes().size() == 2);
  CHECK(sm.cut(&err));
  INFO(err);
  CHECK(sm.cut_counts() == std::map<pid_t, uint64_t>{{getpid(), 3}, {child, 3}});
  sm.cut_release();
  sm.disconnect();
}
