#include "coord/process_kill.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <set>
#include <string>
#include <utility>

#include "coord/procs.h"

namespace cusnap {

UniqueFd open_pidfd(pid_t pid) {
  return UniqueFd(int(syscall(SYS_pidfd_open, pid, 0)));
}

void signal_pidfd(const UniqueFd& pidfd, int sig) {
  if (pidfd) syscall(SYS_pidfd_send_signal, pidfd.get(), sig, nullptr, 0);
}

bool wait_pidfds_exited(const std::vector<UniqueFd>& pidfds, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  bool all = true;
  for (const UniqueFd& pidfd : pidfds) {
    if (!pidfd) continue;
    const int fd = pidfd.get();
    for (;;) {  // a pidfd polls readable once its process has exited
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() < 0) left = std::chrono::milliseconds(0);
      pollfd p{fd, POLLIN, 0};
      int r = ::poll(&p, 1, int(std::min<long long>(left.count(), 1 << 30)));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) all = false;
      break;
    }
  }
  return all;
}

namespace {

/// Reaps pid if it is the caller's child and has exited; true when it is
/// gone from the caller's view (reaped, or another's and gone from /proc).
bool reaped_or_gone(pid_t pid) {
  const pid_t r = waitpid(pid, nullptr, WNOHANG);
  return r == pid ||
         (r < 0 && errno == ECHILD && access(("/proc/" + std::to_string(pid)).c_str(), F_OK) != 0);
}

/// Whether pid is stopped (by a signal or a tracer) or can no longer run (a
/// zombie, gone).
bool stopped_or_ended(pid_t pid) {
  const char state = process_state(pid);
  return state == 0 || state == 'T' || state == 't' || state == 'Z' || state == 'X';
}

}  // namespace

size_t kill_process_tree(pid_t root, TreeReap reap) {
  // Root first, so that a look at its children is not outrun by its forks;
  // then every process found, again until a look finds none new (bounded: a
  // process stopped cannot fork, so each round only adds what forked before
  // its stop arrived).
  std::vector<std::pair<pid_t, UniqueFd>> procs;
  std::set<pid_t> seen;
  for (int round = 0; round < 20; ++round) {
    bool added = false;
    for (pid_t pid : process_tree(root)) {
      if (!seen.insert(pid).second) continue;
      UniqueFd fd = open_pidfd(pid);
      signal_pidfd(fd, SIGSTOP);
      procs.emplace_back(pid, std::move(fd));
      added = true;
    }
    if (!added) break;
    // A stop takes effect when the process next returns to user space: a
    // fork under way completes first. Each is waited for (1 s a round at
    // most, for one in an uninterruptible sleep), so that the next look sees
    // every child they made.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    for (const auto& [pid, fd] : procs)
      while (!stopped_or_ended(pid) && std::chrono::steady_clock::now() < until) usleep(1000);
  }
  // All are stopped now; killed leaves first, root last.
  for (auto it = procs.rbegin(); it != procs.rend(); ++it) signal_pidfd(it->second, SIGKILL);
  std::vector<UniqueFd> wait_for;
  for (auto& [pid, fd] : procs)
    if (reap == TreeReap::kAll || pid != root) wait_for.push_back(std::move(fd));
  wait_pidfds_exited(wait_for, std::chrono::seconds(10));
  // Exited; the caller's children among them are zombies until reaped.
  for (int round = 0; round < 50; ++round) {
    bool left = false;
    for (auto& [pid, fd] : procs) {
      if (pid <= 0 || (reap == TreeReap::kNotRoot && pid == root)) continue;
      if (reaped_or_gone(pid))
        pid = 0;
      else
        left = true;
    }
    if (!left) break;
    usleep(20000);
  }
  return procs.size();
}

}  // namespace cusnap
