// The listeners' connections across a fork the application makes, under the
// preloaded shim against the simulated driver: ctest shim.track.fork_conns.
//
// A workload process (forked before any CUDA activity, its control timeout
// 2 s) acts on the test's commands; the test's own process is the
// coordinator. The test holds a control connection (one exchange made) and a
// silent connection to the peer socket of the workload's shim, then the
// workload forks a child that stays alive.
//   - the child holds no descriptor of either connection: none of its
//     sockets (/proc/CHILD/fd) is one of the sockets the workload gained when
//     the two connected (their inodes); it does hold the workload's own
//     command socket, which shows the listing sees what a child inherits
//   - the test's two connections reach their end (EOF) when the workload's
//     listeners close them at the control timeout, although the child is
//     alive (before the fix the child kept copies of both: no EOF while it
//     lived, and the child held the parent's connections)
#include <dirent.h>
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
#include <map>
#include <set>
#include <string>

#include "tests/fakecuda/fakecuda_test_util.h"
#include "tests/shim/ckpt_client.h"

using namespace fctest;
using namespace ckpt_client;
using Clock = std::chrono::steady_clock;

namespace {

constexpr long kControlTimeoutMs = 2000;  // $CUSNAP_CONTROL_TIMEOUT of the workload

enum Cmd : uint64_t {
  kInit = 1,  // context (the shim's listeners start)
  kFork,      // forks a child that waits to be killed; replies its pid
  kReap,      // kills and reaps that child
  kFinish,
};

int workload(int sock) {
  pid_t child = -1;
  for (;;) {
    uint64_t cmd = 0, value = 0;
    if (!recv_u64(sock, &cmd)) return 1;
    switch (cmd) {
      case kInit:
        FC_REQ(init_primary() == CUDA_SUCCESS);
        break;
      case kFork: {
        // The reply waits until the child is past fork (its fork handlers ran).
        int ready[2];
        FC_REQ(pipe2(ready, O_CLOEXEC) == 0);
        child = fork();
        FC_REQ(child >= 0);
        if (child == 0) {
          prctl(PR_SET_PDEATHSIG, SIGKILL);  // ends with the workload
          close(ready[0]);
          if (write(ready[1], "r", 1) != 1) _exit(1);
          close(ready[1]);
          for (;;) pause();
        }
        close(ready[1]);
        char c = 0;
        FC_REQ(read(ready[0], &c, 1) == 1);
        close(ready[0]);
        value = static_cast<uint64_t>(child);
        break;
      }
      case kReap:
        if (child > 0) {
          kill(child, SIGKILL);
          waitpid(child, nullptr, 0);
          child = -1;
        }
        break;
      case kFinish:
        return 0;
      default:
        return 1;
    }
    if (!send_u64(sock, value)) return 1;
  }
}

Child g_workload;

bool command(uint64_t cmd, uint64_t* value = nullptr) {
  uint64_t r = ~0ull;
  if (!send_u64(g_workload.sock, cmd) || !recv_u64(g_workload.sock, &r)) {
    fprintf(stderr, "command %llu failed in the workload\n", (unsigned long long)cmd);
    return false;
  }
  if (value) *value = r;
  return true;
}

/// The sockets among pid's descriptors: inode -> descriptor number.
std::map<std::string, std::string> sockets_of(pid_t pid) {
  std::map<std::string, std::string> out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      char target[128];
      const ssize_t len = readlink((dir + "/" + e->d_name).c_str(), target, sizeof target - 1);
      const std::string t(target, len > 0 ? static_cast<size_t>(len) : 0);
      if (t.rfind("socket:", 0) == 0) out[t] = e->d_name;
    }
    closedir(d);
  }
  return out;
}

/// Waits up to ms for the end of fd's stream (nothing else is sent on it).
bool eof_within(int fd, long ms) {
  const auto t0 = Clock::now();
  for (;;) {
    const long left =
        ms - static_cast<long>(
                 std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count());
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
  g_workload = spawn(workload);
  REQ(g_workload.pid > 0);
  REQ(command(kInit));
  const auto before = sockets_of(g_workload.pid);

  // A control connection with one exchange made, and a silent one to the
  // peer socket: both accepted by the workload's listeners.
  Shim ctl;
  REQ(ctl.connect(g_workload.pid));
  proto::ShimRecords r;
  REQ(ctl.inspect(&r));
  UniqueFd peer;
  std::string err;
  REQ(proto::connect_unix(proto::shim_peer_socket(g_dir, g_workload.pid), kTimeout, &peer, &err));
  usleep(300000);
  std::set<std::string> conns;
  for (auto& [ino, fd] : sockets_of(g_workload.pid))
    if (!before.count(ino)) conns.insert(ino);
  for (auto& ino : conns) fprintf(stderr, "the workload's connection: %s\n", ino.c_str());
  REQ(conns.size() == 2);

  uint64_t child = 0;
  REQ(command(kFork, &child) && child > 0);
  bool ok = true;
  bool inherited = false;
  for (auto& [ino, fd] : sockets_of(static_cast<pid_t>(child))) {
    if (conns.count(ino)) {
      fprintf(stderr, "the child holds the workload's connection %s as descriptor %s\n",
              ino.c_str(), fd.c_str());
      ok = false;
    }
    inherited = inherited || before.count(ino);
  }
  fprintf(stderr, "the child %s the workload's command socket\n",
          inherited ? "inherited" : "did not inherit");
  ok = ok && inherited;

  // The workload's listeners close both at the control timeout: their clients
  // see the end though the child lives.
  const bool ctl_eof = eof_within(ctl.ch.fd(), kControlTimeoutMs + 3000);
  const bool peer_eof = eof_within(peer.get(), 1000);
  fprintf(stderr, "with the child alive: control connection %s, peer connection %s\n",
          ctl_eof ? "ended" : "still open", peer_eof ? "ended" : "still open");
  REQ(::kill(static_cast<pid_t>(child), 0) == 0);  // the child was alive throughout
  REQ(command(kReap));
  REQ(ok && ctl_eof && peer_eof);
  REQ(send_u64(g_workload.sock, kFinish));
  REQ(g_workload.join() == 0);
  return 0;
}

}  // namespace

int main() {
  return coordinator_main("shim.track.fork_conns", "forkconns", run, [] { g_workload.kill(); });
}
