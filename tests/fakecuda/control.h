// The per-process control socket. At cuInit every process listens on the
// abstract unix socket "\0fakecuda-ctl.<pid>" (no file; CRIU restores it under
// the same pid). Other processes that loaded the simulated driver connect to
// act on this process: the checkpoint API and legacy IPC descriptor lookup.
// One request per connection; the server writes its reply and closes the
// connection before the client's call returns (the client reads until EOF), so
// no connected socket is left when CRIU dumps the process afterwards.
#pragma once

#include "state.h"

#include <cstdint>

namespace fc {

enum class CtlOp : uint32_t {
  kGetState = 1,
  kLock,
  kCheckpoint,
  kRestore,
  kUnlock,
  kRestoreThreadId,
  kGetIpcFd,  ///< reply carries the memfd of allocation `arg` (SCM_RIGHTS)
};

constexpr uint32_t kCtlMagic = 0x66634331;  // "fcC1"
constexpr int kMaxPairs = 16;

struct CtlDevice {
  CUuuid uuid;
  char name[96];
  uint64_t total_mem;
  int32_t ledger_index;  ///< the machine's index of the GPU (Device::ledger_index)
};

struct CtlRequest {
  uint32_t magic;
  CtlOp op;
  uint32_t timeout_ms;
  uint32_t pair_count;
  uint64_t arg;
  CUcheckpointGpuPair pairs[kMaxPairs];
  uint32_t device_count;  ///< the caller's devices: the machine to restore onto
  CtlDevice devices[kMaxDevices];
};

struct CtlReply {
  uint32_t magic;
  int32_t result;
  int32_t value;  ///< state or thread id
};

/// Sends `req` to pid's control socket and waits for the reply. fd_out, when
/// given, receives a descriptor passed with the reply (or -1). Returns
/// CUDA_ERROR_INVALID_VALUE when pid runs no simulated driver.
CUresult ctl_call(int pid, const CtlRequest& req, CtlReply* reply, int* fd_out);

/// Handles one request in this (target) process; may set *fd_send.
CtlReply ctl_handle(const CtlRequest& req, int* fd_send);

/// Thread id of the control server thread (the "restore thread").
int control_thread_id();

}  // namespace fc
