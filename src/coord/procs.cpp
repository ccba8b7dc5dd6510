#include "coord/procs.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <sstream>

#include "coord/file_read.h"
#include "proto/unique_fd.h"

namespace cusnap {

std::vector<std::string> list_dir(const std::string& path) {
  int ignored = 0;
  return list_dir(path, &ignored);
}

std::vector<std::string> list_dir(const std::string& path, int* error_number) {
  std::vector<std::string> names;
  DIR* d = opendir(path.c_str());
  if (!d) {
    *error_number = errno;
    return names;
  }
  *error_number = 0;
  for (;;) {
    errno = 0;  // readdir's end and its failure differ only in errno
    const dirent* e = readdir(d);
    if (!e) {
      *error_number = errno;
      break;
    }
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    names.emplace_back(e->d_name);
  }
  closedir(d);
  return names;
}

std::string read_link(const std::string& path) {
  char buf[4096];
  ssize_t n = readlink(path.c_str(), buf, sizeof buf - 1);
  if (n < 0) return {};
  return std::string(buf, size_t(n));
}

bool read_text_file(const std::string& path, std::string* out) {
  return read_file_bounded(path, {.max_bytes = kMaxTextFileBytes}, out);
}

std::vector<pid_t> process_tree(pid_t root) {
  std::vector<pid_t> out;
  if (root <= 0 || access(("/proc/" + std::to_string(root)).c_str(), F_OK) != 0) return out;
  std::set<pid_t> seen{root};
  std::deque<pid_t> queue{root};
  while (!queue.empty()) {
    pid_t pid = queue.front();
    queue.pop_front();
    out.push_back(pid);
    std::string task_dir = "/proc/" + std::to_string(pid) + "/task";
    for (const std::string& tid : list_dir(task_dir)) {
      std::string text;
      if (!read_text_file(task_dir + "/" + tid + "/children", &text)) continue;
      std::istringstream ss(text);
      pid_t child;
      while (ss >> child)
        if (seen.insert(child).second) queue.push_back(child);
    }
  }
  return out;
}

namespace {

/// The state letter, the parent and the session of a process
/// (/proc/PID/stat, read after the name, which may hold anything); false
/// when it cannot be read (gone).
bool read_stat(pid_t pid, char* state, int* ppid, int* session = nullptr) {
  std::string stat;
  if (!read_text_file("/proc/" + std::to_string(pid) + "/stat", &stat)) return false;
  const size_t p = stat.rfind(')');
  int pgrp = 0, sid = 0;
  if (p == std::string::npos ||
      std::sscanf(stat.c_str() + p + 1, " %c %d %d %d", state, ppid, &pgrp, &sid) != 4)
    return false;
  if (session) *session = sid;
  return true;
}

}  // namespace

std::vector<pid_t> job_leftovers(pid_t session, pid_t supervisor, pid_t except) {
  std::set<pid_t> skip{supervisor};
  if (except > 0)
    for (pid_t p : process_tree(except)) skip.insert(p);
  std::set<pid_t> found;
  for (pid_t p : process_tree(supervisor))
    if (!skip.count(p) && process_runs(p)) found.insert(p);
  for (const std::string& name : list_dir("/proc")) {
    pid_t p = 0;
    char state = 0;
    int ppid = 0, sid = 0;
    if (!parse_num(name, &p) || skip.count(p) || !read_stat(p, &state, &ppid, &sid)) continue;
    if (sid == session && state != 'Z' && state != 'X') found.insert(p);
  }
  return {found.begin(), found.end()};
}

pid_t read_ppid(pid_t pid) {
  char state;
  int ppid = 0;
  return read_stat(pid, &state, &ppid) ? ppid : 0;
}

char process_state(pid_t pid) {
  char state = 0;
  int ppid = 0;
  return read_stat(pid, &state, &ppid) ? state : 0;
}

bool process_runs(pid_t pid) {
  const char state = process_state(pid);
  return state != 0 && state != 'Z' && state != 'X';
}

bool maps_use_cuda(std::string_view maps) {
  size_t pos = 0;
  while ((pos = maps.find("libcuda.so", pos)) != std::string_view::npos) {
    // The file name, not a directory that happens to contain the string.
    size_t slash = maps.rfind('/', pos);
    size_t nl = maps.rfind('\n', pos);
    size_t eol = maps.find('\n', pos);
    size_t next_slash = maps.find('/', pos);
    bool last_component =
        next_slash == std::string_view::npos || (eol != std::string_view::npos && next_slash > eol);
    if (slash != std::string_view::npos && (nl == std::string_view::npos || slash > nl) &&
        slash + 1 == pos && last_component)
      return true;
    pos += 10;
  }
  return false;
}

bool read_process_argv(pid_t pid, std::vector<std::string>* argv) {
  std::string cmdline;
  argv->clear();
  if (!read_text_file("/proc/" + std::to_string(pid) + "/cmdline", &cmdline)) return false;
  size_t start = 0;
  while (start < cmdline.size()) {
    size_t end = cmdline.find('\0', start);
    if (end == std::string::npos) end = cmdline.size();
    argv->push_back(cmdline.substr(start, end - start));
    start = end + 1;
  }
  return true;
}

bool read_process(pid_t pid, ProcessInfo* out) {
  std::string base = "/proc/" + std::to_string(pid);
  if (!read_process_argv(pid, &out->cmdline)) return false;
  out->pid = pid;
  out->exe = read_link(base + "/exe");
  std::string maps;
  out->uses_cuda = read_text_file(base + "/maps", &maps) && maps_use_cuda(maps);
  if (!out->uses_cuda) {
    for (const std::string& fd : list_dir(base + "/fd")) {
      if (read_link(base + "/fd/" + fd).starts_with("/dev/nvidia")) {
        out->uses_cuda = true;
        break;
      }
    }
  }
  return true;
}

std::vector<DeviceAllocation> parse_device_allocations(std::string_view maps) {
  std::set<DeviceAllocation> found;
  static constexpr std::string_view kTag = "/memfd:fakecuda:";
  size_t pos = 0;
  while ((pos = maps.find(kTag, pos)) != std::string_view::npos) {
    pos += kTag.size();
    size_t end = maps.find_first_of(" \n", pos);
    std::string_view rest =
        maps.substr(pos, end == std::string_view::npos ? maps.size() - pos : end - pos);
    size_t colon = rest.find(':');
    DeviceAllocation a;
    if (colon == std::string_view::npos || !parse_num(rest.substr(0, colon), &a.creator)) continue;
    std::string_view id = rest.substr(colon + 1);
    id = id.substr(0, id.find(':'));  // ":dev<N>" follows
    if (!parse_num(id, &a.id)) continue;
    found.insert(a);
  }
  return {found.begin(), found.end()};
}

bool find_shared_device_memory(const std::map<pid_t, std::vector<DeviceAllocation>>& mapped,
                               std::string* what) {
  std::map<DeviceAllocation, pid_t> first_mapper;
  for (const auto& [pid, allocs] : mapped) {
    for (const DeviceAllocation& a : allocs) {
      std::string name =
          "device allocation " + std::to_string(a.id) + " of process " + std::to_string(a.creator);
      if (a.creator != pid) {
        *what =
            "process " + std::to_string(pid) + " maps " + name + " (created by another process)";
        return true;
      }
      auto [it, fresh] = first_mapper.emplace(a, pid);
      if (!fresh) {
        *what = "processes " + std::to_string(it->second) + " and " + std::to_string(pid) +
                " both map " + name;
        return true;
      }
    }
  }
  return false;
}

bool job_shares_device_memory(const std::vector<pid_t>& pids, std::string* what) {
  std::map<pid_t, std::vector<DeviceAllocation>> mapped;
  for (pid_t pid : pids) {
    std::string maps;
    if (read_text_file("/proc/" + std::to_string(pid) + "/maps", &maps))
      mapped[pid] = parse_device_allocations(maps);
  }
  return find_shared_device_memory(mapped, what);
}

std::vector<std::string> parse_nccl_segments(std::string_view maps) {
  std::set<std::string> found;
  size_t pos = 0;
  while ((pos = maps.find("/dev/shm/nccl-", pos)) != std::string_view::npos) {
    size_t end = maps.find_first_of(" \n", pos);
    found.emplace(maps.substr(pos, end == std::string_view::npos ? maps.size() - pos : end - pos));
    pos += 14;
  }
  return {found.begin(), found.end()};
}

bool job_uses_nccl_between_processes(const std::vector<pid_t>& cuda_pids, std::string* what) {
  std::vector<pid_t> ranks;
  std::string segment;
  for (pid_t pid : cuda_pids) {
    std::string maps;
    if (!read_text_file("/proc/" + std::to_string(pid) + "/maps", &maps)) continue;
    auto segs = parse_nccl_segments(maps);
    if (segs.empty()) continue;
    ranks.push_back(pid);
    segment = segs.front();
  }
  if (ranks.size() < 2) return false;
  *what = "processes " + std::to_string(ranks[0]) + " and " + std::to_string(ranks[1]) +
          " are NCCL ranks of one job (they map NCCL segments such as " + segment + ")";
  return true;
}

std::vector<std::string> process_gpu_uuids(pid_t pid) {
  // Device minor numbers the process has open as /dev/nvidiaN (N a number;
  // nvidiactl and nvidia-uvm are not GPUs).
  std::set<unsigned> minors;
  std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  for (const std::string& fd : list_dir(fd_dir)) {
    std::string target = read_link(fd_dir + "/" + fd);
    unsigned n;
    if (target.starts_with("/dev/nvidia") && parse_num(std::string_view(target).substr(11), &n))
      minors.insert(n);
  }
  std::vector<std::string> uuids;
  if (minors.empty()) return uuids;
  const std::string gpus = "/proc/driver/nvidia/gpus";
  for (const std::string& bus : list_dir(gpus)) {
    std::string info;
    if (!read_text_file(gpus + "/" + bus + "/information", &info)) continue;
    std::istringstream ss(info);
    std::string line, uuid;
    long minor = -1;
    while (std::getline(ss, line)) {
      auto value = [&](std::string_view key) -> std::string {
        if (!line.starts_with(key)) return {};
        size_t p = line.find_first_not_of(" \t", key.size());
        return p == std::string::npos ? std::string() : line.substr(p);
      };
      if (std::string v = value("GPU UUID:"); !v.empty()) uuid = v;
      if (std::string v = value("Device Minor:"); !v.empty()) minor = std::atol(v.c_str());
    }
    if (minor >= 0 && minors.count(unsigned(minor)) && !uuid.empty()) uuids.push_back(uuid);
  }
  return uuids;
}

bool find_terminal_fd(const std::vector<pid_t>& pids, std::string* what) {
  for (pid_t pid : pids) {
    std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
    for (const std::string& fd : list_dir(fd_dir)) {
      std::string target = read_link(fd_dir + "/" + fd);
      if (target.starts_with("/dev/pts/") || target == "/dev/tty" || target == "/dev/console" ||
          (target.starts_with("/dev/tty") && target.size() > 8)) {
        *what =
            "process " + std::to_string(pid) + " has the terminal " + target + " open as fd " + fd;
        return true;
      }
    }
  }
  return false;
}

bool find_io_uring(const std::vector<pid_t>& pids, std::string* what) {
  for (pid_t pid : pids) {
    const std::string base = "/proc/" + std::to_string(pid);
    bool found = false;
    for (const std::string& fd : list_dir(base + "/fd"))
      if (read_link(base + "/fd/" + fd) == "anon_inode:[io_uring]") found = true;
    std::string maps;
    if (!found && read_text_file(base + "/maps", &maps))
      found = maps.find("anon_inode:[io_uring]") != std::string::npos;
    if (found) {
      std::string exe = read_link(base + "/exe");
      *what = "process " + std::to_string(pid) + (exe.empty() ? "" : " (" + exe + ")") +
              " uses io_uring";
      return true;
    }
  }
  return false;
}

std::map<int, std::string> socket_fds(pid_t pid) {
  std::map<int, std::string> out;
  const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  for (const std::string& name : list_dir(fd_dir)) {
    const std::string target = read_link(fd_dir + "/" + name);
    int fd = -1;
    if (!parse_num(name, &fd)) continue;
    if (target.rfind("socket:[", 0) == 0 && target.size() > 9)
      out[fd] = target.substr(8, target.size() - 9);
  }
  return out;
}

void for_each_tcp_socket(pid_t pid, const std::function<void(const std::string&, int)>& fn) {
  const UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd) return;
  for (const auto& [target, inode] : socket_fds(pid)) {
    const UniqueFd copy(static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd.get(), target, 0)));
    if (!copy) continue;
    const int fd = copy.get();
    int domain = 0, protocol = 0;
    socklen_t len = sizeof(int);
    const bool tcp =
        ::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) == 0 &&
        (domain == AF_INET || domain == AF_INET6) &&
        (len = sizeof(int), ::getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &protocol, &len) == 0) &&
        protocol == IPPROTO_TCP;
    if (tcp) fn(inode, fd);
  }
}

size_t set_tcp_repair(const std::vector<pid_t>& pids, TcpRepair mode) {
  size_t n = 0;
  const int value = mode == TcpRepair::kOn ? 1 : 0;
  for (pid_t pid : pids)
    for_each_tcp_socket(pid, [&](const std::string&, int fd) {
      if (mode == TcpRepair::kOff) {
        tcp_repair_window w{};
        socklen_t len = sizeof w;
        if (::getsockopt(fd, IPPROTO_TCP, TCP_REPAIR_WINDOW, &w, &len) != 0)
          return;  // not in repair
      }
      // On: the kernel refuses it for sockets neither established nor closed.
      if (::setsockopt(fd, IPPROTO_TCP, TCP_REPAIR, &value, sizeof value) == 0) ++n;
    });
  return n;
}

namespace {

// A whole field of hexadecimal digits.
template <typename T>
bool parse_hex(std::string_view s, T* v) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v, 16);
  return ec == std::errc() && p == s.data() + s.size() && !s.empty();
}

// "ADDRESS:PORT" of /proc/net/tcp or tcp6: the address as network-order
// 32-bit words, each printed as a host integer (%08X); the port in hex.
bool parse_tcp_address(std::string_view field, int family, std::string* addr, uint16_t* port) {
  const size_t words = family == 6 ? 4 : 1;
  const size_t colon = field.find(':');
  uint32_t raw[4] = {};
  bool ok = colon == words * 8;
  for (size_t w = 0; ok && w < words; ++w) ok = parse_hex(field.substr(w * 8, 8), &raw[w]);
  char buf[INET6_ADDRSTRLEN];
  if (!ok || !parse_hex(field.substr(colon + 1), port) ||
      !inet_ntop(family == 6 ? AF_INET6 : AF_INET, raw, buf, sizeof buf))
    return false;
  *addr = buf;
  return true;
}

}  // namespace

std::vector<TcpTableEntry> parse_tcp_table(std::string_view text, int family) {
  std::vector<TcpTableEntry> out;
  std::istringstream in{std::string(text)};
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string sl, local, remote, st, queues, timer, retr, uid, timeout, inode;
    if (!(f >> sl >> local >> remote >> st >> queues >> timer >> retr >> uid >> timeout >> inode))
      continue;
    TcpTableEntry e;
    e.family = family;
    e.inode = inode;
    if (!parse_tcp_address(local, family, &e.addr, &e.port) ||
        !parse_tcp_address(remote, family, &e.peer_addr, &e.peer_port) || !parse_hex(st, &e.state))
      continue;
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<TcpTableEntry> read_tcp_tables(const std::string& proc_dir) {
  std::vector<TcpTableEntry> out;
  for (int family : {4, 6}) {
    std::string text;
    if (!read_text_file(proc_dir + (family == 6 ? "/net/tcp6" : "/net/tcp"), &text)) continue;
    auto part = parse_tcp_table(text, family);
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

std::vector<JobTcpSocket> job_tcp_sockets(const std::vector<pid_t>& pids) {
  std::vector<JobTcpSocket> out;
  std::set<std::string> seen;  // each socket once, however many processes hold it
  for (pid_t pid : pids) {
    std::set<std::string> held;
    for (const auto& [fd, inode] : socket_fds(pid)) held.insert(inode);
    if (held.empty()) continue;
    for (TcpTableEntry& e : read_tcp_tables("/proc/" + std::to_string(pid)))
      if (held.count(e.inode) && seen.insert(e.inode).second) out.push_back({pid, std::move(e)});
  }
  return out;
}

}  // namespace cusnap
