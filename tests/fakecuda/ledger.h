// The system-wide ledger of simulated device memory. Every physical
// allocation of the simulated driver is a memfd named
// "fakecuda:<creator-pid>:<allocation-id>:dev<N>" (memory.h), which every
// process holding it open shows in /proc/PID/fd as a link to
// "/memfd:fakecuda:<pid>:<id>:dev<N> (deleted)". A scan of /proc/*/fd finds
// them all: what a device has in use, and what each process holds of its own.
// A driver-checkpointed process has closed its memfds (its bytes are in
// anonymous memory): it holds nothing, as on the real driver, whose
// checkpointed processes leave the GPU's memory free and NVML's process list.
//
// Another FAKECUDA_UUID_SEED simulates another machine: a process counts
// only when the FAKECUDA_UUID_SEED it started with (/proc/PID/environ) is the
// scanner's, so that tests running side by side with their own seeds do not
// see each other's memory.
//
// Used by the driver (restore's memory check, cuMemGetInfo) and by the
// simulated NVML (nvml.cpp); free of the CUDA headers.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>

#include "device_env.h"

namespace fc {

struct LedgerScan {
  /// Bytes of the distinct memfds of each device index (the name's dev<N>;
  /// memfds of higher indices are left out).
  uint64_t device[kMaxDevices] = {};
  /// Per process: the bytes of the distinct memfds it holds open and created
  /// itself (creator pid == its pid), per device. Only processes with some.
  struct Own {
    uint64_t device[kMaxDevices] = {};
  };
  std::map<pid_t, Own> own;
};

/// Scans every process's descriptors (/proc/*/fd; processes and descriptors
/// that cannot be read, or vanish meanwhile, are skipped). A memfd is one
/// file (device and inode of the descriptor's target), counted once however
/// many descriptors of however many processes refer to it; its size is the
/// file's size. Memfds of other names are ignored.
LedgerScan ledger_scan();

/// Parses a descriptor's link target "/memfd:fakecuda:<pid>:<id>[:dev<N>]"
/// (with or without " (deleted)"); a name without ":dev<N>" is device 0.
bool ledger_parse_name(const char* target, pid_t* creator, uint64_t* id, int* dev);

}  // namespace fc
