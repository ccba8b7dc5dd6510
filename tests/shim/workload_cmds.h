// The command loop between a coordinator test (ckpt_client.h) and the
// workload processes it forks (fctest::spawn): the test sends a command, a
// u64 of the test's own numbering from 1, and the workload runs it and
// replies one u64; kFinish ends the workload. Also what such tests look at
// from outside: the sockets a process holds, its CPU time. Header-only.
#pragma once

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <sstream>
#include <string>

#include "shim/cusnap_shim.h"
#include "tests/fakecuda/fakecuda_test_util.h"

namespace cmds {

/// Ends a workload, unanswered: its exit status is then 0.
inline constexpr uint64_t kFinish = 0;

/// A workload's loop on sock: act(cmd, &value) runs each command other than
/// kFinish and value (0 unless act sets it) is the reply. act returns 0 to go
/// on, anything else (FC_REQ's 1, an unknown command) to end the workload
/// unanswered with that status.
inline int serve(int sock, const std::function<int(uint64_t cmd, uint64_t* value)>& act) {
  for (;;) {
    uint64_t cmd = 0, value = 0;
    if (!fctest::recv_u64(sock, &cmd)) return 1;
    if (cmd == kFinish) return 0;
    if (const int rc = act(cmd, &value)) return rc;
    if (!fctest::send_u64(sock, value)) return 1;
  }
}

/// In a workload: the preloaded shim's control table (its gate), found as a
/// test may look for it, by symbol; nullptr without the shim.
inline const cusnap_shim_control* shim_control() {
  auto* info = static_cast<const cusnap_shim_info*>(dlsym(RTLD_DEFAULT, "cusnap_shim_build_info"));
  return info ? info->control : nullptr;
}

/// In the test: runs cmd in workload w, its reply into *value; false (saying
/// so) when the workload did not answer.
inline bool command(const fctest::Child& w, uint64_t cmd, uint64_t* value = nullptr) {
  uint64_t r = ~0ull;
  if (!fctest::send_u64(w.sock, cmd) || !fctest::recv_u64(w.sock, &r)) {
    fprintf(stderr, "command %llu failed in workload %d\n", (unsigned long long)cmd, (int)w.pid);
    return false;
  }
  if (value) *value = r;
  return true;
}

/// In the test: ends workload w (kFinish); true when it exited with 0.
inline bool finish(fctest::Child& w) {
  return fctest::send_u64(w.sock, kFinish) && w.join() == 0;
}

/// In a workload: forks a child that waits to be killed (and ends with the
/// workload), into *child; returns once the child is past fork (its fork
/// handlers ran). 0, or FC_REQ's 1.
inline int fork_waiting_child(pid_t* child) {
  int ready[2];
  FC_REQ(pipe2(ready, O_CLOEXEC) == 0);
  *child = fork();
  FC_REQ(*child >= 0);
  if (*child == 0) {
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
  return 0;
}

/// In a workload: kills and reaps the child fork_waiting_child made, if any.
inline void reap_child(pid_t* child) {
  if (*child <= 0) return;
  kill(*child, SIGKILL);
  waitpid(*child, nullptr, 0);
  *child = -1;
}

/// In a workload, the commands of the fork tests: fork (a waiting child,
/// its pid the reply) or reap it. 0, or FC_REQ's 1.
inline int fork_or_reap(bool fork, pid_t* child, uint64_t* value) {
  if (!fork) {
    reap_child(child);
    return 0;
  }
  // The reply waits until the child is past fork (its fork handlers ran).
  if (const int rc = fork_waiting_child(child)) return rc;
  *value = static_cast<uint64_t>(*child);
  return 0;
}

/// In a workload: a 2 MiB allocation of its own into *buf, exported as a
/// POSIX file descriptor (a ticket) sent on sock. 0, or FC_REQ's 1.
inline int export_ticket(int sock, fctest::VmmBuffer* buf) {
  int ticket = -1;
  FC_REQ(fctest::vmm_create(2ull << 20, buf) == CUDA_SUCCESS);
  FC_REQ(cuMemExportToShareableHandle(&ticket, buf->handle,
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS);
  const bool sent = fctest::send_fd(sock, ticket);
  close(ticket);
  FC_REQ(sent);
  return 0;
}

/// In a workload: a ticket received on sock imported on a thread of its own
/// (the test looks at the process while the driver imports), the handle
/// released once imported. start() replies at once; join() waits for the
/// thread and gives its CUresult. Each 0, or FC_REQ's 1.
class ThreadImport {
 public:
  int start(int sock) {
    ticket_ = fctest::recv_fd(sock);
    FC_REQ(ticket_ >= 0);
    FC_REQ(pthread_create(&thread_, nullptr, run, this) == 0);
    return 0;
  }
  int join(uint64_t* value) {
    FC_REQ(pthread_join(thread_, nullptr) == 0);
    close(ticket_);
    ticket_ = -1;
    *value = static_cast<uint64_t>(result_);
    return 0;
  }

 private:
  static void* run(void* self) {
    auto* t = static_cast<ThreadImport*>(self);
    CUmemGenericAllocationHandle h = 0;
    t->result_ = cuMemImportFromShareableHandle(
        &h, reinterpret_cast<void*>(static_cast<intptr_t>(t->ticket_)),
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (t->result_ == CUDA_SUCCESS) cuMemRelease(h);
    return nullptr;
  }
  pthread_t thread_{};
  int ticket_ = -1;
  CUresult result_ = CUDA_ERROR_UNKNOWN;
};

inline long ms_since(std::chrono::steady_clock::time_point t) {
  return static_cast<long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t)
          .count());
}

/// pid's CPU time (user + system) in seconds; -1 when it cannot be read.
inline double cpu_seconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t p = stat.rfind(')');
  if (p == std::string::npos) return -1;
  std::istringstream in(stat.substr(p + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {  // fields 14 and 15
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

/// pid's descriptors: number -> what /proc/PID/fd/NUMBER links to (a path,
/// "socket:[INODE]", "pipe:[INODE]", ...).
inline std::map<int, std::string> descriptors_of(pid_t pid) {
  std::map<int, std::string> out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      char target[256];
      const ssize_t len = readlink((dir + "/" + e->d_name).c_str(), target, sizeof target - 1);
      if (len > 0) out[std::atoi(e->d_name)] = std::string(target, static_cast<size_t>(len));
    }
    closedir(d);
  }
  return out;
}

/// The sockets among pid's descriptors: "socket:[INODE]" -> a number naming it.
inline std::map<std::string, int> sockets_of(pid_t pid) {
  std::map<std::string, int> out;
  for (auto& [fd, target] : descriptors_of(pid))
    if (target.rfind("socket:", 0) == 0) out[target] = fd;
  return out;
}

/// How many of pid's descriptors are sockets (two naming one socket: two).
inline int socket_descriptors(pid_t pid) {
  int n = 0;
  for (auto& [fd, target] : descriptors_of(pid)) n += target.rfind("socket:", 0) == 0;
  return n;
}

}  // namespace cmds
