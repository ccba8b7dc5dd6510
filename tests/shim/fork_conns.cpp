// The listeners' connections across a fork the application makes, under the
// preloaded shim against the simulated driver: ctest shim.track.fork_conns.
//
// A workload process (forked before any CUDA activity, its control timeout
// 2 s) acts on the test's commands; the test's own process is the
// coordinator. The test holds a control connection (one exchange made, then
// the gate closed and the first of a save's two parts sent: the listener
// holds its part file until the second comes) and a silent connection to the
// peer socket of the workload's shim, then the workload forks a child that
// stays alive.
//   - the child holds no descriptor of either connection: none of its
//     sockets (/proc/CHILD/fd) is one of the sockets the workload gained when
//     the two connected (their inodes); it does hold the workload's own
//     command socket, which shows the listing sees what a child inherits
//   - the child holds no descriptor of the part file, which the workload
//     holds (before the fix the child kept a copy: a file of the checkpoint
//     held open, a memory file's pages kept, by a process that never saw it)
//   - the test's two connections reach their end (EOF) when the workload's
//     listeners close them at the control timeout, although the child is
//     alive (before the fix the child kept copies of both: no EOF while it
//     lived, and the child held the parent's connections)
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <set>
#include <string>

#include "tests/fakecuda/fakecuda_test_util.h"
#include "tests/shim/ckpt_client.h"
#include "tests/shim/workload_cmds.h"

using namespace fctest;
using namespace ckpt_client;
using cmds::command;
using cmds::sockets_of;
using Clock = std::chrono::steady_clock;

namespace {

constexpr long kControlTimeoutMs = 2000;  // $CUSNAP_CONTROL_TIMEOUT of the workload

enum Cmd : uint64_t {
  kInit = 1,  // context (the shim's listeners start)
  kFork,      // forks a child that waits to be killed; replies its pid
  kReap,      // kills and reaps that child
};

pid_t g_child = -1;  // in the workload

int act(uint64_t cmd, uint64_t* value) {
  switch (cmd) {
    case kInit:
      FC_REQ(init_primary() == CUDA_SUCCESS);
      return 0;
    case kFork:
    case kReap:
      return cmds::fork_or_reap(cmd == kFork, &g_child, value);
    default:
      return 1;
  }
}

Child g_workload;

/// Waits up to ms for the end of fd's stream (nothing else is sent on it).
bool eof_within(int fd, long ms) {
  const auto t0 = Clock::now();
  for (;;) {
    const long left = ms - cmds::ms_since(t0);
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char c;
    const ssize_t r = ::recv(fd, &c, 1, MSG_DONTWAIT);
    if (r == 0) return true;
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;  // reset
    if (r > 0) return false;  // nothing is expected
  }
}

int run() {
  setenv("CUSNAP_CONTROL_TIMEOUT", std::to_string(kControlTimeoutMs / 1000).c_str(), 1);
  g_workload = spawn([](int sock) { return cmds::serve(sock, act); });
  REQ(g_workload.pid > 0);
  REQ(command(g_workload, kInit));
  const auto before = sockets_of(g_workload.pid);

  // A control connection with one exchange made (and a save begun, below),
  // and a silent one to the peer socket: both accepted by the workload's
  // listeners.
  Shim ctl;
  REQ(ctl.connect(g_workload.pid));
  proto::ShimRecords r;
  REQ(ctl.inspect(&r));
  // The first of a save's two parts: the listener holds the file for the next.
  const char* const kPartTag = "part-of-a-save";
  {
    UniqueFd part(open((g_dir + "/" + kPartTag).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    REQ(part);
    REQ(ctl.gate_close().ok);
    proto::AllocationRequest req;
    req.allocation = 1;
    req.part = 0;
    req.parts = 2;
    REQ(ctl.call(proto::kMsgShimSave, req, part.get()).ok);
  }
  REQ(proc_traces(g_workload.pid, kPartTag) == 1);
  UniqueFd peer;
  std::string err;
  REQ(proto::connect_unix(proto::shim_peer_socket(g_dir, g_workload.pid), kTimeout, &peer, &err));
  // Both accepted (the peer listener takes its own time): up to 5 s.
  std::set<std::string> conns;
  for (int i = 0; i < 500 && conns.size() < 2; ++i) {
    if (i > 0) usleep(10000);
    conns.clear();
    for (auto& [ino, fd] : sockets_of(g_workload.pid))
      if (!before.count(ino)) conns.insert(ino);
  }
  for (auto& ino : conns) fprintf(stderr, "the workload's connection: %s\n", ino.c_str());
  REQ(conns.size() == 2);

  uint64_t child = 0;
  REQ(command(g_workload, kFork, &child) && child > 0);
  bool ok = true;
  bool inherited = false;
  for (auto& [ino, fd] : sockets_of(static_cast<pid_t>(child))) {
    if (conns.count(ino)) {
      fprintf(stderr, "the child holds the workload's connection %s as descriptor %d\n",
              ino.c_str(), fd);
      ok = false;
    }
    inherited = inherited || before.count(ino);
  }
  fprintf(stderr, "the child %s the workload's command socket\n",
          inherited ? "inherited" : "did not inherit");
  ok = ok && inherited;
  const int part_copies = proc_traces(static_cast<pid_t>(child), kPartTag);
  fprintf(stderr, "the child holds %d descriptor(s) of the part file\n", part_copies);
  ok = ok && part_copies == 0;

  // The workload's listeners close both at the control timeout: their clients
  // see the end though the child lives.
  const bool ctl_eof = eof_within(ctl.ch.fd(), kControlTimeoutMs + 3000);
  const bool peer_eof = eof_within(peer.get(), kControlTimeoutMs + 3000);
  fprintf(stderr, "with the child alive: control connection %s, peer connection %s\n",
          ctl_eof ? "ended" : "still open", peer_eof ? "ended" : "still open");
  REQ(::kill(static_cast<pid_t>(child), 0) == 0);  // the child was alive throughout
  REQ(command(g_workload, kReap));
  REQ(ok && ctl_eof && peer_eof);
  REQ(cmds::finish(g_workload));
  return 0;
}

}  // namespace

int main() {
  return coordinator_main("shim.track.fork_conns", "forkconns", run, [] { g_workload.kill(); });
}
