#include "coord/criu_leftovers.h"

#include <dlfcn.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "coord/procs.h"
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

TEST_CASE("criu leftovers: sockets left in repair mode are taken out of it, and only those" *
          doctest::test_suite("root")) {  // TCP_REPAIR needs CAP_NET_ADMIN
  UniqueFd a, b;
  REQUIRE(loopback_pair(&a, &b));
  const int on = 1;
  REQUIRE(::setsockopt(a.get(), IPPROTO_TCP, TCP_REPAIR, &on, sizeof on) == 0);
  REQUIRE(in_repair(a.get()));
  CHECK(::send(a.get(), "x", 1, MSG_NOSIGNAL) == -1);  // as a job finds it: EINVAL
  CHECK(set_tcp_repair({::getpid()}, TcpRepair::kOff) == 1);
  CHECK_FALSE(in_repair(a.get()));
  CHECK_FALSE(in_repair(b.get()));  // never in repair: not touched
  CHECK(::send(a.get(), "y", 1, MSG_NOSIGNAL) == 1);
  char c = 0;
  CHECK(::recv(b.get(), &c, 1, 0) == 1);
  CHECK(c == 'y');
  CHECK(set_tcp_repair({::getpid()}, TcpRepair::kOff) == 0);

  // On, as before a job is killed: both ends (established), not a listener.
  UniqueFd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(listener);
  REQUIRE(::listen(listener.get(), 1) == 0);
  CHECK(set_tcp_repair({::getpid()}, TcpRepair::kOn) == 2);
  CHECK(in_repair(a.get()));
  CHECK(in_repair(b.get()));
  CHECK_FALSE(in_repair(listener.get()));
  CHECK(set_tcp_repair({::getpid()}, TcpRepair::kOff) == 2);
  CHECK_FALSE(in_repair(a.get()));
}

TEST_CASE("criu leftovers: CRIU's nftables table is removed, under either name" *
          doctest::test_suite("root")) {
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

TEST_CASE("criu leftovers: the lift says what it did" * doctest::test_suite("root")) {
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
}

TEST_CASE("criu leftovers: the iptables rules of CRIU's lock, as CRIU writes them") {
  const std::vector<TcpTableEntry> sockets{
      {4, "127.0.0.1", 40000, kTcpEstablished, "11", "127.0.0.1", 29500},
      {4, "0.0.0.0", 29500, kTcpListen, "12", "0.0.0.0", 0},           // not locked
      {4, "127.0.0.1", 40001, kTcpTimeWait, "0", "127.0.0.1", 29500},  // nor this
      {6, "2001:db8::1", 443, kTcpEstablished, "13", "2001:db8::2", 50000},
      {6, "::ffff:10.0.0.1", 8080, kTcpEstablished, "14", "::ffff:10.0.0.2", 50001}};
  const auto cmds = criu_iptables_unlock_commands(sockets);
  auto text = [](const std::vector<std::string>& c) {
    std::string t;
    for (const std::string& w : c) t += (t.empty() ? "" : " ") + w;
    return t;
  };
  REQUIRE(cmds.size() == 6);
  // CRIU's "PROG -w -t filter -I CHAIN --protocol tcp -m mark ! --mark
  // 0xC114 --source S --sport SP --destination D --dport DP -j DROP".
  auto rule = [](const char* prog, const char* chain, const char* src, const char* dst) {
    return std::string(prog) + " -w 5 -t filter -D " + chain +
           " --protocol tcp -m mark ! --mark 0xC114 " + src + " " + dst + " -j DROP";
  };
  CHECK(text(cmds[0]) == rule("iptables", "INPUT", "--source 127.0.0.1 --sport 29500",
                              "--destination 127.0.0.1 --dport 40000"));
  CHECK(text(cmds[1]) == rule("iptables", "OUTPUT", "--source 127.0.0.1 --sport 40000",
                              "--destination 127.0.0.1 --dport 29500"));
  CHECK(text(cmds[2]) == rule("ip6tables", "INPUT", "--source 2001:db8::2 --sport 50000",
                              "--destination 2001:db8::1 --dport 443"));
  // IPv4-mapped: CRIU locks it through iptables, with the IPv4 addresses.
  CHECK(text(cmds[5]) == rule("iptables", "OUTPUT", "--source 10.0.0.1 --sport 8080",
                              "--destination 10.0.0.2 --dport 50001"));
}

namespace {

// Runs `iptables ARGS` quietly; its exit status.
int iptables(const std::string& args) {
  const int st = std::system(("iptables -w 5 " + args + " >/dev/null 2>&1").c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

bool have_iptables() {
  return std::system("command -v iptables >/dev/null 2>&1") == 0;
}

// A command of criu_iptables_unlock_commands as arguments for iptables(),
// with `verb` (-I: as CRIU inserts it, -C: check it is there) for its -D.
std::string rule_args(const std::vector<std::string>& cmd, const char* verb) {
  std::string t;
  for (size_t i = 3; i < cmd.size(); ++i)  // after "iptables -w 5"
    t += " " + (cmd[i] == "-D" ? std::string(verb) : cmd[i] == "!" ? "'!'" : cmd[i]);
  return t;
}

}  // namespace

TEST_CASE("criu leftovers: CRIU's iptables rules are removed, and only those" *
          doctest::test_suite("root")) {
  REQUIRE_MESSAGE(have_iptables(), "iptables is missing: scripts/install-deps.sh installs it");
  UniqueFd a, b;
  REQUIRE(loopback_pair(&a, &b));
  std::vector<TcpTableEntry> sockets;
  for (JobTcpSocket& s : job_tcp_sockets({::getpid()})) sockets.push_back(s.entry);
  const auto cmds = criu_iptables_unlock_commands(sockets);
  REQUIRE(cmds.size() == 4);  // a and b: established, two rules each
  // The lock as CRIU takes it, and a rule of someone else's that differs
  // only in its mark.
  for (const auto& c : cmds) REQUIRE(iptables(rule_args(c, "-I")) == 0);
  const std::string other =
      " INPUT --protocol tcp -m mark '!' --mark 0x1 --source 127.0.0.1 -j DROP";
  REQUIRE(iptables("-t filter -I" + other) == 0);
  CHECK(::send(a.get(), "z", 1, MSG_NOSIGNAL) == 1);  // dropped, retransmitted later
  const std::string said = lift_criu_network_lock({::getpid()}, "iptables", "");
  CHECK(said == "CRIU's network lock (4 iptables rule(s)) removed");
  for (const auto& c : cmds) CHECK(iptables(rule_args(c, "-C")) == 1);  // gone
  CHECK(iptables("-t filter -C" + other) == 0);                         // not CRIU's: kept
  REQUIRE(iptables("-t filter -D" + other) == 0);
  // The byte sent meanwhile gets through (the socket's retransmission).
  pollfd p{b.get(), POLLIN, 0};
  CHECK(::poll(&p, 1, 5000) == 1);
  char c = 0;
  CHECK(::recv(b.get(), &c, 1, MSG_DONTWAIT) == 1);
  CHECK(c == 'z');
  // Done again: no rule left, nothing said.
  CHECK(lift_criu_network_lock({::getpid()}, "iptables", "").empty());
}

TEST_CASE("criu leftovers: an iptables that hangs is given CUSNAP_NETWORK_UNLOCK_TIMEOUT_MS") {
  char t[] = "/tmp/cusnap-ipt-XXXXXX";
  REQUIRE(mkdtemp(t));
  const std::string dir = t;
  {
    std::ofstream f(dir + "/iptables");
    f << "#!/bin/sh\nexec sleep 60\n";
  }
  REQUIRE(::chmod((dir + "/iptables").c_str(), 0755) == 0);
  const char* old_path = ::getenv("PATH");
  const std::string path = old_path ? old_path : "";
  ::setenv("PATH", (dir + ":" + path).c_str(), 1);
  ::setenv("CUSNAP_NETWORK_UNLOCK_TIMEOUT_MS", "300", 1);
  UniqueFd a, b;
  REQUIRE(loopback_pair(&a, &b));
  const auto start = std::chrono::steady_clock::now();
  const std::string said = lift_criu_network_lock({::getpid()}, "iptables", "");
  const auto took = std::chrono::steady_clock::now() - start;
  ::setenv("PATH", path.c_str(), 1);
  ::unsetenv("CUSNAP_NETWORK_UNLOCK_TIMEOUT_MS");
  std::filesystem::remove_all(dir);
  // The first command times out, and the others are not tried: one wait of
  // 0.3 s, far from the default 10 s or a minute of the hung program.
  CHECK(said.find("warning: 4 of 4 iptables rules") == 0);
  CHECK(said.find("could not be removed") != std::string::npos);
  CHECK(took < std::chrono::seconds(5));
}
