// The process checkpoint API. The caller's entry points send a request to the
// target's control socket; ctl_handle runs in the target and moves its state:
//   RUNNING --lock--> LOCKED --checkpoint--> CHECKPOINTED --restore--> LOCKED
//   LOCKED --unlock--> RUNNING; a call in the wrong state gives
//   CUDA_ERROR_ILLEGAL_STATE.
// Checkpoint copies every allocation into anonymous memory, leaves PROT_NONE
// reservations at the device addresses and closes the memfds; restore makes
// new memfds, copies the bytes back and maps them at the same addresses.
// Checkpoint waits until no asynchronous kernel (kernels.cpp) is pending.
// Graphs and their execs (graphs.cpp) are host memory of the process: both
// leave them as they are, and they replay after a restore.
// Restore first checks that the devices have room for the saved bytes beside
// what other processes hold (the system-wide ledger, ledger.h); when not, it
// fails CUDA_ERROR_OUT_OF_MEMORY as the restore_memory fault point does.
// Like the real driver (measured on 580.159.04), a process that still holds an
// imported POSIX-fd allocation fails restore with CUDA_ERROR_NOT_SUPPORTED and
// one with an open legacy IPC mapping with CUDA_ERROR_INVALID_VALUE; both stay
// CHECKPOINTED.
#include "control.h"
#include "gate.h"
#include "ledger.h"
#include "memory.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

using namespace fc;

namespace {

constexpr int kAnonFlags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;

bool io_full(int fd, char* buf, size_t n, bool write) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = write ? pwrite(fd, buf + done, n - done, static_cast<off_t>(done))
                      : pread(fd, buf + done, n - done, static_cast<off_t>(done));
    if (r <= 0) return false;
    done += static_cast<size_t>(r);
  }
  return true;
}

/// Precondition: Driver::mu held, process LOCKED.
CUresult checkpoint_memory() {
  Driver& d = driver();
  for (auto& [id, a] : d.allocs) {
    if (a.fd < 0) continue;
    void* buf = mmap(nullptr, a.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    if (!io_full(a.fd, static_cast<char*>(buf), a.size, false)) {
      munmap(buf, a.size);
      return CUDA_ERROR_OPERATING_SYSTEM;
    }
    a.saved = buf;
  }
  for (auto& [va, m] : d.mappings)
    mmap(reinterpret_cast<void*>(va), m.size, PROT_NONE, kAnonFlags | MAP_FIXED, -1, 0);
  for (auto& [id, a] : d.allocs) {
    if (a.fd >= 0) close(a.fd);
    a.fd = -1;
  }
  return CUDA_SUCCESS;
}

/// Precondition: Driver::mu held, process CHECKPOINTED.
CUresult restore_memory() {
  Driver& d = driver();
  for (auto& [id, a] : d.allocs) {
    if (a.fd >= 0 || !a.saved) continue;
    const bool known = a.dev >= 0 && static_cast<size_t>(a.dev) < d.devices.size();
    int fd = make_memfd(getpid(), a.id, a.size, known ? d.devices[a.dev].ledger_index : a.dev);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    if (!io_full(fd, static_cast<char*>(a.saved), a.size, true)) {
      close(fd);
      return CUDA_ERROR_OPERATING_SYSTEM;
    }
    struct stat st {};
    fstat(fd, &st);
    munmap(a.saved, a.size);
    a.saved = nullptr;
    a.fd = fd;
    a.creator = getpid();
    a.creator_id = a.id;
    a.st_dev = st.st_dev;
    a.st_ino = st.st_ino;
  }
  for (auto& [va, m] : d.mappings) {
    Allocation* a = find_alloc(m.alloc);
    if (!a) continue;
    if (mmap(reinterpret_cast<void*>(va), m.size, m.prot, MAP_SHARED | MAP_FIXED, a->fd,
             static_cast<off_t>(m.offset)) == MAP_FAILED)
      return CUDA_ERROR_OUT_OF_MEMORY;
    madvise(reinterpret_cast<void*>(va), m.size, MADV_DONTFORK);
  }
  return CUDA_SUCCESS;
}

bool same_uuid(const CUuuid& a, const CUuuid& b) {
  return memcmp(a.bytes, b.bytes, sizeof a.bytes) == 0;
}

/// Whether the devices have room for this process's memory, as the real
/// driver finds out when it restores: per device (after the remap: the
/// caller's device of the same UUID, whose total the remap took) the bytes
/// saved at the checkpoint must fit in what the system-wide ledger leaves
/// free. The process itself holds no memfd while checkpointed.
/// CUDA_ERROR_OUT_OF_MEMORY when they do not fit anywhere.
/// Precondition: Driver::mu held, process CHECKPOINTED, devices remapped.
CUresult check_free_memory() {
  Driver& d = driver();
  uint64_t need[kMaxDevices] = {};
  uint64_t total[kMaxDevices] = {};
  bool any = false;
  for (auto& [id, a] : d.allocs) {
    if (a.fd >= 0 || !a.saved || a.dev < 0 || static_cast<size_t>(a.dev) >= d.devices.size())
      continue;
    const Device& dev = d.devices[a.dev];
    const int where = dev.ledger_index;  // the machine's index of that device
    if (where < 0 || where >= kMaxDevices) continue;
    need[where] += a.size;
    total[where] = dev.total_mem;
    any = true;
  }
  if (!any) return CUDA_SUCCESS;
  const LedgerScan scan = ledger_scan();
  for (int k = 0; k < kMaxDevices; ++k) {
    if (need[k] == 0) continue;
    const uint64_t used = scan.device[k];
    const uint64_t avail = used >= total[k] ? 0 : total[k] - used;
    if (need[k] > avail) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return CUDA_SUCCESS;
}

/// Maps this process's devices onto the caller's by UUID (pairs remap).
/// Precondition: Driver::mu held.
CUresult remap_devices(const CtlRequest& req) {
  Driver& d = driver();
  if (req.device_count == 0) return CUDA_SUCCESS;
  std::vector<Device> next = d.devices;
  // Measured (docs/gpu-runs/restore-pairs-h200.log): a pair whose old GPU
  // is not one of the process's, or two pairs of one old GPU, are refused
  // INVALID_VALUE at once, the process left checkpointed (it restores later).
  for (uint32_t p = 0; p < req.pair_count; ++p) {
    bool known = false;
    for (auto& dev : d.devices) known = known || same_uuid(dev.uuid, req.pairs[p].oldUuid);
    if (!known) return CUDA_ERROR_INVALID_VALUE;
    for (uint32_t q = 0; q < p; ++q)
      if (same_uuid(req.pairs[q].oldUuid, req.pairs[p].oldUuid)) return CUDA_ERROR_INVALID_VALUE;
  }
  for (size_t i = 0; i < d.devices.size(); ++i) {
    CUuuid want = d.devices[i].uuid;
    if (req.pair_count > 0) {
      bool found = false;
      for (uint32_t p = 0; p < req.pair_count; ++p) {
        if (same_uuid(req.pairs[p].oldUuid, want)) {
          want = req.pairs[p].newUuid;
          found = true;
          break;
        }
      }
      if (!found) return CUDA_ERROR_INVALID_VALUE;  // pairs must name every GPU
    }
    bool present = false;
    for (uint32_t k = 0; k < req.device_count && k < static_cast<uint32_t>(kMaxDevices); ++k) {
      const CtlDevice& cd = req.devices[k];
      if (!same_uuid(cd.uuid, want)) continue;
      next[i].uuid = cd.uuid;
      next[i].name.assign(cd.name, strnlen(cd.name, sizeof cd.name));
      next[i].total_mem = cd.total_mem;
      // The machine's GPU, not its place in the caller's list, which
      // CUDA_VISIBLE_DEVICES may filter and order otherwise.
      next[i].ledger_index = cd.ledger_index;
      present = true;
    }
    if (!present) return CUDA_ERROR_INVALID_VALUE;
  }
  d.devices = next;
  return CUDA_SUCCESS;
}

CUresult do_lock(uint32_t timeout_ms) {
  Gate& g = gate();
  std::unique_lock<std::mutex> l(g.mu);
  if (g.state != CU_PROCESS_STATE_RUNNING || g.locking) return CUDA_ERROR_ILLEGAL_STATE;
  g.locking = true;
  auto drained = [&] { return g.inflight == 0; };
  if (timeout_ms == 0) {
    g.cv.wait(l, drained);
  } else if (!g.cv.wait_for(l, std::chrono::milliseconds(timeout_ms), drained)) {
    g.locking = false;
    g.cv.notify_all();
    // Measured (docs/gpu-runs/state-and-lock-h200.log): a lock whose
    // timeout passes with work in flight answers NOT_READY, the process
    // left running.
    return CUDA_ERROR_NOT_READY;
  }
  g.locking = false;
  g.state = CU_PROCESS_STATE_LOCKED;
  return CUDA_SUCCESS;
}

CUresult do_checkpoint() {
  Gate& g = gate();
  {
    std::lock_guard<std::mutex> gl(g.mu);
    if (g.state != CU_PROCESS_STATE_LOCKED) return CUDA_ERROR_ILLEGAL_STATE;
  }
  // Device work drains first, as on the real driver: a kernel that waits for
  // a peer the lock has stopped (a collective in flight) keeps the checkpoint
  // here until the peer arrives; on the real driver it never returns.
  kernels_wait_idle();
  std::lock_guard<std::mutex> gl(g.mu);
  if (g.state != CU_PROCESS_STATE_LOCKED) return CUDA_ERROR_ILLEGAL_STATE;
  std::lock_guard<std::mutex> l(driver().mu);
  CUresult r = checkpoint_memory();
  if (r != CUDA_SUCCESS) {
    g.state = CU_PROCESS_STATE_FAILED;
    return r;
  }
  g.state = CU_PROCESS_STATE_CHECKPOINTED;
  return CUDA_SUCCESS;
}

CUresult do_restore(const CtlRequest& req) {
  Gate& g = gate();
  std::lock_guard<std::mutex> gl(g.mu);
  if (g.state != CU_PROCESS_STATE_CHECKPOINTED) return CUDA_ERROR_ILLEGAL_STATE;
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  for (auto& [id, a] : d.allocs)
    if (a.imported && a.kind != AllocKind::kIpcImport) return CUDA_ERROR_NOT_SUPPORTED;
  for (auto& [id, a] : d.allocs)
    if (a.kind == AllocKind::kIpcImport) return CUDA_ERROR_INVALID_VALUE;
  if (d.restore_refused) return CUDA_ERROR_OPERATING_SYSTEM;
  if (CUresult r = remap_devices(req)) return r;
  // "restore_memory" (FAKECUDA_FAIL / FAKECUDA_FAIL_FILE of this process, not
  // a driver entry point): the device memory this restore needs was taken
  // by another process meanwhile. Not logged: FAKECUDA_LOG lists calls.
  CUresult r = fault_for("restore_memory", false);
  // The same for real: other processes hold the memory (ledger.h).
  if (r == CUDA_SUCCESS) r = check_free_memory();
  if (r == CUDA_SUCCESS) r = restore_memory();
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    d.restore_refused = true;  // stays CHECKPOINTED, never restores
    return r;
  }
  if (r != CUDA_SUCCESS) {
    g.state = CU_PROCESS_STATE_FAILED;
    return r;
  }
  g.state = CU_PROCESS_STATE_LOCKED;
  d.restored = true;
  return CUDA_SUCCESS;
}

CUresult do_unlock() {
  Gate& g = gate();
  std::lock_guard<std::mutex> gl(g.mu);
  if (g.state != CU_PROCESS_STATE_LOCKED) return CUDA_ERROR_ILLEGAL_STATE;
  g.state = CU_PROCESS_STATE_RUNNING;
  g.cv.notify_all();
  return CUDA_SUCCESS;
}

int ipc_fd(uint64_t creator_id) {
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  Allocation* a = find_alloc(creator_id);
  if (!a || a->kind != AllocKind::kLegacy || a->imported || a->fd < 0) return -1;
  return dup(a->fd);
}

bool all_zero(const void* p, size_t n) {
  auto* c = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i)
    if (c[i]) return false;
  return true;
}

CUresult call(int pid, CtlRequest& req, int* value) {
  req.magic = kCtlMagic;
  CtlReply reply{};
  if (CUresult r = ctl_call(pid, req, &reply, nullptr)) return r;
  if (value) *value = reply.value;
  return static_cast<CUresult>(reply.result);
}

}  // namespace

namespace fc {

CtlReply ctl_handle(const CtlRequest& req, int* fd_send) {
  CtlReply rep{};
  CUresult r = CUDA_SUCCESS;
  switch (req.op) {
    case CtlOp::kGetState: {
      std::lock_guard<std::mutex> l(gate().mu);
      rep.value = gate().state;
      break;
    }
    case CtlOp::kLock:
      r = do_lock(req.timeout_ms);
      break;
    case CtlOp::kCheckpoint:
      r = do_checkpoint();
      break;
    case CtlOp::kRestore:
      r = do_restore(req);
      break;
    case CtlOp::kUnlock:
      r = do_unlock();
      break;
    case CtlOp::kRestoreThreadId:
      rep.value = control_thread_id();
      break;
    case CtlOp::kGetIpcFd:
      *fd_send = ipc_fd(req.arg);
      if (*fd_send < 0) r = CUDA_ERROR_INVALID_VALUE;
      break;
    default:
      r = CUDA_ERROR_INVALID_VALUE;
  }
  rep.result = r;
  return rep;
}

}  // namespace fc

FC_EXPORT CUresult cuCheckpointProcessGetState(int pid, CUprocessState* state) {
  FC_ENTER_UNGATED("cuCheckpointProcessGetState");
  FC_REQUIRE_INIT_OR_FORKED();
  if (!state) return CUDA_ERROR_INVALID_VALUE;
  CtlRequest req{};
  req.op = CtlOp::kGetState;
  int v = 0;
  CUresult r = call(pid, req, &v);
  if (r == CUDA_SUCCESS) *state = static_cast<CUprocessState>(v);
  return r;
}

FC_EXPORT CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int* tid) {
  FC_ENTER_UNGATED("cuCheckpointProcessGetRestoreThreadId");
  FC_REQUIRE_INIT_OR_FORKED();
  if (!tid) return CUDA_ERROR_INVALID_VALUE;
  CtlRequest req{};
  req.op = CtlOp::kRestoreThreadId;
  int v = 0;
  CUresult r = call(pid, req, &v);
  if (r == CUDA_SUCCESS) *tid = v;
  return r;
}

FC_EXPORT CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs* args) {
  FC_ENTER_UNGATED("cuCheckpointProcessLock");
  FC_REQUIRE_INIT_OR_FORKED();
  if (args && (args->reserved0 || !all_zero(args->reserved1, sizeof args->reserved1)))
    return CUDA_ERROR_INVALID_VALUE;
  CtlRequest req{};
  req.op = CtlOp::kLock;
  req.timeout_ms = args ? args->timeoutMs : 0;
  return call(pid, req, nullptr);
}

FC_EXPORT CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs* args) {
  FC_ENTER_UNGATED("cuCheckpointProcessCheckpoint");
  FC_REQUIRE_INIT_OR_FORKED();
  if (args && !all_zero(args->reserved, sizeof args->reserved)) return CUDA_ERROR_INVALID_VALUE;
  CtlRequest req{};
  req.op = CtlOp::kCheckpoint;
  return call(pid, req, nullptr);
}

FC_EXPORT CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs* args) {
  FC_ENTER_UNGATED("cuCheckpointProcessRestore");
  FC_REQUIRE_INIT_OR_FORKED();
  CtlRequest req{};
  req.op = CtlOp::kRestore;
  if (args) {
    if (!all_zero(args->reserved, sizeof args->reserved) || args->reserved1)
      return CUDA_ERROR_INVALID_VALUE;
    if (args->gpuPairsCount > static_cast<unsigned>(kMaxPairs)) return CUDA_ERROR_INVALID_VALUE;
    if (args->gpuPairsCount > 0 && !args->gpuPairs) return CUDA_ERROR_INVALID_VALUE;
    req.pair_count = args->gpuPairsCount;
    for (unsigned i = 0; i < args->gpuPairsCount; ++i) req.pairs[i] = args->gpuPairs[i];
  }
  {
    Driver& d = driver();
    std::lock_guard<std::mutex> l(d.mu);
    for (const Device& dev : d.devices) {
      CtlDevice& cd = req.devices[req.device_count++];
      cd.uuid = dev.uuid;
      snprintf(cd.name, sizeof cd.name, "%s", dev.name.c_str());
      cd.total_mem = dev.total_mem;
      cd.ledger_index = dev.ledger_index;
    }
  }
  return call(pid, req, nullptr);
}

FC_EXPORT CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs* args) {
  FC_ENTER_UNGATED("cuCheckpointProcessUnlock");
  FC_REQUIRE_INIT_OR_FORKED();
  if (args && !all_zero(args->reserved, sizeof args->reserved)) return CUDA_ERROR_INVALID_VALUE;
  CtlRequest req{};
  req.op = CtlOp::kUnlock;
  return call(pid, req, nullptr);
}
