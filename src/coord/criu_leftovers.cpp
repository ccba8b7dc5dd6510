#include "coord/criu_leftovers.h"

#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netlink.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <ctime>

#include "coord/criu.h"
#include "coord/file_read.h"
#include "coord/procs.h"
#include "proto/env_settings.h"
#include "proto/unique_fd.h"

namespace cusnap {

namespace {

// A message to nf_tables over netlink: header, nfgenmsg, attributes.
class NftMessage {
 public:
  NftMessage(uint16_t type, uint16_t flags, uint32_t seq, uint8_t family, uint16_t res_id) {
    nlmsghdr h{};
    h.nlmsg_type = type;
    h.nlmsg_flags = flags;
    h.nlmsg_seq = seq;
    put(&h, sizeof h);
    nfgenmsg g{};
    g.nfgen_family = family;
    g.version = NFNETLINK_V0;
    g.res_id = htons(res_id);
    put(&g, sizeof g);
  }
  void attr_string(uint16_t type, const std::string& value) {
    nlattr a{};
    a.nla_type = type;
    a.nla_len = uint16_t(NLA_HDRLEN + value.size() + 1);
    put(&a, sizeof a);
    put(value.c_str(), value.size() + 1);
  }
  /// The message, its length set, padded to 4 bytes.
  std::string done() {
    reinterpret_cast<nlmsghdr*>(buf_.data())->nlmsg_len = uint32_t(buf_.size());
    return buf_;
  }

 private:
  void put(const void* p, size_t n) {
    buf_.append(static_cast<const char*>(p), n);
    buf_.append((4 - buf_.size() % 4) % 4, '\0');
  }
  std::string buf_;
};

// Deletes the table "inet NAME" in one nf_tables batch; 0, or the negative
// errno the kernel answered (-ENOENT: no such table), or of the socket.
int nft_delete_inet_table(const std::string& name) {
  const UniqueFd fd(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER));
  if (!fd) return -errno;
  // The kernel answers at once; never wait for ever.
  const uint64_t wait_ms = proto::env_number(proto::kNetworkUnlockMs);
  timeval tv{time_t(wait_ms / 1000), suseconds_t(wait_ms % 1000 * 1000)};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const uint32_t seq = uint32_t(::time(nullptr));
  std::string batch =
      NftMessage(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, seq, AF_UNSPEC, NFNL_SUBSYS_NFTABLES).done();
  NftMessage del((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_DELTABLE, NLM_F_REQUEST | NLM_F_ACK, seq + 1,
                 NFPROTO_INET, 0);
  del.attr_string(NFTA_TABLE_NAME, name);
  batch += del.done();
  batch += NftMessage(NFNL_MSG_BATCH_END, NLM_F_REQUEST, seq + 2, AF_UNSPEC, NFNL_SUBSYS_NFTABLES)
               .done();
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(fd.get(), batch.data(), batch.size(), 0, reinterpret_cast<sockaddr*>(&kernel),
               sizeof kernel) != ssize_t(batch.size()))
    return -errno;
  // The answer to the deletion: an error message (0 is the acknowledgement);
  // an error about the batch itself (EPERM without CAP_NET_ADMIN) ends it too.
  alignas(nlmsghdr) char buf[8192];
  for (;;) {
    const ssize_t got = ::recv(fd.get(), buf, sizeof buf, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return -errno;
    size_t left = size_t(got);
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
      if (h->nlmsg_type != NLMSG_ERROR) continue;
      if (h->nlmsg_len < NLMSG_LENGTH(sizeof(nlmsgerr))) return -EPROTO;
      const int error = static_cast<const nlmsgerr*>(NLMSG_DATA(h))->error;
      if (h->nlmsg_seq == seq + 1 || error != 0) return error;
    }
  }
}

}  // namespace

std::string criu_run_id_from_log(std::string_view text) {
  constexpr std::string_view kKey = "CRIU run id = ";
  for (size_t at = text.find(kKey); at != std::string_view::npos; at = text.find(kKey, at + 1)) {
    // "Dump CRIU run id = " (a restore naming the dump's id) is not this run's.
    if (at >= 5 && text.substr(at - 5, 5) == "Dump ") continue;
    const std::string_view id = text.substr(at + kKey.size(), 36);
    if (is_criu_run_id(id)) return std::string(id);
  }
  return {};
}

std::string criu_run_id(const std::string& path) {
  std::string head;
  if (!read_file_bounded(path, {.max_bytes = size_t(1) << 20, .prefix = true}, &head)) return {};
  return criu_run_id_from_log(head);
}

std::vector<std::string> criu_nft_tables(const std::string& run_id) {
  // CRIU (4.1) writes the name into a 32-byte buffer ("inet CRIU-%s"), which
  // keeps 21 of the id's 36 characters; a CRIU with a larger buffer would
  // use all of them.
  const std::string full = "CRIU-" + run_id;
  return {full.substr(0, 31 - 5), full};
}

bool remove_criu_nft_table(const std::string& run_id, std::string* removed, std::string* err) {
  removed->clear();
  if (!is_criu_run_id(run_id)) {
    // (Appended piece by piece: GCC 12 at -O3 warns, wrongly, of an overlap
    // in "\"" + run_id.substr(...) + ...)
    err->assign(1, '"').append(run_id, 0, 64).append("\" is not a CRIU run id");
    return false;
  }
  for (const std::string& name : criu_nft_tables(run_id)) {
    const int rc = nft_delete_inet_table(name);
    if (rc == -ENOENT) continue;  // not this one
    if (rc != 0) {
      *err = "deleting nftables table inet " + name + ": " + std::strerror(-rc);
      return false;
    }
    *removed = "inet " + name;
    return true;
  }
  return true;
}

std::vector<std::vector<std::string>> criu_iptables_unlock_commands(
    const std::vector<TcpTableEntry>& sockets, int lock_wait_s) {
  std::vector<std::vector<std::string>> out;
  // An IPv4-mapped IPv6 address ("::ffff:a.b.c.d"), as the IPv4 one.
  auto v4 = [](const std::string& a) {
    return a.rfind("::ffff:", 0) == 0 && a.find('.') != std::string::npos ? a.substr(7) : a;
  };
  for (const TcpTableEntry& e : sockets) {
    if (e.state != kTcpEstablished) continue;
    const bool mapped = e.family == 6 && v4(e.peer_addr) != e.peer_addr;
    const std::string prog = e.family == 6 && !mapped ? "ip6tables" : "iptables";
    const std::string local = mapped ? v4(e.addr) : e.addr;
    const std::string peer = mapped ? v4(e.peer_addr) : e.peer_addr;
    // CRIU: "-I INPUT ... --source PEER --sport P --destination LOCAL
    // --dport L" and the OUTPUT rule the other way round.
    auto rule = [&](const char* chain, const std::string& src, uint16_t sport,
                    const std::string& dst, uint16_t dport) {
      std::vector<std::string> c{prog, "-w", std::to_string(lock_wait_s), "-t", "filter",
                                 "-D", chain};
      c.insert(c.end(), {"--protocol", "tcp", "-m", "mark", "!", "--mark", "0xC114"});
      c.insert(c.end(), {"--source", src, "--sport", std::to_string(sport)});
      c.insert(c.end(), {"--destination", dst, "--dport", std::to_string(dport)});
      c.insert(c.end(), {"-j", "DROP"});
      out.push_back(std::move(c));
    };
    rule("INPUT", peer, e.peer_port, local, e.port);
    rule("OUTPUT", local, e.port, peer, e.peer_port);
  }
  return out;
}

namespace {

// Deletes the rules CRIU's iptables lock inserted for the job's connections;
// what it did or could not do, one line each.
std::string remove_criu_iptables_rules(const std::vector<pid_t>& pids) {
  std::vector<TcpTableEntry> sockets;
  for (JobTcpSocket& s : job_tcp_sockets(pids)) sockets.push_back(std::move(s.entry));
  // Each command within CUSNAP_NETWORK_UNLOCK_TIMEOUT_MS, its wait for the
  // xtables lock too (whole seconds, at least one).
  const std::chrono::milliseconds wait(proto::env_number(proto::kNetworkUnlockMs));
  const auto commands =
      criu_iptables_unlock_commands(sockets, std::max(1, static_cast<int>(wait.count() / 1000)));
  size_t removed = 0, absent = 0;
  std::string why;
  for (const auto& cmd : commands) {
    std::string err;
    const int rc = run_program(cmd[0], {cmd.begin() + 1, cmd.end()}, wait, &err);
    if (rc == 0)
      ++removed;
    else if (rc == 1)  // no such rule: CRIU had not locked that one
      ++absent;
    else
      why = rc < 0 ? err : cmd[0] + " -D exited " + std::to_string(rc);
    if (rc < 0) break;  // not installed, or hung: the others would fare the same
  }
  std::string out;
  if (removed > 0)
    out = "CRIU's network lock (" + std::to_string(removed) + " iptables rule(s)) removed";
  if (!why.empty())
    out += std::string(out.empty() ? "" : "\n") +
           "warning: " + std::to_string(commands.size() - removed - absent) + " of " +
           std::to_string(commands.size()) +
           " iptables rules by which CRIU may drop the job's TCP connections (mark 0xC114) "
           "could not be removed: " +
           why + "; see `iptables -S` and `ip6tables -S`";
  return out;
}

}  // namespace

std::string lift_criu_network_lock(const std::vector<pid_t>& pids, const std::string& method,
                                   const std::string& log_path) {
  std::string out;
  auto line = [&](const std::string& s) { out += (out.empty() ? "" : "\n") + s; };
  // The table first, so that the window probes of the sockets get through.
  if (method == "nftables") {
    const std::string id = criu_run_id(log_path);
    std::string why;
    std::string removed;
    if (id.empty() && ::access(log_path.c_str(), F_OK) != 0)
      ;  // CRIU did not start: it locked nothing
    else if (id.empty())
      line("warning: CRIU's log " + log_path +
           " names no run id, so its nftables table \"inet CRIU-<run id>\", which drops the "
           "job's TCP connections, may be left: list it with `nft list tables` and remove it "
           "with `nft delete table inet CRIU-...`");
    else if (!remove_criu_nft_table(id, &removed, &why))
      line("warning: CRIU's nftables table that drops the job's TCP connections is left: " + why +
           "; remove it with `nft delete table inet " + criu_nft_tables(id).front() + "`");
    else if (!removed.empty())
      line("CRIU's network lock (nftables table " + removed + ") removed");
  } else if (method == "iptables") {
    if (const std::string done = remove_criu_iptables_rules(pids); !done.empty()) line(done);
  }
  if (const size_t n = set_tcp_repair(pids, TcpRepair::kOff); n > 0)
    line(std::to_string(n) + " TCP socket(s) of the job taken out of repair mode");
  return out;
}

}  // namespace cusnap
