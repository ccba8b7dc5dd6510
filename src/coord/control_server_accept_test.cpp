// The control server's accept loop when the process is out of descriptors.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "coord/control_server.h"
#include "proto/wire.h"

using namespace cusnap;
using namespace std::chrono_literals;

namespace {

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

/// Takes every descriptor the process may open (RLIMIT_NOFILE lowered to a
/// little above the highest open one, the rest filled with duplicates);
/// gives them back on destruction.
struct NoDescriptorsLeft {
  rlimit old{};
  std::vector<int> fds;
  NoDescriptorsLeft() {
    getrlimit(RLIMIT_NOFILE, &old);
    int high = 0;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd"))
      high = std::max(high, std::atoi(e.path().filename().c_str()));
    rlimit low = old;
    low.rlim_cur = std::min<rlim_t>(old.rlim_cur, static_cast<rlim_t>(high) + 64);
    setrlimit(RLIMIT_NOFILE, &low);
    for (;;) {
      int fd = ::fcntl(0, F_DUPFD_CLOEXEC, 0);
      if (fd < 0) break;
      fds.push_back(fd);
    }
  }
  ~NoDescriptorsLeft() {
    for (int fd : fds) ::close(fd);
    setrlimit(RLIMIT_NOFILE, &old);
  }
};

}  // namespace

TEST_CASE("control server: out of descriptors, the accept loop waits instead of spinning") {
  char t[] = "/tmp/cusnap-csa-XXXXXX";
  REQUIRE(mkdtemp(t));
  const std::string dir = t;
  JobContext ctx;
  ctx.info.name = "fake";
  ctx.info.root_pid = getpid();
  ctx.info.owner_uid = geteuid();
  ctx.info.runtime_dir = dir;
  ctx.status.name = "fake";
  ctx.status.state = "running";
  UniqueFd l;
  std::string err;
  const std::string path = dir + "/control.sock";
  REQUIRE(proto::listen_unix(path, 0600, &l, &err));
  ControlServer server(&ctx, CoordinatorOps{}, std::move(l), 2000ms);
  REQUIRE(server.start(&err));

  // The client's socket is made first: connecting needs no descriptor.
  UniqueFd client(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(client);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  double spent = 0;
  {
    NoDescriptorsLeft none;
    REQUIRE(!none.fds.empty());
    CHECK(::fcntl(0, F_DUPFD_CLOEXEC, 0) < 0);
    REQUIRE(::connect(client.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    const double before = process_cpu_seconds();
    std::this_thread::sleep_for(1s);
    spent = process_cpu_seconds() - before;
  }
  INFO("CPU time of the process over 1 s without descriptors: " << spent << " s");
  CHECK(spent < 0.25);
  // With descriptors back, the pending connection is served.
  REQUIRE(::fcntl(client.get(), F_SETFL, ::fcntl(client.get(), F_GETFL) | O_NONBLOCK) == 0);
  proto::Channel ch(std::move(client), 3000ms);
  REQUIRE(ch.send(proto::kMsgHello, proto::Empty{}, &err));
  proto::Message m;
  REQUIRE(ch.recv(&m, &err));
  CHECK(m.type == proto::kMsgHello);
  server.stop();
  (void)!system(("rm -rf " + dir).c_str());
}
