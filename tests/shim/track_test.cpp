// Shared-memory tracking under the preloaded shim, against the simulated
// driver. One scenario per invocation (`shim_track_test NAME`, one ctest
// each); every scenario asserts the shim's records through its control socket.
// Children are forked: each is a fork child of the shim too (records dropped,
// registered again on its first CUDA activity).
// The scenarios are spread by topic (track_test.h lists them); this file
// holds the program and the process-level ones: fork children, a creator
// busy inside the driver, hostile peers, and a process outside cusnap.
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "tests/shim/track_test.h"

namespace track_test {

/// Fork children drop inherited records and register on their first CUDA
/// activity, including a cuGetProcAddress resolution.
int forkchild() {
  REQ_OK(init_primary());
  VmmBuffer a;
  REQ(make_buffer(kMiB2, &a) == 0);
  Child c = spawn([&](int sock) {
    // First activity: a resolution, not cuInit.
    void* fn = nullptr;
    CUdriverProcAddressQueryResult st;
    FC_REQ(cuGetProcAddress_v2("cuMemCreate", &fn, 12000, 0, &st) == CUDA_SUCCESS || fn == nullptr);
    proto::ShimRecords r;
    FC_REQ(inspect(getpid(), &r));
    FC_REQ(r.allocations.empty() && r.mappings.empty());
    FC_REQ(init_primary() == CUDA_SUCCESS);
    FC_REQ(cuMemRelease(a.handle) == CUDA_ERROR_INVALID_HANDLE);  // the parent's
    VmmBuffer b;
    FC_REQ(vmm_create(kMiB2, &b) == CUDA_SUCCESS);
    FC_REQ(inspect(getpid(), &r));
    FC_REQ(r.allocations.size() == 1 && r.allocations[0].creator_pid == getpid());
    // A grandchild too.
    Child g = spawn([](int) {
      FC_REQ(init_primary() == CUDA_SUCCESS);
      proto::ShimRecords rg;
      FC_REQ(inspect(getpid(), &rg));
      FC_REQ(rg.allocations.empty());
      return 0;
    });
    FC_REQ(g.join() == 0);
    (void)sock;
    return 0;
  });
  REQ(c.join() == 0);
  proto::ShimRecords r;
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.size() == 1 && r.allocations[0].handles == 1);
  REQ_OK(vmm_destroy(a));
  return 0;
}

/// A creator inside a long driver call (FAKECUDA_DELAY) still serves an import.
int busy_creator() {
  Child c = spawn([](int sock) {
    setenv("FAKECUDA_DELAY", "cuCtxSynchronize:4000", 1);
    FC_REQ(init_primary() == CUDA_SUCCESS);
    VmmBuffer b;
    FC_REQ(vmm_create(kMiB2, &b) == CUDA_SUCCESS);
    fill(b.ptr, b.size, 0x0B);
    int t = export_ticket(b.handle);
    FC_REQ(send_fd(sock, t));
    FC_REQ(cuCtxSynchronize() == CUDA_SUCCESS);  // 4 s inside the driver
    uint64_t v;
    FC_REQ(recv_u64(sock, &v));
    return 0;
  });
  REQ_OK(init_primary());
  int t = recv_fd(c.sock);
  REQ(t >= 0);
  usleep(200 * 1000);  // the creator is inside cuCtxSynchronize now
  auto t0 = std::chrono::steady_clock::now();
  CUmemGenericAllocationHandle h;
  REQ_OK(import_fd(t, &h));
  auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  fprintf(stderr, "import while the creator is busy: %lld ms\n", (long long)ms);
  REQ(ms < 2000);
  CUdeviceptr p;
  REQ_OK(vmm_map_handle(h, kMiB2, &p));
  REQ(all(p, kMiB2, 0x0B));
  send_u64(c.sock, 1);
  REQ(c.join() == 0);
  close(t);
  return 0;
}

namespace {

/// Raw bytes to a socket, then close.
bool poke(const std::string& path, const std::string& bytes, bool read_reply) {
  UniqueFd fd;
  std::string err;
  if (!proto::connect_unix(path, std::chrono::seconds(2), &fd, &err)) return false;
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = send(fd.get(), bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;
    off += size_t(n);
  }
  if (read_reply) {
    char buf[256];
    pollfd p{fd.get(), POLLIN, 0};
    poll(&p, 1, 3000);
    (void)!read(fd.get(), buf, sizeof(buf));
  }
  return true;
}

}  // namespace

/// Peers that die mid-exchange, malformed and oversized messages on both
/// sockets, a creator that dies, a creator's peer socket whose backlog is
/// full: the shim keeps serving, never crashes and never spins. A ticket
/// whose size is not the allocation's is refused.
int hostile() {
  setenv("CUSNAP_CONTROL_TIMEOUT", "1", 1);
  REQ_OK(init_primary());
  VmmBuffer a;
  REQ(make_buffer(kMiB2, &a) == 0);
  fill(a.ptr, a.size, 0x3C);
  const std::string peer = proto::shim_peer_socket(g_dir, getpid());
  const std::string ctl = proto::shim_control_socket(g_dir, getpid());
  auto u32 = [](uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); };
  std::vector<std::string> junk = {
      u32(0xFFFFFFFF),                                // over the 32 MiB limit
      u32(33u << 20) + "x",                           // just over, with a byte
      u32(10) + "abc",                                // truncated, then closed
      u32(3) + "\xc1\xc1\xc1",                        // not msgpack
      u32(2) + "\x91\x01",                            // wrong shape
      proto::frame(proto::encode_body("fetch", 42)),  // payload of the wrong type
      proto::frame(proto::encode_body("fetch", proto::Empty{})) + "zz",  // trailing frame bytes
      proto::frame(proto::encode_body("no-such-request", proto::Empty{})),
      proto::frame(std::string("\x93\x63\xa5\x66\x65\x74\x63\x68\x80", 9)),  // version 99
      u32(0),
  };
  for (auto& j : junk) {
    REQ(poke(peer, j, true));
    REQ(poke(ctl, j, true));
  }
  // A peer that connects and dies without a word, while another imports.
  pid_t dier = fork();
  if (dier == 0) {
    UniqueFd fd;
    std::string err;
    proto::connect_unix(peer, std::chrono::seconds(2), &fd, &err);
    send(fd.get(), "\x10\x00", 2, MSG_NOSIGNAL);
    _exit(0);  // dies mid-frame
  }
  waitpid(dier, nullptr, 0);
  // Fetch for an allocation never exported / another start time: refused.
  {
    UniqueFd fd;
    std::string err;
    REQ(proto::connect_unix(peer, std::chrono::seconds(2), &fd, &err));
    proto::Channel ch(std::move(fd), std::chrono::seconds(3));
    REQ(ch.send(proto::kMsgFetch, proto::FetchRequest{1, 999}, &err));
    proto::Message m;
    proto::FetchReply rep;
    REQ(ch.recv(&m, &err) && m.type == proto::kMsgFetched && m.get(&rep, &err));
    REQ(!rep.ok && !m.fd);
  }
  // Unknown control requests are answered, not dropped.
  {
    UniqueFd fd;
    std::string err;
    REQ(proto::connect_unix(ctl, std::chrono::seconds(2), &fd, &err));
    proto::Channel ch(std::move(fd), std::chrono::seconds(3));
    REQ(ch.send("frobnicate", proto::Empty{}, &err));
    proto::Message m;
    proto::Done done;
    REQ(ch.recv(&m, &err) && m.type == proto::kMsgDone && m.get(&done, &err) && !done.ok);
    REQ(ch.send(proto::kMsgGateClose, proto::GateRequest{1000}, &err));
    REQ(ch.recv(&m, &err) && m.get(&done, &err) && done.ok);
    REQ(ch.send(proto::kMsgGateOpen, proto::Empty{}, &err));
    REQ(ch.recv(&m, &err) && m.get(&done, &err) && done.ok);
  }
  // Still serving: a child imports and reads. First a copy of its ticket
  // that says another size (a ticket memfd anyone can make): the creator's
  // reply says the allocation's, and the import is refused (before, it was
  // recorded with the ticket's size).
  Child c = spawn([&](int sock) {
    FC_REQ(init_primary() == CUDA_SUCCESS);
    int t = recv_fd(sock);
    proto::Ticket forged{};
    FC_REQ(pread(t, &forged, sizeof forged, 0) == sizeof forged && forged.bytes == kMiB2);
    forged.bytes = 2 * kMiB2;
    UniqueFd fk(memfd_create(proto::kTicketMemfdName, MFD_CLOEXEC));
    FC_REQ(fk && pwrite(fk.get(), &forged, sizeof forged, 0) == sizeof forged);
    CUmemGenericAllocationHandle h;
    FC_REQ(import_fd(fk.get(), &h) == CUDA_ERROR_INVALID_HANDLE);
    proto::ShimRecords rc;
    FC_REQ(inspect(getpid(), &rc) && rc.allocations.empty());
    FC_REQ(import_fd(t, &h) == CUDA_SUCCESS);
    CUdeviceptr p;
    FC_REQ(vmm_map_handle(h, kMiB2, &p) == CUDA_SUCCESS);
    FC_REQ(all(p, kMiB2, 0x3C));
    return 0;
  });
  int t = export_ticket(a.handle);
  REQ(send_fd(c.sock, t));
  REQ(c.join() == 0);
  // A creator that is gone: its tickets fail cleanly.
  Child dead = spawn([](int sock) {
    FC_REQ(init_primary() == CUDA_SUCCESS);
    VmmBuffer b;
    FC_REQ(vmm_create(kMiB2, &b) == CUDA_SUCCESS);
    int tt = export_ticket(b.handle);
    FC_REQ(send_fd(sock, tt));
    return 0;
  });
  // A "creator" that accepts and dies without answering: the import ends
  // within the exchange timeout.
  {
    const std::string fake = g_dir + "/fake-peer.sock";
    int pfd[2];
    REQ(pipe(pfd) == 0);
    pid_t fk = fork();
    if (fk == 0) {
      UniqueFd l, conn;
      std::string err;
      if (!proto::listen_unix(fake, 0600, &l, &err)) _exit(1);
      (void)!write(pfd[1], "r", 1);
      pollfd pl{l.get(), POLLIN, 0};
      poll(&pl, 1, 5000);
      proto::accept_unix(l.get(), &conn, &err);
      char b[4];
      (void)!read(conn.get(), b, sizeof(b));  // half a request, then gone
      _exit(0);
    }
    char r;
    REQ(read(pfd[0], &r, 1) == 1);
    int tk = memfd_create("cusnap-ticket", MFD_CLOEXEC);
    proto::Ticket t{};
    memcpy(t.magic, proto::kTicketMagic, 8);
    t.version = proto::kTicketVersion;
    t.size = sizeof(t);
    t.creator_pid = fk;
    t.creator_start = 1;
    t.allocation = 1;
    t.bytes = kMiB2;
    snprintf(t.socket, sizeof(t.socket), "%s", fake.c_str());
    REQ(pwrite(tk, &t, sizeof(t), 0) == sizeof(t));
    auto t0 = std::chrono::steady_clock::now();
    CUmemGenericAllocationHandle hk;
    REQ(import_fd(tk, &hk) == CUDA_ERROR_INVALID_HANDLE);
    REQ(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(4));
    waitpid(fk, nullptr, 0);
    close(tk);
    close(pfd[0]);
    close(pfd[1]);
  }
  // A "creator" whose peer socket's backlog is full (it accepts nothing):
  // the import waits out the exchange timeout (1 s) between attempts to
  // connect without spinning (before, it polled the socket not yet
  // connected, which reports POLLOUT|POLLHUP at once: a core of the
  // application's busy for the whole second, inside its import call).
  {
    const std::string full = g_dir + "/full-peer.sock";
    UniqueFd l(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", full.c_str());
    REQ(l && bind(l.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
    REQ(listen(l.get(), 0) == 0);  // room for one pending connection
    std::vector<UniqueFd> queued;  // fill it
    for (int i = 0; i < 4; ++i) {
      UniqueFd q(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
      REQ(q);
      if (connect(q.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
        REQ(errno == EAGAIN);
        break;
      }
      queued.push_back(std::move(q));
    }
    REQ(!queued.empty() && queued.size() < 4);
    UniqueFd tk(memfd_create("cusnap-ticket", MFD_CLOEXEC));
    proto::Ticket t{};
    memcpy(t.magic, proto::kTicketMagic, 8);
    t.version = proto::kTicketVersion;
    t.size = sizeof(t);
    t.creator_pid = getpid();
    t.creator_start = 1;
    t.allocation = 1;
    t.bytes = kMiB2;
    snprintf(t.socket, sizeof(t.socket), "%s", full.c_str());
    REQ(tk && pwrite(tk.get(), &t, sizeof(t), 0) == sizeof(t));
    auto cpu_ms = [] {
      timespec ts{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
      return ts.tv_sec * 1000.0 + ts.tv_nsec / 1e6;
    };
    const double cpu0 = cpu_ms();
    const auto t0 = std::chrono::steady_clock::now();
    CUmemGenericAllocationHandle hk;
    REQ(import_fd(tk.get(), &hk) == CUDA_ERROR_INVALID_HANDLE);
    const auto took =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    const double cpu = cpu_ms() - cpu0;
    fprintf(stderr, "import from a peer socket with a full backlog: %lld ms, %.0f ms of CPU\n",
            (long long)took, cpu);
    REQ(took >= 900 && took < 4000);  // the exchange timeout
    REQ(cpu < 300);
  }
  int td = recv_fd(dead.sock);
  REQ(td >= 0);
  REQ(dead.join() == 0);
  CUmemGenericAllocationHandle h;
  REQ(import_fd(td, &h) == CUDA_ERROR_INVALID_HANDLE);
  proto::ShimRecords r;
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.size() == 1);
  close(td);
  close(t);
  REQ_OK(vmm_destroy(a));
  return 0;
}

/// Outside cusnap (no runtime directory) the shim tracks nothing.
int passthrough() {
  unsetenv("CUSNAP_RUNTIME_DIR");
  REQ_OK(init_primary());
  VmmBuffer a;
  REQ(make_buffer(kMiB2, &a) == 0);
  REQ(!is_logical(a.handle));
  REQ(access(proto::shim_control_socket(g_dir, getpid()).c_str(), F_OK) != 0);
  REQ_OK(vmm_destroy(a));
  return 0;
}

}  // namespace track_test

using namespace track_test;

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: shim_track_test SCENARIO\n");
    return 2;
  }
  char tmpl[] = "/tmp/cusnap-track.XXXXXX";
  if (!mkdtemp(tmpl)) return 2;
  g_dir = tmpl;
  setenv("CUSNAP_RUNTIME_DIR", tmpl, 1);
  signal(SIGPIPE, SIG_IGN);
  const std::map<std::string, int (*)()> scenarios = {
      {"share2", share2},
      {"share4", share4},
      {"alias", alias},
      {"access", access_unions},
      {"foreign", foreign},
      {"ipc", ipc},
      {"multicast", multicast},
      {"fork", forkchild},
      {"busy_creator", busy_creator},
      {"hostile", hostile},
      {"passthrough", passthrough},
      {"peer", peer},
      {"peer_free_race", peer_free_race},
      {"free_in_capture", free_in_capture},
      {"alloc_in_capture", alloc_in_capture},
      {"alloc_fallback", alloc_fallback},
      {"free_sync", free_sync},
      {"free_async", free_async},
      {"free_async_reap", free_async_reap},
      {"nccl_free", nccl_free},
      {"context_blocks", context_blocks},
      {"context_ipc", context_ipc},
      {"ipc_open_race", ipc_open_race},
      {"block_end", block_end},
      {"block_end_threads", block_end_threads},
      {"ipc_block_end", ipc_block_end},
  };
  auto it = scenarios.find(argv[1]);
  int rc = it == scenarios.end() ? 2 : it->second();
  std::string cmd = "rm -rf '" + g_dir + "'";
  if (system(cmd.c_str()) != 0) {
  }
  fprintf(stderr, "%s: %s\n", argv[1], rc == 0 ? "passed" : rc == 77 ? "skipped" : "FAILED");
  return rc;
}
