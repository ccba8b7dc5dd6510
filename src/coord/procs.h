// Process discovery for the engine: the job's tree, which processes use the
// CUDA driver, which GPUs they have open, and whether any device memory is
// shared between processes (which the driver's process checkpoint cannot
// restore: GPU.md, section "What was measured").
//
// Everything here reads /proc and changes nothing. The parsing functions take
// text so tests can feed them without processes.
#pragma once

#include <sys/types.h>

#include <charconv>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "coord/engine.h"

namespace cusnap {

/// Every process of the tree rooted at root (threads' children included,
/// through /proc/PID/task/*/children), root first, then breadth first.
/// Empty when root does not exist.
std::vector<pid_t> process_tree(pid_t root);

/// The processes of a job that still run once its first process ended:
/// those in its session (session: the first process's pid, the session's
/// leader), and the descendants of supervisor (the job's child subreaper,
/// whose children its orphans become), except supervisor itself and the
/// tree of except (the guardian).
std::vector<pid_t> job_leftovers(pid_t session, pid_t supervisor, pid_t except);

/// A process's parent (/proc/PID/stat); 0 when it cannot be read (gone).
pid_t read_ppid(pid_t pid);
/// A process's state letter (/proc/PID/stat: R, S, D, T, t, Z, X...); 0
/// when it cannot be read (gone).
char process_state(pid_t pid);
/// Whether pid still runs: there, and neither a zombie nor dead.
bool process_runs(pid_t pid);

/// A process's arguments (/proc/PID/cmdline, split at its NULs); false when
/// it cannot be read (gone).
bool read_process_argv(pid_t pid, std::vector<std::string>* argv);

/// exe, cmdline and uses_cuda of one process; false when it is gone.
bool read_process(pid_t pid, ProcessInfo* out);

/// True when maps text (the format of /proc/PID/maps) maps a libcuda.so.
bool maps_use_cuda(std::string_view maps);

/// One device allocation of the simulated driver mapped by a process; the
/// simulated driver names each physical allocation's memfd
/// "fakecuda:<creator-pid>:<allocation-id>[:dev<N>]".
struct DeviceAllocation {
  pid_t creator = 0;
  uint64_t id = 0;
  bool operator<(const DeviceAllocation& o) const {
    return creator != o.creator ? creator < o.creator : id < o.id;
  }
  bool operator==(const DeviceAllocation& o) const = default;
};
/// The simulated driver's allocations that maps text maps, each once.
std::vector<DeviceAllocation> parse_device_allocations(std::string_view maps);

/// Given each process's mapped allocations, describes the first sharing found
/// (an allocation created by another process, or one mapped by two processes)
/// in *what and returns true; false when every process uses only its own.
bool find_shared_device_memory(const std::map<pid_t, std::vector<DeviceAllocation>>& mapped,
                               std::string* what);

/// Reads each process's maps and applies find_shared_device_memory.
bool job_shares_device_memory(const std::vector<pid_t>& pids, std::string* what);

/// Files under /dev/shm named nccl-* that maps text maps: NCCL's intra-node
/// transport, which on the real driver means device memory shared with the
/// other ranks.
std::vector<std::string> parse_nccl_segments(std::string_view maps);

/// A process that holds an io_uring instance (a descriptor or a mapping of
/// one), which CRIU cannot checkpoint; *what names the process.
bool find_io_uring(const std::vector<pid_t>& pids, std::string* what);

/// A whole field of decimal digits as a number of type T (no sign for an
/// unsigned T, no spaces); false when it is not one or does not fit.
template <typename T>
bool parse_num(std::string_view s, T* v) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc() && p == s.data() + s.size();
}

/// The names in a directory (not . and ..); empty when it cannot be read.
std::vector<std::string> list_dir(const std::string& path);
/// As above; *error_number is 0 when the whole directory was read, else the
/// errno of what failed (opendir, or a readdir that ended the listing
/// early), so that an empty list can be told from one that failed.
std::vector<std::string> list_dir(const std::string& path, int* error_number);

/// The socket descriptors of a process: fd number -> socket inode (as
/// /proc/PID/net/tcp shows it).
std::map<int, std::string> socket_fds(pid_t pid);

/// Calls fn(inode, fd) for each TCP socket (IPv4 or IPv6) that the process
/// holds, fd being a duplicate taken with pidfd_getfd (closed after fn
/// returns). Sockets that cannot be duplicated are skipped.
void for_each_tcp_socket(pid_t pid, const std::function<void(const std::string&, int)>& fn);

/// One socket of /proc/PID/net/tcp or tcp6.
struct TcpTableEntry {
  int family = 4;     ///< 4 (tcp) or 6 (tcp6)
  std::string addr;   ///< local address, text form ("127.0.0.1", "::")
  uint16_t port = 0;  ///< local port
  int state = 0;      ///< the kernel's TCP state (kTcpEstablished, ...)
  std::string inode;  ///< "0" for sockets no descriptor holds (TIME_WAIT, orphans)
  std::string peer_addr;  ///< remote address ("0.0.0.0" or "::" when not connected)
  uint16_t peer_port = 0;
  bool operator==(const TcpTableEntry&) const = default;
};
inline constexpr int kTcpEstablished = 0x01;
inline constexpr int kTcpTimeWait = 0x06;
inline constexpr int kTcpListen = 0x0A;

/// Parses the text of /proc/net/tcp (family 4) or tcp6 (family 6); lines it
/// cannot read are skipped.
std::vector<TcpTableEntry> parse_tcp_table(std::string_view text, int family);

/// Both tables as seen from proc_dir ("/proc/PID" for that process's network
/// namespace, "/proc/self" for ours).
std::vector<TcpTableEntry> read_tcp_tables(const std::string& proc_dir);

/// Switches TCP repair mode (TCP_REPAIR, through a duplicate taken with
/// pidfd_getfd; needs CAP_NET_ADMIN) of the processes' TCP sockets:
///  - on: every socket the kernel allows it for (established and closed
///    ones). They then close silently when the processes die: no FIN or RST
///    reaches the peer and no TIME_WAIT keeps the address, which a restore of
///    the same connections binds again (CRIU does the same when it kills what
///    it dumped). Only for a job about to be killed.
///  - off: only the sockets in repair mode (TCP_REPAIR_WINDOW, which only
///    such a socket answers, tells them apart), as a dump that did not unlock
///    them leaves them; leaving repair mode also sends a window probe, so the
///    peer resumes at once.
/// Returns how many sockets it switched.
enum class TcpRepair { kOn, kOff };
size_t set_tcp_repair(const std::vector<pid_t>& pids, TcpRepair mode);

/// A TCP socket of a job, as the /proc/PID/net/tcp or tcp6 of the process
/// holding it shows it (that process's network namespace).
struct JobTcpSocket {
  pid_t pid = 0;  ///< the first of the processes found holding it
  TcpTableEntry entry;
};

/// The TCP sockets the processes hold, in any state, each once however many
/// processes share it, in the order found.
std::vector<JobTcpSocket> job_tcp_sockets(const std::vector<pid_t>& pids);

/// With the real driver the allocation names above are not visible; what
/// shows is NCCL: two CUDA processes that map NCCL segments are ranks of one
/// communicator, sharing device memory (GPU.md: the driver checkpoint of
/// such a job hangs). Describes it in *what.
bool job_uses_nccl_between_processes(const std::vector<pid_t>& cuda_pids, std::string* what);

/// UUIDs ("GPU-...") of the NVIDIA GPUs the process has open (/dev/nvidiaN
/// matched against /proc/driver/nvidia/gpus/*/information); empty where that
/// is not available, as with the simulated driver.
std::vector<std::string> process_gpu_uuids(pid_t pid);

/// Describes the first terminal a process of the tree has open (CRIU cannot
/// dump a job holding a terminal of a session outside the job) in *what.
bool find_terminal_fd(const std::vector<pid_t>& pids, std::string* what);

/// Reads a whole file of at most kMaxTextFileBytes (a /proc file: a large
/// process's maps run to a few MiB) through read_file_bounded; false when it
/// cannot be read or is larger.
inline constexpr size_t kMaxTextFileBytes = size_t(64) << 20;
bool read_text_file(const std::string& path, std::string* out);

}  // namespace cusnap
