#include "coord/ports.h"

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "coord/procs.h"
#include "proto/wire.h"

using namespace cusnap;

namespace {

// A TCP socket of this process bound to addr (port 0: any free port),
// listening unless told otherwise; closed at the end of the scope.
struct TestSocket {
  int fd = -1;
  uint16_t port = 0;
  TestSocket(const char* addr, uint16_t want, bool reuseport, bool listening = true) {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    int one = 1;
    if (reuseport) REQUIRE(setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) == 0);
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(want);
    REQUIRE(inet_pton(AF_INET, addr, &sin.sin_addr) == 1);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&sin), sizeof sin) == 0);
    if (listening) REQUIRE(listen(fd, 4) == 0);
    socklen_t len = sizeof sin;
    REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&sin), &len) == 0);
    port = ntohs(sin.sin_port);
  }
  ~TestSocket() { close(fd); }
};

TcpListener listener(const char* addr, uint16_t port, bool reuseport) {
  return TcpListener{4, addr, port, reuseport, true};
}

}  // namespace

TEST_CASE("ports: a port this process listens on is reported as held by it") {
  TestSocket held("127.0.0.1", 0, false);
  std::string err;
  CHECK_FALSE(tcp_listener_bindable(listener("127.0.0.1", held.port, false), &err));
  const std::string want = "TCP port 127.0.0.1:" + std::to_string(held.port) +
                           " that the job listened on is in use by pid " +
                           std::to_string(getpid()) + " (";
  CHECK(err.find(want) == 0);
  CHECK(err.find("): stop that process, then restore") != std::string::npos);
  // A wildcard listener collides with a specific address on its port, and
  // its holder is found from the specific one.
  CHECK_FALSE(tcp_listener_bindable(listener("0.0.0.0", held.port, false), &err));
  CHECK(err.find("in use by pid " + std::to_string(getpid())) != std::string::npos);
  PortHolder h;
  REQUIRE(find_port_holder(4, "0.0.0.0", held.port, &h));
  CHECK(h.pid == getpid());
  CHECK_FALSE(h.name.empty());
  // SO_REUSEPORT on the probe alone does not share a port with a listener
  // that has none.
  CHECK_FALSE(tcp_listener_bindable(listener("127.0.0.1", held.port, true), &err));
}

TEST_CASE("ports: a wildcard listener holds the port for a specific address") {
  TestSocket held("0.0.0.0", 0, false);
  std::string err;
  CHECK_FALSE(tcp_listener_bindable(listener("127.0.0.1", held.port, false), &err));
  CHECK(err.find("in use by pid " + std::to_string(getpid())) != std::string::npos);
}

TEST_CASE("ports: a listener no process holds is reported as such") {
  // The listener's only reference travels in a message on a unix socket
  // (SCM_RIGHTS) that nobody received: no descriptor of any process names it.
  UniqueFd a, b;
  std::string err;
  REQUIRE(proto::socket_pair(&a, &b, &err));
  proto::Channel sender(std::move(a));
  uint16_t port = 0;
  {
    TestSocket held("127.0.0.1", 0, false);
    port = held.port;
    REQUIRE(sender.send_body("listener", held.fd, &err));
  }
  CHECK_FALSE(tcp_listener_bindable(listener("127.0.0.1", port, false), &err));
  CHECK(err == "TCP port 127.0.0.1:" + std::to_string(port) +
                   " that the job listened on is in use (held by a socket no process here owns, "
                   "such as a connection still closing); wait or free the port, then restore");
}

TEST_CASE("ports: a free port passes") {
  uint16_t port = 0;
  {
    TestSocket once("127.0.0.1", 0, false);
    port = once.port;
  }
  std::string err;
  CHECK(tcp_listener_bindable(listener("127.0.0.1", port, false), &err));
  CHECK(tcp_listener_bindable(listener("127.0.0.1", port, true), &err));
  PortHolder h;
  CHECK_FALSE(find_port_holder(4, "127.0.0.1", port, &h));
}

TEST_CASE("ports: SO_REUSEPORT listeners of one user share the port") {
  TestSocket held("127.0.0.1", 0, true);
  std::string err;
  CHECK(tcp_listener_bindable(listener("127.0.0.1", held.port, true), &err));
  CHECK_FALSE(tcp_listener_bindable(listener("127.0.0.1", held.port, false), &err));
}

TEST_CASE("ports: an address this machine does not have is refused, saying so") {
  std::string err;
  // 192.0.2.0/24 is reserved for documentation (RFC 5737).
  CHECK_FALSE(tcp_listener_bindable(listener("192.0.2.7", 8000, false), &err));
  CHECK(err ==
        "TCP port 192.0.2.7:8000 that the job listened on cannot be bound here: Cannot assign "
        "requested address (the job listened on an address this machine does not have)");
  CHECK(tcp_endpoint(6, "::1", 80) == "[::1]:80");
}

TEST_CASE("ports: a link-local listener is checked on the interface that has its address") {
  std::string err;
  TcpListener l{6, "fe80::dead:beef:1:2", 8000, false, false, true};
  CHECK_FALSE(tcp_listener_bindable(l, &err));
  CHECK(err == "TCP port [fe80::dead:beef:1:2]:8000 that the job listened on cannot be bound "
               "here: no network interface of this machine has that link-local address (restore "
               "on the machine that has it)");
  // Where an interface has a link-local address (most do), a port held on it
  // is found in use, and a free one binds.
  ifaddrs* list = nullptr;
  REQUIRE(getifaddrs(&list) == 0);
  sockaddr_in6 own{};
  for (ifaddrs* i = list; i; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET6 &&
        IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr)) {
      own = *reinterpret_cast<sockaddr_in6*>(i->ifa_addr);
      own.sin6_scope_id = if_nametoindex(i->ifa_name);
      break;
    }
  freeifaddrs(list);
  if (own.sin6_family != AF_INET6) {
    MESSAGE("no interface here has a link-local address: only the refusal was checked");
    return;
  }
  const int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&own), sizeof own) == 0);
  REQUIRE(listen(fd, 4) == 0);
  socklen_t len = sizeof own;
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&own), &len) == 0);
  char text[INET6_ADDRSTRLEN];
  REQUIRE(inet_ntop(AF_INET6, &own.sin6_addr, text, sizeof text));
  l.addr = text;
  l.port = ntohs(own.sin6_port);
  CHECK_FALSE(tcp_listener_bindable(l, &err));
  CHECK(err.find("is in use by pid " + std::to_string(getpid())) != std::string::npos);
  close(fd);
  CHECK(tcp_listener_bindable(l, &err));
}

TEST_CASE("ports: a process's listeners, each once, with their options") {
  TestSocket plain("127.0.0.1", 0, false);
  TestSocket shared("127.0.0.1", 0, true);
  TestSocket bound_only("127.0.0.1", 0, false, false);
  const int dup_fd = dup(plain.fd);  // one socket on two descriptors: listed once
  REQUIRE(dup_fd >= 0);
  auto all = job_tcp_listeners(job_tcp_sockets({getpid(), getpid()}));
  close(dup_fd);
  int plain_seen = 0, shared_seen = 0;
  for (const TcpListener& l : all) {
    CHECK(l.port != bound_only.port);
    if (l.port == plain.port) {
      ++plain_seen;
      CHECK(l == TcpListener{4, "127.0.0.1", plain.port, false, false});
    }
    if (l.port == shared.port) {
      ++shared_seen;
      CHECK(l == TcpListener{4, "127.0.0.1", shared.port, true, false});
    }
  }
  CHECK(plain_seen == 1);
  CHECK(shared_seen == 1);
}
