// The importer's connection to a creator's peer socket, across a fork the
// application makes in another thread, under the preloaded shim against the
// simulated driver: ctest shim.track.fork_import_conn.
//
// A workload process (forked before any CUDA activity) acts on the test's
// commands; the test's own process is the coordinator and stands in for a
// creator: it listens on a socket of its own and hands the workload a ticket
// naming itself and that socket. A thread of the workload imports the
// ticket: its shim connects to the test's socket, checks the peer and sends
// "fetch"; the test accepts and answers nothing, so the importer waits for
// the reply with the connection open. Meanwhile another thread of the
// workload forks a child that stays alive.
//   - the child holds no descriptor of the importer's connection (none of
//     its sockets is the one the workload gained when it connected); it does
//     hold the workload's own command socket, which shows the listing sees
//     what a child inherits. Before the fix the child kept a copy: the
//     connection stayed open in a process that never imported, and a creator
//     saw no end of it while the child lived
//   - once the test closes its end, the import fails (CUDA_ERROR_INVALID_HANDLE)
//     and the workload holds no descriptor of the connection after it
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>

#include "proto/shim_messages.h"
#include "tests/fakecuda/fakecuda_test_util.h"
#include "tests/shim/ckpt_client.h"
#include "tests/shim/workload_cmds.h"

using namespace fctest;
using namespace ckpt_client;
using cmds::command;
using cmds::sockets_of;
using Clock = std::chrono::steady_clock;

namespace {

enum Cmd : uint64_t {
  kInit = 1,  // context (the shim's listeners start)
  kImport,    // takes a ticket; a thread imports it; replies at once
  kJoin,      // joins that thread; replies its CUresult (the handle released)
  kFork,      // forks a child that waits to be killed; replies its pid
  kReap,      // kills and reaps that child
};

pid_t g_child = -1;
cmds::ThreadImport g_import;

int act(int sock, uint64_t cmd, uint64_t* value) {
  switch (cmd) {
    case kInit:
      FC_REQ(init_primary() == CUDA_SUCCESS);
      return 0;
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

Child g_workload;

/// A ticket naming this process as the creator, its peer socket at path.
UniqueFd forged_ticket(const std::string& path) {
  UniqueFd tk(memfd_create(proto::kTicketMemfdName, MFD_CLOEXEC));
  if (!tk) return tk;
  proto::Ticket t{};
  memcpy(t.magic, proto::kTicketMagic, sizeof t.magic);
  t.version = proto::kTicketVersion;
  t.size = sizeof t;
  t.creator_pid = getpid();
  t.creator_start = 1;
  t.allocation = 1;
  t.bytes = 2u << 20;
  snprintf(t.socket, sizeof t.socket, "%s", path.c_str());
  if (pwrite(tk.get(), &t, sizeof t, 0) != static_cast<ssize_t>(sizeof t)) tk.reset();
  return tk;
}

int run() {
  g_workload = spawn([](int sock) {
    return cmds::serve(sock, [sock](uint64_t c, uint64_t* v) { return act(sock, c, v); });
  });
  REQ(g_workload.pid > 0);
  REQ(command(g_workload, kInit));
  const auto before = sockets_of(g_workload.pid);

  const std::string path = g_dir + "/creator.sock";
  UniqueFd listener, conn;
  std::string err;
  REQ(proto::listen_unix(path, 0600, &listener, &err));
  UniqueFd ticket = forged_ticket(path);
  REQ(ticket);
  uint64_t r = 1;
  REQ(send_u64(g_workload.sock, kImport) && send_fd(g_workload.sock, ticket.get()));
  REQ(recv_u64(g_workload.sock, &r) && r == 0);

  // The importer connects and sends its fetch; the test answers nothing.
  pollfd p{listener.get(), POLLIN, 0};
  REQ(poll(&p, 1, 5000) == 1);
  REQ(proto::accept_unix(listener.get(), &conn, &err));
  std::set<std::string> gained;
  const auto t0 = Clock::now();
  while (gained.empty() && cmds::ms_since(t0) < 2000) {
    for (auto& [ino, fd] : sockets_of(g_workload.pid))
      if (!before.count(ino)) gained.insert(ino);
    if (gained.empty()) usleep(5000);
  }
  for (auto& ino : gained) fprintf(stderr, "the importer's connection: %s\n", ino.c_str());
  REQ(gained.size() == 1);

  uint64_t child = 0;
  REQ(command(g_workload, kFork, &child) && child > 0);
  bool copied = false, inherited = false;
  for (auto& [ino, fd] : sockets_of(static_cast<pid_t>(child))) {
    if (gained.count(ino)) {
      fprintf(stderr, "the child holds the importer's connection %s as descriptor %d\n",
              ino.c_str(), fd);
      copied = true;
    }
    inherited = inherited || before.count(ino);
  }
  fprintf(stderr, "the child %s the workload's command socket\n",
          inherited ? "inherited" : "did not inherit");
  REQ(::kill(static_cast<pid_t>(child), 0) == 0);
  REQ(command(g_workload, kReap));

  // The creator goes away: the import fails, the connection closed.
  conn.reset();
  uint64_t result = ~0ull;
  REQ(command(g_workload, kJoin, &result));
  int left = 0;
  for (auto& [ino, fd] : sockets_of(g_workload.pid)) left += gained.count(ino) > 0;
  fprintf(stderr, "the import: %llu; the importer holds %d descriptor(s) of the connection after\n",
          (unsigned long long)result, left);
  REQ(!copied && inherited);
  REQ(result == CUDA_ERROR_INVALID_HANDLE);
  REQ(left == 0);
  REQ(cmds::finish(g_workload));
  return 0;
}

}  // namespace

int main() {
  return coordinator_main("shim.track.fork_import_conn", "forkimpconn", run,
                          [] { g_workload.kill(); });
}
