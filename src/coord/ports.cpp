#include "coord/ports.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "coord/procs.h"
#include "proto/unique_fd.h"

namespace cusnap {
namespace {

/// At most this many processes are looked through for a port's holder.
constexpr size_t kMaxScannedProcesses = 65536;

bool int_option(int fd, int level, int name) {
  int v = 0;
  socklen_t len = sizeof v;
  return ::getsockopt(fd, level, name, &v, &len) == 0 && v != 0;
}

/// The interface index of the interface that has link-local address a (0:
/// none has it). /proc/net/tcp6 does not show a socket's interface; a
/// link-local address is normally one interface's own.
unsigned link_local_interface(const in6_addr& a) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return 0;
  unsigned index = 0;
  for (ifaddrs* i = list; i && !index; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET6 || !i->ifa_name) continue;
    const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
    if (std::memcmp(&sin6->sin6_addr, &a, sizeof a) == 0) index = ::if_nametoindex(i->ifa_name);
  }
  ::freeifaddrs(list);
  return index;
}

bool is_wildcard(const std::string& addr) {
  return addr == "0.0.0.0" || addr == "::";
}

// An IPv4-mapped IPv6 address ("::ffff:1.2.3.4") as the IPv4 one it maps.
void unmap_v4(int* family, std::string* addr) {
  if (*family == 6 && addr->starts_with("::ffff:") && addr->find('.') != std::string::npos) {
    *family = 4;
    addr->erase(0, 7);
  }
}

// Whether sockets bound to the two addresses on one port collide.
bool addresses_conflict(int fa, std::string a, int fb, std::string b) {
  unmap_v4(&fa, &a);
  unmap_v4(&fb, &b);
  if (fa == fb) return a == b || is_wildcard(a) || is_wildcard(b);
  // An IPv6 wildcard without IPV6_V6ONLY (which /proc does not show) takes
  // the IPv4 port too.
  return (fa == 6 && a == "::") || (fb == 6 && b == "::");
}

}  // namespace

std::string tcp_endpoint(int family, const std::string& addr, uint16_t port) {
  return (family == 6 ? "[" + addr + "]" : addr) + ":" + std::to_string(port);
}

std::vector<TcpListener> job_tcp_listeners(const std::vector<JobTcpSocket>& sockets) {
  std::vector<TcpListener> out;
  // Per process, its listeners: inode -> index in out.
  std::map<pid_t, std::map<std::string, size_t>> by_pid;
  for (const JobTcpSocket& s : sockets) {
    if (s.entry.state != kTcpListen || out.size() >= kMaxTcpListeners) continue;
    by_pid[s.pid][s.entry.inode] = out.size();
    out.push_back({s.entry.family, s.entry.addr, s.entry.port});
  }
  // Unknown options (no duplicate to read them from) stay false.
  for (const auto& [pid, found] : by_pid)
    for_each_tcp_socket(pid, [&](const std::string& inode, int fd) {
      auto it = found.find(inode);
      if (it == found.end()) return;
      TcpListener& l = out[it->second];
      l.reuseport = int_option(fd, SOL_SOCKET, SO_REUSEPORT);
      l.reuseaddr = int_option(fd, SOL_SOCKET, SO_REUSEADDR);
      if (l.family == 6) l.v6only = int_option(fd, IPPROTO_IPV6, IPV6_V6ONLY);
    });
  return out;
}

bool find_port_holder(int family, const std::string& addr, uint16_t port, PortHolder* out) {
  // The candidate sockets: inode -> whether it listens. TIME_WAIT and
  // orphaned sockets (inode 0) have no process to name.
  std::map<std::string, bool> candidates;
  for (const TcpTableEntry& e : read_tcp_tables("/proc/self"))
    if (e.port == port && e.state != kTcpTimeWait && e.inode != "0" &&
        addresses_conflict(family, addr, e.family, e.addr))
      candidates[e.inode] = e.state == kTcpListen;
  if (candidates.empty()) return false;
  // The first process holding a listener, else the first holding any.
  pid_t holder = 0;
  bool listener = false;
  size_t scanned = 0;
  for (const std::string& name : list_dir("/proc")) {
    pid_t pid = 0;
    if (!parse_num(name, &pid) || pid <= 0) continue;
    if (++scanned > kMaxScannedProcesses) break;
    // A process whose descriptors cannot be read shows none: skipped.
    for (const auto& [fd, inode] : socket_fds(pid)) {
      auto it = candidates.find(inode);
      if (it == candidates.end() || (holder && !it->second)) continue;
      holder = pid;
      listener = it->second;
      if (listener) break;
    }
    if (listener) break;
  }
  if (!holder) return false;
  out->pid = holder;
  out->name.clear();
  if (read_text_file("/proc/" + std::to_string(holder) + "/comm", &out->name))
    while (!out->name.empty() && out->name.back() == '\n') out->name.pop_back();
  return true;
}

bool tcp_listener_bindable(const TcpListener& l, std::string* err) {
  const std::string what =
      "TCP port " + tcp_endpoint(l.family, l.addr, l.port) + " that the job listened on";
  sockaddr_storage ss{};
  socklen_t len = 0;
  const int af = l.family == 6 ? AF_INET6 : AF_INET;
  bool parsed = false;
  if (af == AF_INET) {
    auto* sin = reinterpret_cast<sockaddr_in*>(&ss);
    sin->sin_family = AF_INET;
    sin->sin_port = htons(l.port);
    parsed = inet_pton(AF_INET, l.addr.c_str(), &sin->sin_addr) == 1;
    len = sizeof *sin;
  } else {
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&ss);
    sin6->sin6_family = AF_INET6;
    sin6->sin6_port = htons(l.port);
    parsed = inet_pton(AF_INET6, l.addr.c_str(), &sin6->sin6_addr) == 1;
    len = sizeof *sin6;
    // A link-local address binds only with its interface: the one that has it.
    if (parsed && IN6_IS_ADDR_LINKLOCAL(&sin6->sin6_addr)) {
      sin6->sin6_scope_id = link_local_interface(sin6->sin6_addr);
      if (sin6->sin6_scope_id == 0) {
        *err = what + " cannot be bound here: no network interface of this machine has that "
                      "link-local address (restore on the machine that has it)";
        return false;
      }
    }
  }
  if (!parsed) {
    *err = what + " has an address that is not a valid IPv" + std::to_string(l.family) + " address";
    return false;
  }
  int e = 0;
  const UniqueFd probe(::socket(af, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!probe) {
    e = errno;
  } else {
    const int fd = probe.get();
    const int one = 1, v6only = l.v6only ? 1 : 0;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (l.reuseport) ::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    if (af == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0) e = errno;
  }
  if (e == 0) return true;
  if (e == EADDRINUSE) {
    PortHolder h;
    if (find_port_holder(l.family, l.addr, l.port, &h))
      *err = what + " is in use by pid " + std::to_string(h.pid) +
             (h.name.empty() ? "" : " (" + h.name + ")") + ": stop that process, then restore";
    else
      *err = what +
             " is in use (held by a socket no process here owns, such as a connection still "
             "closing); wait or free the port, then restore";
    return false;
  }
  *err = what + " cannot be bound here: " + std::strerror(e) +
         (e == EADDRNOTAVAIL ? " (the job listened on an address this machine does not have)" : "");
  return false;
}

}  // namespace cusnap
