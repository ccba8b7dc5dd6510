// The export cache's descriptor of an allocation leaving it, across a fork
// the application makes in another thread, under the preloaded shim against
// the simulated driver: ctest shim.track.fork_export.
//
// A workload process (forked before any CUDA activity; its driver's
// cuMemRelease takes 2 s here, FAKECUDA_DELAY) acts on the test's commands.
// It creates an allocation and exports it (a ticket, closed at once): the
// shim keeps the driver's export in its export cache. A thread of the
// workload releases the allocation's last handle: the allocation leaves the
// export cache, and its descriptor is closed once the driver's release
// returns. While the release is in the driver, another thread forks a child
// that stays alive.
//   - the child holds no descriptor of the export, which the workload still
//     holds (before the fix the child kept a copy: out of the cache and in no
//     table, it was copied by the fork, keeping the memory alive in a
//     process that never exported it)
//   - the release succeeds, and the workload holds the export no more
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "tests/fakecuda/fakecuda_test_util.h"
#include "tests/shim/ckpt_client.h"
#include "tests/shim/workload_cmds.h"

using namespace fctest;
using namespace ckpt_client;
using cmds::command;

namespace {

constexpr long kReleaseMs = 2000;  // the workload's driver cuMemRelease

enum Cmd : uint64_t {
  kInit = 1,  // context (the shim's listeners start)
  kExport,    // an allocation created and exported; replies the export's number
  kRelease,   // a thread releases its handle; replies at once
  kJoin,      // joins that thread; replies its CUresult
  kFork,      // forks a child that waits to be killed; replies its pid
  kReap,      // kills and reaps that child
};

pid_t g_child = -1;
pthread_t g_releaser{};
CUmemGenericAllocationHandle g_handle = 0;
CUresult g_release_result = CUDA_ERROR_UNKNOWN;

/// pid's highest descriptor naming one of the simulated driver's memory
/// files of workload w ("fakecuda:W:..."): the export cache keeps its
/// descriptor at a high number. -1 when none.
int export_number(pid_t pid, pid_t w) {
  const std::string tag = "fakecuda:" + std::to_string(w) + ":";
  int found = -1;
  for (auto& [fd, target] : cmds::descriptors_of(pid))
    if (target.find(tag) != std::string::npos && fd > found) found = fd;
  return found;
}

void* release_thread(void*) {
  g_release_result = cuMemRelease(g_handle);
  return nullptr;
}

int act(uint64_t cmd, uint64_t* value) {
  switch (cmd) {
    case kInit:
      FC_REQ(init_primary() == CUDA_SUCCESS);
      return 0;
    case kExport: {
      CUmemAllocationProp prop{};
      prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
      prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      prop.location.id = 0;
      prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
      FC_REQ(cuMemCreate(&g_handle, 2u << 20, &prop, 0) == CUDA_SUCCESS);
      int ticket = -1;
      FC_REQ(cuMemExportToShareableHandle(
                 &ticket, g_handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS);
      close(ticket);
      *value = static_cast<uint64_t>(export_number(getpid(), getpid()));
      return 0;
    }
    case kRelease:
      FC_REQ(pthread_create(&g_releaser, nullptr, release_thread, nullptr) == 0);
      return 0;
    case kJoin:
      FC_REQ(pthread_join(g_releaser, nullptr) == 0);
      *value = static_cast<uint64_t>(g_release_result);
      return 0;
    case kFork:
    case kReap:
      return cmds::fork_or_reap(cmd == kFork, &g_child, value);
    default:
      return 1;
  }
}

Child g_workload;

int run() {
  g_workload = spawn([](int sock) {
    setenv("FAKECUDA_DELAY", ("cuMemRelease:" + std::to_string(kReleaseMs)).c_str(), 1);
    return cmds::serve(sock, act);
  });
  REQ(g_workload.pid > 0);
  REQ(command(g_workload, kInit));
  uint64_t number = 0;
  REQ(command(g_workload, kExport, &number));
  const int n = static_cast<int>(number);
  fprintf(stderr, "the workload's export cache holds the export as descriptor %d\n", n);
  REQ(n >= 0);

  const auto t0 = std::chrono::steady_clock::now();
  REQ(command(g_workload, kRelease));
  usleep(500 * 1000);  // the release is in the driver; the export out of the cache
  const bool held = export_number(g_workload.pid, g_workload.pid) == n;
  uint64_t child = 0;
  REQ(command(g_workload, kFork, &child) && child > 0);
  const int copy = export_number(static_cast<pid_t>(child), g_workload.pid);
  fprintf(stderr, "the workload %s the export; the child holds it %s\n",
          held ? "holds" : "no longer holds",
          copy >= 0 ? ("as descriptor " + std::to_string(copy)).c_str() : "not");
  const bool releasing = cmds::ms_since(t0) < kReleaseMs;  // the fork fell in the release
  REQ(::kill(static_cast<pid_t>(child), 0) == 0);
  REQ(command(g_workload, kReap));
  uint64_t result = ~0ull;
  REQ(command(g_workload, kJoin, &result));
  const int after = export_number(g_workload.pid, g_workload.pid);
  fprintf(stderr, "the release: %llu; the workload's export after it: %d\n",
          (unsigned long long)result, after);
  REQ(held && releasing);
  REQ(copy < 0);
  REQ(result == CUDA_SUCCESS);
  REQ(after < 0);
  REQ(cmds::finish(g_workload));
  return 0;
}

}  // namespace

int main() {
  return coordinator_main("shim.track.fork_export", "forkexport", run, [] { g_workload.kill(); });
}
