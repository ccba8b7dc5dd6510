#include "coord/criu_leftovers.h"

#include <dlfcn.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>

#include "proto/unique_fd.h"

using namespace cusnap;

namespace {

constexpr const char* kId = "cf42bc17-ed7f-461d-92b0-8195dd73b201";

// A connected pair of TCP sockets on the loopback.
bool loopback_pair(UniqueFd* a, UniqueFd* b) {
  UniqueFd srv(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (!srv || ::bind(srv.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(srv.get(), 1) != 0 ||
      ::getsockname(srv.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return false;
  UniqueFd c(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!c || ::connect(c.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) return false;
  UniqueFd s(::accept4(srv.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!s) return false;
  *a = std::move(c);
  *b = std::move(s);
  return true;
}

bool in_repair(int fd) {
  tcp_repair_window w{};
  socklen_t len = sizeof w;
  return ::getsockopt(fd, IPPROTO_TCP, TCP_REPAIR_WINDOW, &w, &len) == 0;
}

// Runs one nft command through libnftables; its return code (-100: no library).
int nft(const std::string& cmd) {
  void* lib = ::dlopen("libnftables.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return -100;
  auto ctx_new = reinterpret_cast<void* (*)(uint32_t)>(::dlsym(lib, "nft_ctx_new"));
  auto ctx_free = reinterpret_cast<void (*)(void*)>(::dlsym(lib, "nft_ctx_free"));
  auto quiet = reinterpret_cast<int (*)(void*)>(::dlsym(lib, "nft_ctx_buffer_error"));
  auto run = reinterpret_cast<int (*)(void*, const char*)>(::dlsym(lib, "nft_run_cmd_from_buffer"));
  void* ctx = ctx_new(0);
  quiet(ctx);
  const int rc = run(ctx, cmd.c_str());
  ctx_free(ctx);
  ::dlclose(lib);
  return rc;
}

}  // namespace

TEST_CASE("criu leftovers: the run id is read from CRIU's log") {
  CHECK(criu_run_id_from_log(std::string("(00.000000) CRIU run id = ") + kId + "\n(00.0001) x\n") ==
        kId);
  // A restore's log names the dump's id first; that is not its own.
  CHECK(criu_run_id_from_log(std::string("(00.01) Dump CRIU run id = ") + kId +
                             "\n(00.02) CRIU run id = 00000000-1111-2222-3333-444444444444\n") ==
        "00000000-1111-2222-3333-444444444444");
  CHECK(criu_run_id_from_log(std::string("(00.01) Dump CRIU run id = ") + kId + "\n").empty());
  CHECK(criu_run_id_from_log("(00.00) CRIU run id = not-a-uuid\n").empty());
  CHECK(criu_run_id_from_log("(00.00) CRIU run id = cf42bc17-ed7f-461d-92b0\n").empty());
  CHECK(criu_run_id_from_log("").empty());
  CHECK(criu_run_id("/nonexistent/dump.log").empty());
}

TEST_CASE("criu leftovers: the table's name is cut as CRIU cuts it") {
  const auto names = criu_nft_tables(kId);
  REQUIRE(names.size() == 2);
  CHECK(names[0] == "CRIU-cf42bc17-ed7f-461d-92");  // "inet CRIU-..." in 32 bytes
  CHECK(names[1] == std::string("CRIU-") + kId);
  std::string removed, err;
  CHECK_FALSE(remove_criu_nft_table("x; delete table inet filter", &removed, &err));
  CHECK(err.find("is not a CRIU run id") != std::string::npos);
}

TEST_CASE("criu leftovers: sockets left in repair mode are taken out of it" *
          doctest::skip(geteuid() != 0)) {  // TCP_REPAIR needs CAP_NET_ADMIN
  UniqueFd a, b;
  REQUIRE(loopback_pair(&a, &b));
  const int on = 1;
  REQUIRE(::setsockopt(a.get(), IPPROTO_TCP, TCP_REPAIR, &on, sizeof on) == 0);
  REQUIRE(in_repair(a.get()));
  CHECK(::send(a.get(), "x", 1, MSG_NOSIGNAL) == -1);  // as a job finds it: EINVAL
  CHECK(tcp_repair_off({::getpid()}) == 1);
  CHECK_FALSE(in_repair(a.get()));
  CHECK_FALSE(in_repair(b.get()));  // never in repair: not touched
  CHECK(::send(a.get(), "y", 1, MSG_NOSIGNAL) == 1);
  char c = 0;
  CHECK(::recv(b.get(), &c, 1, 0) == 1);
  CHECK(c == 'y');
  CHECK(tcp_repair_off({::getpid()}) == 0);
}

TEST_CASE("criu leftovers: CRIU's nftables table is removed, under either name" *
          doctest::skip(geteuid() != 0)) {
  for (const std::string& name : criu_nft_tables(kId)) {
    CAPTURE(name);
    REQUIRE(nft("add table inet " + name) == 0);
    std::string removed, err;
    CHECK(remove_criu_nft_table(kId, &removed, &err));
    CHECK(removed == "inet " + name);
    CHECK(nft("delete table inet " + name) != 0);  // gone
    // None left: nothing to remove, and that is no error.
    CHECK(remove_criu_nft_table(kId, &removed, &err));
    CHECK(removed.empty());
    CHECK(err.empty());
  }
}

TEST_CASE("criu leftovers: without CAP_NET_ADMIN the table is not removed, and that is said") {
  // In a child that drops to uid 65534 (or is not root already).
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(10);
    std::string removed, err;
    const bool ok = remove_criu_nft_table(kId, &removed, &err);
    ::_exit(!ok && err.find("Operation not permitted") != std::string::npos ? 0 : 11);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("criu leftovers: the lift says what it did" * doctest::skip(geteuid() != 0)) {
  UniqueFd a, b;
  REQUIRE(loopback_pair(&a, &b));
  const int on = 1;
  REQUIRE(::setsockopt(a.get(), IPPROTO_TCP, TCP_REPAIR, &on, sizeof on) == 0);
  char dir[] = "/tmp/cusnap-leftovers.XXXXXX";
  REQUIRE(::mkdtemp(dir));
  const std::string log = std::string(dir) + "/dump.log";
  {
    FILE* f = std::fopen(log.c_str(), "w");
    REQUIRE(f);
    std::fprintf(f, "(00.000000) CRIU run id = %s\n(00.040606) net: Lock network\n", kId);
    std::fclose(f);
  }
  REQUIRE(nft("add table inet " + criu_nft_tables(kId)[0]) == 0);
  const std::string said = lift_criu_network_lock({::getpid()}, "nftables", log);
  CHECK(said ==
        "CRIU's network lock (nftables table inet CRIU-cf42bc17-ed7f-461d-92) removed\n"
        "1 TCP socket(s) of the job taken out of repair mode");
  CHECK_FALSE(in_repair(a.get()));
  // Done again: nothing left to do, nothing said.
  CHECK(lift_criu_network_lock({::getpid()}, "nftables", log).empty());
  // A log without a run id: the table cannot be named, which is said.
  {
    FILE* f = std::fopen(log.c_str(), "w");
    REQUIRE(f);
    std::fclose(f);
  }
  CHECK(lift_criu_network_lock({::getpid()}, "nftables", log).starts_with("warning: CRIU's log "));
  // No log at all: CRIU did not start, so it locked nothing.
  ::unlink(log.c_str());
  ::rmdir(dir);
  CHECK(lift_criu_network_lock({::getpid()}, "nftables", log).empty());
  CHECK(lift_criu_network_lock({::getpid()}, "iptables", log).starts_with("warning: "));
}
