#include "coord/process_kill.h"

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include "coord/file_read.h"

using namespace cusnap;

namespace {

/// The processes of process group pgrp that still run (not zombies).
int running_in_group(pid_t pgrp) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string stat;
    if (!read_file_bounded(e.path().string() + "/stat", {.max_bytes = 4096}, &stat)) continue;
    const size_t p = stat.rfind(')');
    char state = 0;
    int ppid = 0, group = 0;
    if (p == std::string::npos ||
        std::sscanf(stat.c_str() + p + 1, " %c %d %d", &state, &ppid, &group) != 3)
      continue;
    if (group == pgrp && state != 'Z' && state != 'X') ++n;
  }
  return n;
}

/// A process (in a group of its own) that forks 200 sleepers as fast as it
/// can, then waits; it has forked its first when this returns (up to 5 s).
pid_t forking_tree() {
  const pid_t child = fork();
  if (child == 0) {
    setpgid(0, 0);
    execl("/bin/sh", "sh", "-c", "i=0; while [ $i -lt 200 ]; do sleep 60 & i=$((i+1)); done; wait",
          nullptr);
    _exit(127);
  }
  setpgid(child, child);
  for (int i = 0; i < 1000 && running_in_group(child) < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return child;
}

/// Waits up to 5 s for group pgrp to run no process; true when it does not.
bool group_ended(pid_t pgrp) {
  for (int i = 0; i < 250; ++i) {
    if (running_in_group(pgrp) == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

}  // namespace

TEST_CASE("process_kill: a tree that forks while it is killed leaves nothing, root reaped") {
  const pid_t root = forking_tree();
  REQUIRE(root > 0);
  CHECK(kill_process_tree(root, TreeReap::kAll) >= 2);
  const bool ended = group_ended(root);
  CHECK_MESSAGE(ended, running_in_group(root) << " processes of the tree run on");
  if (!ended) kill(-root, SIGKILL);
  CHECK(waitpid(root, nullptr, WNOHANG) == -1);  // reaped already
  CHECK(errno == ECHILD);
}

TEST_CASE("process_kill: with kNotRoot, root's status is left to the caller") {
  const pid_t root = forking_tree();
  REQUIRE(root > 0);
  kill_process_tree(root, TreeReap::kNotRoot);
  int status = 0;
  REQUIRE(waitpid(root, &status, 0) == root);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
  const bool ended = group_ended(root);
  CHECK(ended);
  if (!ended) kill(-root, SIGKILL);
}
