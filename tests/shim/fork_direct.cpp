// The direct path's part file and window across a fork the application
// makes during a save, under the preloaded shim against the simulated
// driver: ctest shim.track.fork_direct.
//
// A workload process (forked before any CUDA activity, the direct path on:
// CUSNAP_SHIM_DIRECT_IO=on, its cuMemHostRegister taking 2 s here through
// FAKECUDA_DELAY) makes an allocation and acts on the test's commands; the
// test's own process is the coordinator. It closes the gate and saves the
// allocation into one part, a memory file handed over write-only (as the
// coordinator opens its part files), so the shim reopens it read-write
// through /proc/self/fd and maps its window. While the window is being
// registered the workload forks a child that stays alive.
//   - the workload then holds the part file twice (the part and the reopened
//     file) and maps it; the child holds no descriptor and no mapping of it.
//     Before the fix the child kept the reopened file and the mapping (a
//     file of the checkpoint, and its pages, in a process that never saw it)
//   - the save succeeds, and the workload holds nothing of the part after it
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>

#include "tests/fakecuda/fakecuda_test_util.h"
#include "tests/shim/ckpt_client.h"
#include "tests/shim/workload_cmds.h"

using namespace fctest;
using namespace ckpt_client;
using cmds::command;
using Clock = std::chrono::steady_clock;

namespace {

constexpr long kRegisterMs = 2000;  // the workload's cuMemHostRegister
const char* const kTag = "cusnap-part-forked";

enum Cmd : uint64_t {
  kInit = 1,  // context and a 2 MiB allocation (the shim's listeners start)
  kFork,      // forks a child that waits to be killed; replies its pid
  kReap,      // kills and reaps that child
};

pid_t g_child = -1;
VmmBuffer g_buf;

int act(uint64_t cmd, uint64_t* value) {
  switch (cmd) {
    case kInit:
      FC_REQ(init_primary() == CUDA_SUCCESS);
      FC_REQ(vmm_create(2u << 20, &g_buf) == CUDA_SUCCESS);
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
    setenv("CUSNAP_SHIM_DIRECT_IO", "on", 1);
    setenv("FAKECUDA_DELAY", ("cuMemHostRegister:" + std::to_string(kRegisterMs)).c_str(), 1);
    return cmds::serve(sock, act);
  });
  REQ(g_workload.pid > 0);
  REQ(command(g_workload, kInit));
  Shim s;
  REQ(s.connect(g_workload.pid));
  proto::ShimRecords rec;
  REQ(s.inspect(&rec));
  REQ(rec.allocations.size() == 1);
  const uint64_t id = rec.allocations[0].id;
  REQ(s.gate_close().ok);

  UniqueFd file(memfd_create(kTag, MFD_CLOEXEC));
  REQ(file);
  UniqueFd wr(open(("/proc/self/fd/" + std::to_string(file.get())).c_str(), O_WRONLY | O_CLOEXEC));
  REQ(wr);
  proto::Done saved;
  std::thread save([&] { saved = s.save(id, wr.get()); });

  // The part, the reopened file and the window's mapping, while the window
  // is being registered.
  const auto t0 = Clock::now();
  while (proc_traces(g_workload.pid, kTag) < 3 && cmds::ms_since(t0) < kRegisterMs) usleep(5000);
  const int held = proc_traces(g_workload.pid, kTag);
  fprintf(stderr, "the workload holds %d descriptor(s) and mapping(s) of the part file\n", held);

  uint64_t child = 0;
  const bool forked = command(g_workload, kFork, &child) && child > 0;
  const int copies = forked ? proc_traces(static_cast<pid_t>(child), kTag) : -1;
  fprintf(stderr, "the child holds %d descriptor(s) and mapping(s) of the part file\n", copies);
  // The fork fell in the save: the workload held the part file before it
  // and still does after.
  const bool saving = proc_traces(g_workload.pid, kTag) == 3;
  const bool alive = forked && ::kill(static_cast<pid_t>(child), 0) == 0;
  save.join();
  REQ(forked && alive && command(g_workload, kReap));
  wr.reset();
  const int after = proc_traces(g_workload.pid, kTag);
  fprintf(stderr, "the save: %s; the workload holds %d of the part file after it\n",
          saved.ok ? "ok" : saved.error.c_str(), after);
  REQ(held == 3);
  REQ(saving);
  REQ(copies == 0);
  REQ(saved.ok && saved.bytes == (2u << 20));
  REQ(after == 0);
  REQ(s.gate_open().ok);
  REQ(cmds::finish(g_workload));
  return 0;
}

}  // namespace

int main() {
  return coordinator_main("shim.track.fork_direct", "forkdirect", run, [] { g_workload.kill(); });
}
