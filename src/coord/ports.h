// The TCP ports a job listens on: recorded at checkpoint (the manifest's
// tcp_listeners) and checked before a restore, so that a port another
// process holds here now is refused up front, naming the port and that
// process, instead of CRIU failing half way through the restore ("inet:
// Can't bind inet socket (id N): Address already in use").
//
// Reads /proc and binds throwaway sockets; changes nothing else.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "coord/procs.h"

namespace cusnap {

/// One listening TCP socket of a job.
struct TcpListener {
  int family = 4;    ///< 4 or 6
  std::string addr;  ///< local address, text form ("127.0.0.1", "0.0.0.0", "::")
  uint16_t port = 0;
  /// Socket options as the job had them (false where they could not be read).
  bool reuseport = false, reuseaddr = false;
  /// IPV6_V6ONLY (family 6 only): an IPv6 wildcard without it takes the
  /// IPv4 port too.
  bool v6only = false;
  bool operator==(const TcpListener&) const = default;
};

/// At most this many listeners are recorded (the rest are not checked).
inline constexpr size_t kMaxTcpListeners = 4096;

/// "127.0.0.1:28028", "[::1]:28028".
std::string tcp_endpoint(int family, const std::string& addr, uint16_t port);

/// The sockets in LISTEN state among a job's TCP sockets (job_tcp_sockets),
/// in their order; their options are read from a duplicate taken with
/// pidfd_getfd from the process holding each.
std::vector<TcpListener> job_tcp_listeners(const std::vector<JobTcpSocket>& sockets);

/// A process that holds a TCP socket.
struct PortHolder {
  pid_t pid = 0;
  std::string name;  ///< its /proc/PID/comm
};

/// Finds a process here (this network namespace) holding a TCP socket whose
/// local port is port and whose address conflicts with addr (the same, or
/// either one a wildcard), in any state but TIME_WAIT; listeners first.
/// False when no process that /proc shows holds one.
bool find_port_holder(int family, const std::string& addr, uint16_t port, PortHolder* out);

/// Whether a restore can listen on l here: binds a socket of l's family to
/// its address and port as CRIU restores it (SO_REUSEADDR, which CRIU sets on
/// every socket it restores; SO_REUSEPORT and IPV6_V6ONLY as l had them),
/// then closes it. False with *err saying why and, for a port in use, who
/// holds it.
bool tcp_listener_bindable(const TcpListener& l, std::string* err);

}  // namespace cusnap
