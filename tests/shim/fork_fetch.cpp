// The export an importer fetched, across a fork the application makes in
// another thread, under the preloaded shim against the simulated driver:
// ctest shim.track.fork_fetch.
//
// Two workload processes (a creator and an importer), forked before any CUDA
// activity, act on the test's commands; the test's own process is the
// coordinator. The creator exports an allocation as a ticket; a thread of the
// importer imports it: its shim fetches the creator's export (the real
// descriptor, a file of the simulated driver named after the creator) from
// the creator's peer socket and holds it across the driver's import, which
// takes 2 s here (FAKECUDA_DELAY). While it is held, another thread of the
// importer forks a child that stays alive.
//   - the child holds no descriptor of the creator's export, which the
//     importer holds (before the fix the child kept a copy: the creator's
//     device memory kept alive by a process that never imported it)
//   - the import succeeds, and the importer holds no descriptor of the
//     export after it
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
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
using Clock = std::chrono::steady_clock;

namespace {

constexpr long kImportMs = 2000;  // the importer's cuMemImportFromShareableHandle

enum Cmd : uint64_t {
  kInit = 1,  // context (the shim's listeners start)
  kExport,    // (creator) an allocation exported as a ticket, sent to the test
  kImport,    // (importer) takes a ticket; a thread imports it; replies at once
  kJoin,      // (importer) joins that thread; replies its CUresult (the handle released)
  kFork,      // forks a child that waits to be killed; replies its pid
  kReap,      // kills and reaps that child
};

VmmBuffer g_buf;
pid_t g_child = -1;
cmds::ThreadImport g_import;

int act(int sock, uint64_t cmd, uint64_t* value) {
  switch (cmd) {
    case kInit:
      FC_REQ(init_primary() == CUDA_SUCCESS);
      return 0;
    case kExport:
      return cmds::export_ticket(sock, &g_buf);
    case kImport:
      return g_import.start(sock);
    case kJoin:
      return g_import.join(value);
    case kFork:
    case kReap:
      return cmds::fork_or_reap(cmd == kFork, &g_child, value);
    default:
      return 1;
  }
}

int workload(int sock) {
  return cmds::serve(sock, [sock](uint64_t c, uint64_t* value) { return act(sock, c, value); });
}

Child g_creator, g_importer;

/// pid's descriptors of the creator's files (the simulated driver names its
/// memory files "fakecuda:CREATOR:...").
int export_descriptors(pid_t pid) {
  const std::string tag = "fakecuda:" + std::to_string(g_creator.pid) + ":";
  int n = 0;
  for (auto& [fd, target] : cmds::descriptors_of(pid)) n += target.find(tag) != std::string::npos;
  return n;
}

int run() {
  g_creator = spawn(workload);
  REQ(g_creator.pid > 0);
  REQ(command(g_creator, kInit));
  g_importer = spawn([](int sock) {
    setenv("FAKECUDA_DELAY",
           ("cuMemImportFromShareableHandle:" + std::to_string(kImportMs)).c_str(), 1);
    return workload(sock);
  });
  REQ(g_importer.pid > 0);
  REQ(command(g_importer, kInit));

  REQ(send_u64(g_creator.sock, kExport));
  const int ticket = recv_fd(g_creator.sock);
  uint64_t r = 1;
  REQ(ticket >= 0 && recv_u64(g_creator.sock, &r) && r == 0);
  REQ(send_u64(g_importer.sock, kImport) && send_fd(g_importer.sock, ticket));
  close(ticket);
  REQ(recv_u64(g_importer.sock, &r) && r == 0);

  // The importer's thread holds the fetched export while the driver imports it.
  const auto t0 = Clock::now();
  while (export_descriptors(g_importer.pid) == 0 && cmds::ms_since(t0) < kImportMs) usleep(5000);
  const int held = export_descriptors(g_importer.pid);
  fprintf(stderr, "the importer holds %d descriptor(s) of the creator's export\n", held);
  REQ(held == 1);

  uint64_t child = 0;
  REQ(command(g_importer, kFork, &child) && child > 0);
  const int copies = export_descriptors(static_cast<pid_t>(child));
  fprintf(stderr, "the child holds %d descriptor(s) of the creator's export\n", copies);
  // The fork fell in the import: the importer held the export before it and
  // still does after (the copies count, taken in between, is of that fork).
  const bool importing = export_descriptors(g_importer.pid) == 1;
  REQ(::kill(static_cast<pid_t>(child), 0) == 0);
  REQ(command(g_importer, kReap));

  uint64_t result = ~0ull;
  REQ(command(g_importer, kJoin, &result));
  fprintf(stderr, "the import: %llu; the importer holds %d descriptor(s) of the export after it\n",
          (unsigned long long)result, export_descriptors(g_importer.pid));
  REQ(importing);
  REQ(copies == 0);
  REQ(result == CUDA_SUCCESS);
  REQ(export_descriptors(g_importer.pid) == 0);
  REQ(cmds::finish(g_creator) && cmds::finish(g_importer));
  return 0;
}

}  // namespace

int main() {
  return coordinator_main("shim.track.fork_fetch", "forkfetch", run, [] {
    g_creator.kill();
    g_importer.kill();
  });
}
