// recover_job: brings a job back to running after its supervisor died in the
// middle of an operation (guardian.h runs it): the driver's restore + unlock
// of every CUDA process from whatever state it is in, SIGCONT for a tree CRIU
// left stopped, shared memory rebuilt from the operation's saved bytes, and
// every shim gate opened.
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "coord/engine_internal.h"
#include "coord/manifest.h"
#include "coord/procs.h"
#include "proto/wire.h"

namespace cusnap {
using namespace engine_detail;

bool recover_job(const JobInfo& job, const std::string& state_dir, bool remove_partial,
                 std::string* report) {
  bool ok = true;
  auto note = [&](const std::string& line) { *report += line + "\n"; };
  std::vector<pid_t> tree = process_tree(job.root_pid);
  if (tree.empty()) {
    note("the job is gone: nothing to recover");
    return true;
  }
  std::vector<pid_t> cuda;
  for (pid_t pid : tree) {
    ProcessInfo p;
    if (read_process(pid, &p) && p.uses_cuda) cuda.push_back(pid);
  }
  // The driver first: every process from whatever state it is in.
  if (!cuda.empty()) {
    Driver driver;
    std::string why;
    if (!driver.load(&why)) {
      note("the driver: " + why);
      ok = false;
    } else if (!driver_resume_all(driver, cuda, {}, &why)) {
      note("driver restore: " + why);
      ok = false;
    } else {
      note("driver state of " + std::to_string(cuda.size()) + " process(es): running");
    }
  }
  for (pid_t pid : tree) {
    int fd = open_pidfd(pid);
    signal_pidfd(fd, SIGCONT);
    if (fd >= 0) close(fd);
  }
  // Shared memory: rebuilt from the saved bytes where the operation saved
  // them (a release may have happened), then every gate opens.
  const std::string shim_dir = shim_dir_of(job);
  std::vector<pid_t> saved;
  std::string why;
  if (!shared_rebuild_saved(job, state_dir, std::chrono::seconds(60), &saved, &why)) {
    note("shared memory: " + why);
    ok = false;
  } else if (!saved.empty()) {
    note("shared memory of " + std::to_string(saved.size()) + " process(es): rebuilt");
  }
  // Gates closed before anything was saved (or left by a failed rebuild's
  // caller) open now; a gate of a process whose memory is still released
  // stays closed, so that no thread touches memory that is not there.
  for (pid_t pid : cuda) {
    std::string path = proto::shim_control_socket(shim_dir, pid);
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    if (!ok && std::find(saved.begin(), saved.end(), pid) != saved.end()) continue;
    ShimClient c;
    std::string w;
    if (c.connect(path, pid, proto::control_timeout_from_env(), &w) && c.gate_open(&w))
      continue;
    note("gate of process " + std::to_string(pid) + ": " + w);
    ok = false;
  }
  // A checkpoint without its manifest is only debris.
  std::error_code ec;
  if (remove_partial && !state_dir.empty() &&
      !std::filesystem::exists(state_dir + "/" + kManifestName, ec)) {
    for (const auto& e : std::filesystem::directory_iterator(state_dir, ec))
      std::filesystem::remove_all(e.path(), ec);
    note("the unfinished checkpoint in " + state_dir + " was removed");
  }
  return ok;
}

}  // namespace cusnap
