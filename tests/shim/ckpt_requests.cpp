// The shim's side of the checkpoint of shared memory (docs/shim.md
// "Checkpoint of shared memory"), under the preloaded shim against the
// simulated driver: ctest shim.track.ckpt.
//
// Two workload processes, forked before any CUDA activity: the creator makes a
// POSIX-fd VMM allocation (shared through an export ticket) and a cuMemAlloc
// block (shared through legacy IPC); the importer imports the one and opens the
// other. The test's own process is the coordinator: it speaks the control
// protocol (src/proto) to both shims and never calls the driver itself.
//   - inspect both; drain/save/load/release/reimport refused while the gate is
//     open (drain was served: it raced with the application's captures)
//   - gate-close, drain; save of an unknown id, of an import, release of an
//     unknown origin: refused; a request of another protocol version is told
//     why and the connection serves on
//   - save each created+exported allocation into a memfd (byte counts, contents)
//   - release imported, then created: records unchanged; the simulated
//     driver's memfds (fakecuda:<creator>:<id>) gone from /proc/PID/maps and
//     /proc/PID/fd of both processes
//   - a load from a truncated file fails naming "truncated" and leaves nothing
//     mapped; new bytes written into one file before the load
//   - load + reimport (each twice: idempotent); records equal those captured
//   - gate-open; both processes see the file's bytes at the same addresses
//     (directly and through the driver), and writes flow both ways.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/fakecuda/fakecuda_test_util.h"
#include "tests/shim/ckpt_client.h"

using namespace fctest;
using namespace ckpt_client;

namespace {

constexpr size_t kVmmSize = 4u << 20;     // two 2 MiB granules
constexpr size_t kLegacyAsk = 3u << 20;   // cuMemAlloc size (rounded up to 4 MiB)
constexpr size_t kLegacySize = 4u << 20;  // what the shim's allocation holds

// Seeds of the byte patterns.
constexpr uint64_t kSeedVmm = 0x1111;     // creator writes into the VMM allocation
constexpr uint64_t kSeedLegacy = 0x2222;  // creator writes into the cuMemAlloc block
constexpr uint64_t kSeedFile = 0x3333;    // coordinator writes into the VMM file before load
constexpr uint64_t kSeedImp = 0x4444;     // importer writes after the restore
constexpr uint64_t kSeedCre = 0x5555;     // creator writes after the restore

void write_pattern(CUdeviceptr p, size_t n, uint64_t seed) {
  auto v = pattern(n, seed);
  memcpy(reinterpret_cast<void*>(p), v.data(), n);
}

/// Reads n bytes at p directly (the simulated driver's device memory is host
/// memory) and through cuMemcpyDtoH; both must hold the pattern.
bool holds_pattern(CUdeviceptr p, size_t n, uint64_t seed, bool through_driver) {
  auto want = pattern(n, seed);
  if (memcmp(reinterpret_cast<const void*>(p), want.data(), n) != 0) {
    fprintf(stderr, "[%d] 0x%llx: direct read differs from pattern %llx\n", (int)getpid(),
            (unsigned long long)p, (unsigned long long)seed);
    return false;
  }
  if (!through_driver) return true;
  std::vector<uint8_t> got(n);
  if (cuMemcpyDtoH(got.data(), p, n) != CUDA_SUCCESS || got != want) {
    fprintf(stderr, "[%d] 0x%llx: cuMemcpyDtoH differs from pattern %llx\n", (int)getpid(),
            (unsigned long long)p, (unsigned long long)seed);
    return false;
  }
  return true;
}

bool send_bytes(int sock, const void* p, size_t n) {
  return send(sock, p, n, MSG_NOSIGNAL) == static_cast<ssize_t>(n);
}
bool recv_bytes(int sock, void* p, size_t n) {
  return recv(sock, p, n, MSG_WAITALL) == static_cast<ssize_t>(n);
}

// Commands from the coordinator to the workload processes (after gate-open).
enum : uint64_t {
  kVerifyRestored = 1,  // the restored bytes are there
  kWriteOwn = 2,        // write this process's pattern
  kVerifyPeer = 3,      // the other process's pattern is there
  kFinish = 4,          // free everything, exit
};

// --- the workload processes --------------------------------------------------

/// What a workload process does on the coordinator's commands, for its view
/// of the VMM allocation (vmm) and of the cuMemAlloc block (blk): own/peer
/// are the seeds it writes and the other process writes (blk: seed + 1).
int serve(int sock, CUdeviceptr vmm, CUdeviceptr blk, uint64_t own, uint64_t peer,
          const std::function<bool()>& finish) {
  for (;;) {
    uint64_t cmd = 0;
    FC_REQ(recv_u64(sock, &cmd));
    bool ok = true;
    if (cmd == kVerifyRestored) {
      // The VMM allocation holds what the coordinator wrote into its file,
      // the block what the creator wrote before the checkpoint.
      ok = holds_pattern(vmm, kVmmSize, kSeedFile, true) &&
           holds_pattern(blk, kLegacyAsk, kSeedLegacy, true);
    } else if (cmd == kWriteOwn) {
      auto v = pattern(kVmmSize, own);
      ok = cuMemcpyHtoD(vmm, v.data(), kVmmSize) == CUDA_SUCCESS;
      write_pattern(blk, kLegacyAsk, own + 1);
    } else if (cmd == kVerifyPeer) {
      ok = holds_pattern(vmm, kVmmSize, peer, true) &&
           holds_pattern(blk, kLegacyAsk, peer + 1, true);
    } else if (cmd == kFinish) {
      // Handles, mappings and the block still work after the rebuild.
      FC_REQ(finish());
      return send_u64(sock, 1) ? 0 : 1;
    } else {
      return 1;
    }
    FC_REQ(send_u64(sock, ok ? 1 : 0));
  }
}

/// Creator: a VMM allocation exported as a ticket and a cuMemAlloc block
/// shared through legacy IPC; sends the ticket, the IPC handle and both
/// addresses, then serves the coordinator's commands.
int creator(int sock) {
  FC_REQ(init_primary() == CUDA_SUCCESS);
  VmmBuffer a;
  FC_REQ(vmm_create(kVmmSize, &a) == CUDA_SUCCESS);
  write_pattern(a.ptr, kVmmSize, kSeedVmm);
  int t = -1;
  FC_REQ(cuMemExportToShareableHandle(&t, a.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
         CUDA_SUCCESS);
  CUdeviceptr d = 0;
  FC_REQ(cuMemAlloc(&d, kLegacyAsk) == CUDA_SUCCESS);
  write_pattern(d, kLegacyAsk, kSeedLegacy);
  CUipcMemHandle ipc;
  FC_REQ(cuIpcGetMemHandle(&ipc, d) == CUDA_SUCCESS);
  FC_REQ(send_fd(sock, t));
  close(t);
  FC_REQ(send_bytes(sock, &ipc, sizeof ipc));
  FC_REQ(send_u64(sock, a.ptr) && send_u64(sock, d));
  return serve(sock, a.ptr, d, kSeedCre, kSeedImp,
               [&] { return vmm_destroy(a) == CUDA_SUCCESS && cuMemFree(d) == CUDA_SUCCESS; });
}

/// Importer: imports the ticket, maps it, opens the IPC handle; sends both
/// addresses, then serves the coordinator's commands.
int importer(int sock) {
  FC_REQ(init_primary() == CUDA_SUCCESS);
  int t = recv_fd(sock);
  FC_REQ(t >= 0);
  CUmemGenericAllocationHandle h = 0;
  FC_REQ(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(t)),
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == CUDA_SUCCESS);
  close(t);
  CUdeviceptr p = 0;
  FC_REQ(vmm_map_handle(h, kVmmSize, &p) == CUDA_SUCCESS);
  FC_REQ(holds_pattern(p, kVmmSize, kSeedVmm, true));
  CUipcMemHandle ipc;
  FC_REQ(recv_bytes(sock, &ipc, sizeof ipc));
  CUdeviceptr q = 0;
  FC_REQ(cuIpcOpenMemHandle(&q, ipc, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
  FC_REQ(holds_pattern(q, kLegacyAsk, kSeedLegacy, true));
  FC_REQ(send_u64(sock, p) && send_u64(sock, q));
  return serve(sock, p, q, kSeedImp, kSeedCre, [&] {
    return cuIpcCloseMemHandle(q) == CUDA_SUCCESS && cuMemUnmap(p, kVmmSize) == CUDA_SUCCESS &&
           cuMemAddressFree(p, kVmmSize) == CUDA_SUCCESS && cuMemRelease(h) == CUDA_SUCCESS;
  });
}

// --- the coordinator's side ---------------------------------------------------

std::string packed(const proto::ShimRecords& r) {
  msgpack::sbuffer b;
  msgpack::pack(b, r);
  return std::string(b.data(), b.size());
}

/// The records without the allocations' generations (the one field a rebuild
/// moves on; checked on their own).
proto::ShimRecords without_generations(proto::ShimRecords r) {
  for (auto& a : r.allocations) a.generation = 0;
  return r;
}

bool same_records(const proto::ShimRecords& a, const proto::ShimRecords& b, const char* when) {
  if (packed(without_generations(a)) == packed(without_generations(b))) return true;
  auto show = [](const proto::ShimRecords& r) {
    std::string s = packed(r);
    auto oh = msgpack::unpack(s.data(), s.size());
    std::ostringstream o;
    o << oh.get();
    return o.str();
  };
  fprintf(stderr, "records of %lld differ %s:\n  before: %s\n  now:    %s\n", (long long)a.pid,
          when, show(a).c_str(), show(b).c_str());
  return false;
}

/// Lines of /proc/PID/maps and targets of /proc/PID/fd/* naming the simulated
/// driver's memfd of an allocation created by process `creator`.
int fakecuda_memfds(pid_t pid, pid_t creator) {
  return proc_traces(pid, "/memfd:fakecuda:" + std::to_string(creator) + ":");
}

bool file_holds(int fd, size_t n, uint64_t seed) {
  std::vector<uint8_t> got(n);
  if (pread(fd, got.data(), n, 0) != static_cast<ssize_t>(n)) return false;
  return got == pattern(n, seed);
}

off_t file_size(int fd) {
  struct stat st {};
  return fstat(fd, &st) == 0 ? st.st_size : -1;
}

Child g_cre, g_imp;

/// Sends a command to a workload process and reads its verdict.
bool command(Child& c, uint64_t cmd) {
  uint64_t v = 0;
  return send_u64(c.sock, cmd) && recv_u64(c.sock, &v) && v == 1;
}

int run() {
  // Both workload processes start before this process touches anything.
  g_cre = spawn(creator);
  g_imp = spawn(importer);
  REQ(g_cre.pid > 0 && g_imp.pid > 0);
  const pid_t C = g_cre.pid, I = g_imp.pid;

  // Forward the ticket and the IPC handle; learn the addresses.
  int t = recv_fd(g_cre.sock);
  REQ(t >= 0);
  char link[128] = {};
  REQ(readlink(("/proc/self/fd/" + std::to_string(t)).c_str(), link, sizeof link - 1) > 0);
  REQ(strstr(link, "memfd:cusnap-ticket") != nullptr);  // a ticket, not the driver's descriptor
  REQ(send_fd(g_imp.sock, t));
  close(t);
  CUipcMemHandle ipc;
  REQ(recv_bytes(g_cre.sock, &ipc, sizeof ipc));
  REQ(memcmp(ipc.reserved, proto::kIpcMagic, 8) == 0);
  REQ(send_bytes(g_imp.sock, &ipc, sizeof ipc));
  uint64_t c_vmm = 0, c_blk = 0, i_vmm = 0, i_blk = 0;
  REQ(recv_u64(g_cre.sock, &c_vmm) && recv_u64(g_cre.sock, &c_blk));
  REQ(recv_u64(g_imp.sock, &i_vmm) && recv_u64(g_imp.sock, &i_blk));

  Shim cs, is;
  REQ(cs.connect(C) && is.connect(I));

  // What each shim knows.
  proto::ShimRecords rc, ri;
  REQ(cs.inspect(&rc) && is.inspect(&ri));
  REQ(rc.allocations.size() == 2 && ri.allocations.size() == 2);
  uint64_t vmm_id = 0, blk_id = 0;
  for (auto& a : rc.allocations) {
    REQ(a.origin == "created" && a.exported && a.creator_pid == C && a.creator_id == a.id);
    (a.legacy ? blk_id : vmm_id) = a.id;
  }
  REQ(vmm_id != 0 && blk_id != 0);
  REQ(rc.mappings.size() == 2 && rc.ipc.empty());
  for (auto& m : rc.mappings)
    REQ(m.allocation == vmm_id
            ? m.address == c_vmm && m.size == kVmmSize
            : m.allocation == blk_id && m.address == c_blk && m.size == kLegacySize);
  uint64_t imp_vmm = 0, imp_blk = 0;
  for (auto& a : ri.allocations) {
    REQ(a.origin == "imported" && a.creator_pid == C && a.creator_start == rc.start_time);
    REQ(a.creator_id == vmm_id || a.creator_id == blk_id);
    (a.creator_id == vmm_id ? imp_vmm : imp_blk) = a.id;
  }
  REQ(imp_vmm != 0 && imp_blk != 0);
  REQ(ri.ipc.size() == 1 && ri.ipc[0].address == i_blk && ri.ipc[0].allocation == imp_blk &&
      ri.ipc[0].opens == 1 && ri.ipc[0].size == kLegacySize);
  REQ(ri.mappings.size() == 2);
  for (auto& m : ri.mappings) REQ(m.address == (m.allocation == imp_vmm ? i_vmm : i_blk));
  // The importer maps the creator's memory (the simulated driver's memfds).
  REQ(fakecuda_memfds(I, C) >= 2);
  REQ(fakecuda_memfds(C, C) >= 2);

  // While the gate is open, every request of the checkpoint is refused, and
  // nothing changes.
  {
    UniqueFd f(memfd_create("ckpt-open", MFD_CLOEXEC));
    REQ(f);
    REQ(refused_with(cs.drain(), "gate is open"));
    REQ(refused_with(is.drain(), "gate is open"));
    REQ(refused_with(cs.save(vmm_id, f.get()), "gate is open"));
    REQ(refused_with(cs.load(vmm_id, f.get()), "gate is open"));
    REQ(refused_with(cs.release("created"), "gate is open"));
    REQ(refused_with(is.release("imported"), "gate is open"));
    REQ(refused_with(is.reimport(), "gate is open"));
    REQ(file_size(f.get()) == 0);
    proto::ShimRecords r;
    REQ(cs.inspect(&r) && same_records(rc, r, "after refused requests"));
    REQ(is.inspect(&r) && same_records(ri, r, "after refused requests"));
  }

  // Quiesce.
  REQ(cs.gate_close().ok && is.gate_close().ok);
  REQ(cs.drain().ok && is.drain().ok);

  // Requests that name nothing real are refused.
  {
    UniqueFd f(memfd_create("ckpt-bad", MFD_CLOEXEC));
    REQ(f);
    REQ(refused_with(cs.save(vmm_id + blk_id + 1000, f.get()), "no allocation"));
    REQ(refused_with(is.save(imp_vmm, f.get()), "not created here"));
    REQ(refused_with(cs.release("foreign"), "unknown origin"));
    REQ(refused_with(is.release("everything"), "unknown origin"));
    REQ(refused_with(cs.call(proto::kMsgShimSave, proto::AllocationRequest{vmm_id}),
                     "no file descriptor"));
    REQ(file_size(f.get()) == 0);
    // A request of another protocol version is told why, on a connection
    // that stays usable.
    const std::string other = proto::encode_body_of_version(proto::kProtocolVersion + 1,
                                                            proto::kMsgShimDrain, proto::Empty{});
    std::string err;
    REQ(cs.ch.send_body(other, -1, &err));
    proto::Message m;
    proto::Done d;
    REQ(cs.ch.recv(&m, &err) && m.type == proto::kMsgDone && m.get(&d, &err));
    REQ(!d.ok && d.error.find("unsupported protocol version") != std::string::npos);
    proto::ShimRecords r;
    REQ(cs.inspect(&r));
  }

  // Save each created and exported allocation on its creator.
  UniqueFd fv(memfd_create("ckpt-vmm", MFD_CLOEXEC));
  UniqueFd fb(memfd_create("ckpt-blk", MFD_CLOEXEC));
  REQ(fv && fb);
  proto::Done d = cs.save(vmm_id, fv.get());
  REQ(d.ok && d.bytes == kVmmSize);
  d = cs.save(blk_id, fb.get());
  REQ(d.ok && d.bytes == kLegacySize);
  REQ(file_size(fv.get()) == (off_t)kVmmSize && file_size(fb.get()) == (off_t)kLegacySize);
  REQ(file_holds(fv.get(), kVmmSize, kSeedVmm));
  REQ(file_holds(fb.get(), kLegacyAsk, kSeedLegacy));

  // Release: imported first (on every shim), then created.
  REQ(is.release("imported").ok && cs.release("imported").ok);
  {
    proto::ShimRecords r;
    REQ(is.inspect(&r) && same_records(ri, r, "after release imported"));
    REQ(cs.inspect(&r) && same_records(rc, r, "after release imported"));
  }
  REQ(fakecuda_memfds(I, C) == 0);  // the importer holds none of the creator's memory
  REQ(fakecuda_memfds(C, C) >= 2);  // the creator still does
  REQ(is.release("created").ok && cs.release("created").ok);
  {
    proto::ShimRecords r;
    REQ(cs.inspect(&r) && same_records(rc, r, "after release created"));
    REQ(is.inspect(&r) && same_records(ri, r, "after release created"));
  }
  REQ(fakecuda_memfds(C, C) == 0);  // the creator's device memory is gone too
  REQ(fakecuda_memfds(I, C) == 0);
  {
    UniqueFd f(memfd_create("ckpt-again", MFD_CLOEXEC));
    REQ(f);
    REQ(refused_with(cs.save(vmm_id, f.get()), "released"));
  }

  // Different bytes in the VMM allocation's file: the load must take them.
  {
    auto v = pattern(kVmmSize, kSeedFile);
    REQ(pwrite(fv.get(), v.data(), v.size(), 0) == (ssize_t)v.size());
  }

  // A truncated file: refused, naming it, and nothing is left mapped.
  {
    UniqueFd f(memfd_create("ckpt-short", MFD_CLOEXEC));
    REQ(f);
    auto v = pattern(kVmmSize - (1u << 20) - 4096, kSeedFile);
    REQ(write(f.get(), v.data(), v.size()) == (ssize_t)v.size());
    REQ(refused_with(cs.load(vmm_id, f.get()), "truncated"));
    REQ(fakecuda_memfds(C, C) == 0);
    proto::ShimRecords r;
    REQ(cs.inspect(&r) && same_records(rc, r, "after a failed load"));
  }

  // Load on the creator, reimport on the importer; each twice.
  d = cs.load(vmm_id, fv.get());
  REQ(d.ok && d.bytes == kVmmSize);
  d = cs.load(blk_id, fb.get());
  REQ(d.ok && d.bytes == kLegacySize);
  REQ(cs.load(vmm_id, fv.get()).ok && cs.load(blk_id, fb.get()).ok);
  REQ(fakecuda_memfds(C, C) >= 2);
  REQ(is.reimport().ok && cs.reimport().ok);
  REQ(is.reimport().ok);
  REQ(fakecuda_memfds(I, C) >= 2);
  {
    proto::ShimRecords r;
    REQ(cs.inspect(&r) && same_records(rc, r, "after load"));
    // Each load made a new incarnation; the importer holds that one.
    std::map<uint64_t, uint64_t> made;
    for (auto& a : r.allocations) {
      REQ(a.generation == 1);
      made[a.id] = a.generation;
    }
    REQ(is.inspect(&r) && same_records(ri, r, "after reimport"));
    for (auto& a : r.allocations)
      if (a.origin == "imported") REQ(made.count(a.creator_id) && made[a.creator_id] == a.generation);
  }
  REQ(cs.gate_open().ok && is.gate_open().ok);

  // The workloads see the file's bytes at the same addresses, and each
  // other's writes.
  REQ(command(g_cre, kVerifyRestored));
  REQ(command(g_imp, kVerifyRestored));
  REQ(command(g_imp, kWriteOwn));
  REQ(command(g_cre, kVerifyPeer));
  REQ(command(g_cre, kWriteOwn));
  REQ(command(g_imp, kVerifyPeer));
  REQ(command(g_imp, kFinish));
  REQ(command(g_cre, kFinish));
  REQ(g_imp.join() == 0);
  REQ(g_cre.join() == 0);
  return 0;
}

}  // namespace

int main() {
  // Small staging buffers and several workers: every copy takes several chunks.
  setenv("CUSNAP_SHIM_STAGING_MIB", "1", 0);
  setenv("CUSNAP_SHIM_COPY_THREADS", "3", 0);
  return coordinator_main("shim.track.ckpt", "ckpt", run, [] {
    for (Child* c : {&g_cre, &g_imp})
      if (c->pid > 0) {
        kill(c->pid, SIGKILL);
        c->join();
      }
  });
}
