// Simulated driver: the process checkpoint API across processes (a forked
// child is the target, this process the coordinator), the gate, timeouts,
// device remapping, and the real driver's failure modes for importers.
#include <doctest/doctest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "fakecuda_test_util.h"

using namespace fctest;

namespace {

constexpr size_t kGran = 2 << 20;
enum Cmd : uint64_t { kExit = 0, kVerify, kDriverCall, kUuid, kRelease, kReimport, kAnnouncedCall };

CUprocessState state_of(pid_t pid) {
  CUprocessState s = CU_PROCESS_STATE_FAILED;
  if (cuCheckpointProcessGetState(pid, &s) != CUDA_SUCCESS) return CU_PROCESS_STATE_FAILED;
  return s;
}

/// True when pid maps any simulated device memory.
bool maps_device_memory(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(in, line))
    if (line.find("/memfd:fakecuda:") != std::string::npos) return true;
  return false;
}

bool readable_within(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, ms) == 1;
}

/// A target holding cuMemAlloc and VMM memory with a pattern; serves commands.
int target_main(int sock) {
  FC_REQ(init_primary() == CUDA_SUCCESS);
  CUdeviceptr plain;
  FC_REQ(cuMemAlloc(&plain, 1 << 20) == CUDA_SUCCESS);
  FC_REQ(cuMemsetD32(plain, 0x600dda7a, (1 << 20) / 4) == CUDA_SUCCESS);
  VmmBuffer buf;
  FC_REQ(vmm_create(kGran, &buf) == CUDA_SUCCESS);
  FC_REQ(cuMemsetD8(buf.ptr, 0x3c, kGran) == CUDA_SUCCESS);
  FC_REQ(send_u64(sock, 1));
  for (;;) {
    uint64_t cmd = kExit;
    if (!recv_u64(sock, &cmd) || cmd == kExit) return 0;
    if (cmd == kVerify) {
      uint32_t word = 0;
      bool ok = cuMemcpyDtoH(&word, plain + 4096, 4) == CUDA_SUCCESS && word == 0x600dda7a &&
                reinterpret_cast<uint32_t*>(plain)[1000] == 0x600dda7a &&
                reinterpret_cast<unsigned char*>(buf.ptr)[kGran - 1] == 0x3c;
      FC_REQ(send_u64(sock, ok ? 0 : 1));
    } else if (cmd == kAnnouncedCall) {  // says it is about to call, then calls
      FC_REQ(send_u64(sock, 7));
      size_t f, t;
      FC_REQ(send_u64(sock, cuMemGetInfo(&f, &t)));
    } else if (cmd == kDriverCall) {
      size_t f, t;
      FC_REQ(send_u64(sock, cuMemGetInfo(&f, &t)));
    } else if (cmd == kUuid) {
      CUuuid u;
      FC_REQ(cuDeviceGetUuid(&u, 0) == CUDA_SUCCESS);
      FC_REQ(send(sock, &u, sizeof u, 0) == sizeof u);
    }
  }
}

uint64_t ask(Child& c, uint64_t cmd) {
  uint64_t v = 99;
  send_u64(c.sock, cmd);
  recv_u64(c.sock, &v);
  return v;
}

Child spawn_target() {
  Child c = spawn(target_main);
  uint64_t ready = 0;
  recv_u64(c.sock, &ready);
  return c;
}

/// The UUID of t's device 0, as t reports it.
CUuuid uuid_of(Child& t) {
  CUuuid u{};
  REQUIRE(send_u64(t.sock, kUuid));
  REQUIRE(recv(t.sock, &u, sizeof u, MSG_WAITALL) == sizeof u);
  return u;
}

/// A target driver-checkpointed (lock, checkpoint), with the GPU it ran on
/// and this process's device 0: the restore's pairs map one onto the other.
struct CheckpointedTarget {
  Child t;
  CUuuid old_uuid{};  ///< the target's device 0, before its checkpoint
  CUuuid here{};      ///< this process's device 0
};
/// uuid_seed: the target's FAKECUDA_UUID_SEED ("another machine"), or null
/// for this machine's GPUs.
CheckpointedTarget checkpointed_target(const char* uuid_seed) {
  CheckpointedTarget c;
  const std::string seed = uuid_seed ? uuid_seed : "";
  c.t = spawn([seed](int sock) {
    if (!seed.empty()) setenv("FAKECUDA_UUID_SEED", seed.c_str(), 1);
    return target_main(sock);
  });
  uint64_t ready = 0;
  REQUIRE(recv_u64(c.t.sock, &ready));
  c.old_uuid = uuid_of(c.t);
  REQUIRE(cuDeviceGetUuid(&c.here, 0) == CUDA_SUCCESS);
  REQUIRE(cuCheckpointProcessLock(c.t.pid, nullptr) == CUDA_SUCCESS);
  REQUIRE(cuCheckpointProcessCheckpoint(c.t.pid, nullptr) == CUDA_SUCCESS);
  return c;
}

}  // namespace

TEST_CASE("fakecuda: checkpoint state machine on another process") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  Child t = spawn_target();
  CHECK(state_of(t.pid) == CU_PROCESS_STATE_RUNNING);
  CHECK(maps_device_memory(t.pid));
  CHECK(cuCheckpointProcessUnlock(t.pid, nullptr) == CUDA_ERROR_ILLEGAL_STATE);
  CHECK(cuCheckpointProcessCheckpoint(t.pid, nullptr) == CUDA_ERROR_ILLEGAL_STATE);
  CHECK(cuCheckpointProcessRestore(t.pid, nullptr) == CUDA_ERROR_ILLEGAL_STATE);
  int tid = 0;
  CHECK(cuCheckpointProcessGetRestoreThreadId(t.pid, &tid) == CUDA_SUCCESS);
  struct stat st;
  CHECK(stat(("/proc/" + std::to_string(t.pid) + "/task/" + std::to_string(tid)).c_str(), &st) ==
        0);

  CUcheckpointLockArgs la{};
  la.timeoutMs = 2000;
  REQUIRE(cuCheckpointProcessLock(t.pid, &la) == CUDA_SUCCESS);
  CHECK(state_of(t.pid) == CU_PROCESS_STATE_LOCKED);
  CHECK(cuCheckpointProcessLock(t.pid, &la) == CUDA_ERROR_ILLEGAL_STATE);
  CHECK(cuCheckpointProcessRestore(t.pid, nullptr) == CUDA_ERROR_ILLEGAL_STATE);
  REQUIRE(cuCheckpointProcessCheckpoint(t.pid, nullptr) == CUDA_SUCCESS);
  CHECK(state_of(t.pid) == CU_PROCESS_STATE_CHECKPOINTED);
  CHECK_FALSE(maps_device_memory(t.pid));  // the GPU is released
  CHECK(cuCheckpointProcessCheckpoint(t.pid, nullptr) == CUDA_ERROR_ILLEGAL_STATE);
  CHECK(cuCheckpointProcessUnlock(t.pid, nullptr) == CUDA_ERROR_ILLEGAL_STATE);
  REQUIRE(cuCheckpointProcessRestore(t.pid, nullptr) == CUDA_SUCCESS);
  CHECK(state_of(t.pid) == CU_PROCESS_STATE_LOCKED);
  CHECK(maps_device_memory(t.pid));
  REQUIRE(cuCheckpointProcessUnlock(t.pid, nullptr) == CUDA_SUCCESS);
  CHECK(state_of(t.pid) == CU_PROCESS_STATE_RUNNING);
  CHECK(ask(t, kVerify) == 0);
  send_u64(t.sock, kExit);
  CHECK(t.join() == 0);
}

TEST_CASE("fakecuda: checkpoint API argument and target errors") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CHECK(cuCheckpointProcessGetState(getpid(), nullptr) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuCheckpointProcessGetRestoreThreadId(getpid(), nullptr) == CUDA_ERROR_INVALID_VALUE);
  CUprocessState s;
  CHECK(cuCheckpointProcessGetState(getpid(), &s) == CUDA_SUCCESS);
  CHECK(s == CU_PROCESS_STATE_RUNNING);
  // A process without the simulated driver initialised.
  Child idle = spawn([](int sock) {
    uint64_t v;
    recv_u64(sock, &v);
    return 0;
  });
  // As measured on an H200: NOT_INITIALIZED for GetState and Lock alike.
  CHECK(cuCheckpointProcessGetState(idle.pid, &s) == CUDA_ERROR_NOT_INITIALIZED);
  CHECK(cuCheckpointProcessLock(idle.pid, nullptr) == CUDA_ERROR_NOT_INITIALIZED);
  send_u64(idle.sock, 0);
  CHECK(idle.join() == 0);
  CHECK(cuCheckpointProcessGetState(-1, &s) == CUDA_ERROR_INVALID_VALUE);
  CUcheckpointLockArgs la{};
  la.reserved0 = 1;
  CHECK(cuCheckpointProcessLock(getpid(), &la) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("fakecuda: lock holds new driver calls at the gate until unlock") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  Child t = spawn_target();
  REQUIRE(cuCheckpointProcessLock(t.pid, nullptr) == CUDA_SUCCESS);
  REQUIRE(send_u64(t.sock, kDriverCall));
  CHECK_FALSE(readable_within(t.sock, 300));  // blocked inside cuMemGetInfo
  REQUIRE(cuCheckpointProcessUnlock(t.pid, nullptr) == CUDA_SUCCESS);
  CHECK(readable_within(t.sock, 5000));
  uint64_t r = 99;
  CHECK(recv_u64(t.sock, &r));
  CHECK(r == CUDA_SUCCESS);
  send_u64(t.sock, kExit);
  CHECK(t.join() == 0);
}

TEST_CASE("fakecuda: lock times out while a call stays inside the driver") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  Child t = spawn([](int sock) {
    setenv("FAKECUDA_DELAY", "cuMemGetInfo:1500", 1);
    return target_main(sock);
  });
  uint64_t ready;
  REQUIRE(recv_u64(t.sock, &ready));
  REQUIRE(send_u64(t.sock, kAnnouncedCall));
  uint64_t starting = 0;
  REQUIRE(recv_u64(t.sock, &starting));
  usleep(200 * 1000);  // the call is now sleeping inside the driver
  CUcheckpointLockArgs la{};
  la.timeoutMs = 300;
  CUresult locked = cuCheckpointProcessLock(t.pid, &la);
  CHECK(locked == CUDA_ERROR_NOT_READY);  // as the real driver answers
  if (locked == CUDA_SUCCESS) cuCheckpointProcessUnlock(t.pid, nullptr);  // never hang the test
  CHECK(state_of(t.pid) == CU_PROCESS_STATE_RUNNING);
  uint64_t r = 99;
  CHECK(recv_u64(t.sock, &r));
  CHECK(r == CUDA_SUCCESS);
  la.timeoutMs = 0;  // no timeout: waits for calls to drain
  CHECK(cuCheckpointProcessLock(t.pid, &la) == CUDA_SUCCESS);
  CHECK(cuCheckpointProcessUnlock(t.pid, nullptr) == CUDA_SUCCESS);
  send_u64(t.sock, kExit);
  CHECK(t.join() == 0);
}

TEST_CASE("fakecuda: a child forked after cuInit cannot initialise; the checkpoint API works") {
  // As the real driver (tests/gpu/probes/fork_after_init.cpp, H200 580.159.04):
  // cuInit and device queries fail CUDA_ERROR_NOT_INITIALIZED, the version
  // and the checkpoint API on another process answer; a grandchild likewise.
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  Child t = spawn_target();
  pid_t target = t.pid;
  auto forked_child = [target] {
    unsetenv("FAKECUDA_FORK_REINIT");
    int n = -1, v = 0;
    FC_REQ(cuInit(0) == CUDA_ERROR_NOT_INITIALIZED);
    FC_REQ(cuDeviceGetCount(&n) == CUDA_ERROR_NOT_INITIALIZED);
    FC_REQ(cuDriverGetVersion(&v) == CUDA_SUCCESS && v > 0);
    FC_REQ(state_of(target) == CU_PROCESS_STATE_RUNNING);
    FC_REQ(cuCheckpointProcessLock(target, nullptr) == CUDA_SUCCESS);
    FC_REQ(state_of(target) == CU_PROCESS_STATE_LOCKED);
    FC_REQ(cuCheckpointProcessUnlock(target, nullptr) == CUDA_SUCCESS);
    return 0;
  };
  CHECK(run_child(forked_child) == 0);
  CHECK(run_child([&] { return run_child(forked_child); }) == 0);
  // With FAKECUDA_FORK_REINIT=1 (the other tests' setting) it initialises.
  CHECK(run_child([] {
          setenv("FAKECUDA_FORK_REINIT", "1", 1);
          FC_REQ(cuInit(0) == CUDA_SUCCESS);
          return 0;
        }) == 0);
  CHECK(ask(t, kVerify) == 0);
  send_u64(t.sock, kExit);
  CHECK(t.join() == 0);
}

TEST_CASE("fakecuda: injected checkpoint failure in the coordinator") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  Child t = spawn_target();
  pid_t target = t.pid;
  CHECK(run_child([target] {
          setenv("FAKECUDA_FAIL", "cuCheckpointProcessCheckpoint:1:999", 1);
          FC_REQ(cuInit(0) == CUDA_SUCCESS);
          FC_REQ(cuCheckpointProcessLock(target, nullptr) == CUDA_SUCCESS);
          FC_REQ(cuCheckpointProcessCheckpoint(target, nullptr) == static_cast<CUresult>(999));
          FC_REQ(state_of(target) == CU_PROCESS_STATE_LOCKED);
          FC_REQ(cuCheckpointProcessCheckpoint(target, nullptr) == CUDA_SUCCESS);
          FC_REQ(cuCheckpointProcessRestore(target, nullptr) == CUDA_SUCCESS);
          FC_REQ(cuCheckpointProcessUnlock(target, nullptr) == CUDA_SUCCESS);
          return 0;
        }) == 0);
  CHECK(ask(t, kVerify) == 0);
  send_u64(t.sock, kExit);
  CHECK(t.join() == 0);
}

TEST_CASE(
    "fakecuda: restore refuses pairs the real driver refuses, the process left checkpointed") {
  // Measured on an H200 (tests/gpu/probes/restore_pairs.cpp): a pair naming
  // a GPU the process does not have, one that leaves its GPU out, one onto a
  // GPU that is not there, and two pairs of its GPU: each INVALID_VALUE, the
  // process still checkpointed; a restore without pairs then brings it back.
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  auto [t, own, here] = checkpointed_target(nullptr);
  REQUIRE(memcmp(&own, &here, sizeof own) == 0);  // its GPU is here
  CUuuid other = own;
  other.bytes[15] = static_cast<char>(other.bytes[15] ^ 0x5a);
  const std::vector<std::vector<CUcheckpointGpuPair>> refused = {
      {{own, own}, {other, own}}, {{other, own}}, {{own, other}}, {{own, own}, {own, own}}};
  for (const auto& pairs : refused) {
    CUcheckpointRestoreArgs ra{};
    ra.gpuPairs = const_cast<CUcheckpointGpuPair*>(pairs.data());
    ra.gpuPairsCount = static_cast<unsigned>(pairs.size());
    CHECK(cuCheckpointProcessRestore(t.pid, &ra) == CUDA_ERROR_INVALID_VALUE);
    CHECK(state_of(t.pid) == CU_PROCESS_STATE_CHECKPOINTED);
  }
  CUcheckpointGpuPair same{own, own};
  CUcheckpointRestoreArgs ra{};
  ra.gpuPairs = &same;
  ra.gpuPairsCount = 1;
  REQUIRE(cuCheckpointProcessRestore(t.pid, &ra) == CUDA_SUCCESS);
  REQUIRE(cuCheckpointProcessUnlock(t.pid, nullptr) == CUDA_SUCCESS);
  CHECK(ask(t, kVerify) == 0);
  send_u64(t.sock, kExit);
  CHECK(t.join() == 0);
}

TEST_CASE("fakecuda: restore remaps GPUs by UUID onto the caller's devices") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  auto [t, old_uuid, mine] = checkpointed_target("77");  // "another machine"
  REQUIRE(memcmp(&old_uuid, &mine, sizeof mine) != 0);
  // Its GPU is not here: restore without a pair fails and leaves it checkpointed.
  CHECK(cuCheckpointProcessRestore(t.pid, nullptr) == CUDA_ERROR_INVALID_VALUE);
  CHECK(state_of(t.pid) == CU_PROCESS_STATE_CHECKPOINTED);
  CUcheckpointGpuPair pair{old_uuid, mine};
  CUcheckpointRestoreArgs ra{};
  ra.gpuPairs = &pair;
  ra.gpuPairsCount = 1;
  REQUIRE(cuCheckpointProcessRestore(t.pid, &ra) == CUDA_SUCCESS);
  REQUIRE(cuCheckpointProcessUnlock(t.pid, nullptr) == CUDA_SUCCESS);
  const CUuuid now = uuid_of(t);
  CHECK(memcmp(&now, &mine, sizeof mine) == 0);
  CHECK(ask(t, kVerify) == 0);
  send_u64(t.sock, kExit);
  CHECK(t.join() == 0);
}

namespace {

/// Exporter: a VMM allocation filled with 0x77; sends a fresh export on each kReimport.
int exporter_main(int sock) {
  FC_REQ(init_primary() == CUDA_SUCCESS);
  VmmBuffer buf;
  FC_REQ(vmm_create(kGran, &buf) == CUDA_SUCCESS);
  FC_REQ(cuMemsetD8(buf.ptr, 0x77, kGran) == CUDA_SUCCESS);
  for (;;) {
    int fd = -1;
    FC_REQ(cuMemExportToShareableHandle(&fd, buf.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                        0) == CUDA_SUCCESS);
    FC_REQ(send_fd(sock, fd));
    close(fd);
    uint64_t cmd = kExit;
    if (!recv_u64(sock, &cmd) || cmd == kExit) return 0;
    if (cmd == kVerify) {
      FC_REQ(send_u64(sock, reinterpret_cast<unsigned char*>(buf.ptr)[5] == 0x78 ? 0 : 1));
      if (!recv_u64(sock, &cmd) || cmd == kExit) return 0;
    }
  }
}

/// Importer: receives a descriptor, imports, maps; can release and re-import
/// at the same address.
int importer_main(int sock) {
  FC_REQ(init_primary() == CUDA_SUCCESS);
  int fd = recv_fd(sock);
  FC_REQ(fd >= 0);
  CUmemGenericAllocationHandle h;
  FC_REQ(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == CUDA_SUCCESS);
  close(fd);
  CUdeviceptr va;
  FC_REQ(vmm_map_handle(h, kGran, &va) == CUDA_SUCCESS);
  FC_REQ(reinterpret_cast<unsigned char*>(va)[9] == 0x77);
  FC_REQ(send_u64(sock, 1));
  for (;;) {
    uint64_t cmd = kExit;
    if (!recv_u64(sock, &cmd) || cmd == kExit) return 0;
    if (cmd == kRelease) {  // keep only the address reservation
      FC_REQ(cuMemUnmap(va, kGran) == CUDA_SUCCESS);
      FC_REQ(cuMemRelease(h) == CUDA_SUCCESS);
      FC_REQ(send_u64(sock, 0));
    } else if (cmd == kReimport) {
      fd = recv_fd(sock);
      FC_REQ(fd >= 0);
      FC_REQ(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ==
             CUDA_SUCCESS);
      close(fd);
      FC_REQ(cuMemMap(va, kGran, 0, h, 0) == CUDA_SUCCESS);
      CUmemAccessDesc acc{};
      acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      FC_REQ(cuMemSetAccess(va, kGran, &acc, 1) == CUDA_SUCCESS);
      bool ok = reinterpret_cast<unsigned char*>(va)[9] == 0x77;
      reinterpret_cast<unsigned char*>(va)[5] = 0x78;  // visible to the exporter
      FC_REQ(send_u64(sock, ok ? 0 : 1));
    }
  }
}

/// Exporter + importer pair, the importer holding the mapped import.
struct Pair {
  Child exporter, importer;
};
Pair spawn_pair() {
  Pair p;
  p.exporter = spawn(exporter_main);
  p.importer = spawn(importer_main);
  int fd = recv_fd(p.exporter.sock);
  send_fd(p.importer.sock, fd);
  close(fd);
  uint64_t ready = 0;
  recv_u64(p.importer.sock, &ready);
  return p;
}

void full_cycle_ok(pid_t pid) {
  CHECK(cuCheckpointProcessLock(pid, nullptr) == CUDA_SUCCESS);
  CHECK(cuCheckpointProcessCheckpoint(pid, nullptr) == CUDA_SUCCESS);
  CHECK(cuCheckpointProcessRestore(pid, nullptr) == CUDA_SUCCESS);
  CHECK(cuCheckpointProcessUnlock(pid, nullptr) == CUDA_SUCCESS);
  CHECK(state_of(pid) == CU_PROCESS_STATE_RUNNING);
}

}  // namespace

TEST_CASE(
    "fakecuda: a POSIX-fd importer checkpoints but cannot restore (801), then unlock gives 401") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  Pair p = spawn_pair();
  pid_t imp = p.importer.pid;
  REQUIRE(cuCheckpointProcessLock(imp, nullptr) == CUDA_SUCCESS);
  CHECK(cuCheckpointProcessCheckpoint(imp, nullptr) == CUDA_SUCCESS);
  CHECK(cuCheckpointProcessRestore(imp, nullptr) == CUDA_ERROR_NOT_SUPPORTED);
  CHECK(state_of(imp) == CU_PROCESS_STATE_CHECKPOINTED);
  CHECK(cuCheckpointProcessUnlock(imp, nullptr) == CUDA_ERROR_ILLEGAL_STATE);
  full_cycle_ok(p.exporter.pid);  // the exporter restores fine
  kill(imp, SIGKILL);
  p.importer.join();
  send_u64(p.exporter.sock, kExit);
  CHECK(p.exporter.join() == 0);
}

TEST_CASE(
    "fakecuda: an importer that released its import restores and re-imports at the same address") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  Pair p = spawn_pair();
  pid_t imp = p.importer.pid;
  CHECK(ask(p.importer, kRelease) == 0);
  full_cycle_ok(imp);
  full_cycle_ok(p.exporter.pid);
  // A fresh export from the creator, mapped where the old one was.
  REQUIRE(send_u64(p.exporter.sock, kReimport));
  int fd = recv_fd(p.exporter.sock);
  REQUIRE(fd >= 0);
  REQUIRE(send_u64(p.importer.sock, kReimport));
  REQUIRE(send_fd(p.importer.sock, fd));
  close(fd);
  uint64_t ok = 99;
  REQUIRE(recv_u64(p.importer.sock, &ok));
  CHECK(ok == 0);
  CHECK(ask(p.exporter, kVerify) == 0);  // the importer's write reached the creator
  send_u64(p.importer.sock, kExit);
  CHECK(p.importer.join() == 0);
  send_u64(p.exporter.sock, kExit);
  CHECK(p.exporter.join() == 0);
}

TEST_CASE(
    "fakecuda: a legacy IPC importer checkpoints but cannot restore (1), then unlock gives 401") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  Child creator = spawn([](int sock) {
    FC_REQ(init_primary() == CUDA_SUCCESS);
    CUdeviceptr p;
    FC_REQ(cuMemAlloc(&p, 1 << 20) == CUDA_SUCCESS);
    CUipcMemHandle h;
    FC_REQ(cuIpcGetMemHandle(&h, p) == CUDA_SUCCESS);
    FC_REQ(send(sock, &h, sizeof h, 0) == sizeof h);
    uint64_t v;
    recv_u64(sock, &v);
    return 0;
  });
  CUipcMemHandle h;
  REQUIRE(recv(creator.sock, &h, sizeof h, MSG_WAITALL) == sizeof h);
  Child opener = spawn([h](int sock) {
    FC_REQ(init_primary() == CUDA_SUCCESS);
    CUdeviceptr p;
    FC_REQ(cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
    FC_REQ(send_u64(sock, 1));
    uint64_t v;
    recv_u64(sock, &v);
    return 0;
  });
  uint64_t ready;
  REQUIRE(recv_u64(opener.sock, &ready));
  REQUIRE(cuCheckpointProcessLock(opener.pid, nullptr) == CUDA_SUCCESS);
  CHECK(cuCheckpointProcessCheckpoint(opener.pid, nullptr) == CUDA_SUCCESS);
  CHECK(cuCheckpointProcessRestore(opener.pid, nullptr) == CUDA_ERROR_INVALID_VALUE);
  CHECK(state_of(opener.pid) == CU_PROCESS_STATE_CHECKPOINTED);
  CHECK(cuCheckpointProcessUnlock(opener.pid, nullptr) == CUDA_ERROR_ILLEGAL_STATE);
  full_cycle_ok(creator.pid);
  opener.kill();
  send_u64(creator.sock, 0);
  CHECK(creator.join() == 0);
}

TEST_CASE("fakecuda: repeated checkpoint cycles while threads copy through the driver") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  Child t = spawn([](int sock) {
    CUcontext ctx;
    FC_REQ(init_primary(&ctx) == CUDA_SUCCESS);
    constexpr int kThreads = 4;
    constexpr size_t kChunk = 64 << 10;
    CUdeviceptr dev;
    FC_REQ(cuMemAlloc(&dev, kThreads * kChunk) == CUDA_SUCCESS);
    std::atomic<bool> stop{false};
    std::atomic<int> errors{0}, rounds{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&, i] {
        cuCtxSetCurrent(ctx);
        std::vector<unsigned char> out(kChunk), in(kChunk);
        CUdeviceptr mine = dev + i * kChunk;
        for (unsigned round = 0; !stop; ++round) {
          memset(out.data(), static_cast<int>((round + i) & 0xff), kChunk);
          if (cuMemcpyHtoD(mine, out.data(), kChunk) != CUDA_SUCCESS ||
              cuMemcpyDtoH(in.data(), mine, kChunk) != CUDA_SUCCESS || in != out)
            ++errors;
          ++rounds;
        }
      });
    }
    FC_REQ(send_u64(sock, 1));
    uint64_t v;
    recv_u64(sock, &v);
    stop = true;
    for (auto& th : threads) th.join();
    FC_REQ(send_u64(sock, static_cast<uint64_t>(errors.load())));
    FC_REQ(send_u64(sock, static_cast<uint64_t>(rounds.load())));
    return 0;
  });
  uint64_t ready = 0;
  REQUIRE(recv_u64(t.sock, &ready));
  for (int cycle = 0; cycle < 10; ++cycle) {
    REQUIRE(driver_cycle(t.pid, 5000) == CUDA_SUCCESS);
    usleep(10 * 1000);
  }
  REQUIRE(send_u64(t.sock, 0));
  uint64_t errors = 99, rounds = 0;
  CHECK(recv_u64(t.sock, &errors));
  CHECK(recv_u64(t.sock, &rounds));
  CHECK(errors == 0);
  CHECK(rounds > 0);
  CHECK(t.join() == 0);
}
