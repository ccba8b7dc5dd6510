// What the shim_track_test scenarios share (track_test.cpp: the program and
// the process-level scenarios; track_test_vmm.cpp: VMM allocations and
// multicast objects; track_test_legacy.cpp: cuMemAlloc blocks;
// track_test_ranges.cpp: copies at a block's end): checks, the
// shim's records through its control socket, tickets, byte patterns, and the
// scenarios themselves. Header-only.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "proto/control.h"
#include "proto/shim_messages.h"
#include "proto/wire.h"
#include "tests/fakecuda/fakecuda_test_util.h"

/// In a scenario: prints the failed condition and returns 1.
#define REQ(cond)                                                                            \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      fprintf(stderr, "[%d] %s:%d: failed: %s\n", (int)getpid(), __FILE__, __LINE__, #cond); \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)
#define REQ_OK(expr) REQ((expr) == CUDA_SUCCESS)

namespace track_test {

using namespace fctest;
using cusnap::UniqueFd;
namespace proto = cusnap::proto;

/// The test's runtime directory ($CUSNAP_RUNTIME_DIR), made by main.
inline std::string g_dir;
inline constexpr size_t kMiB2 = 2u << 20;

inline bool inspect(pid_t pid, proto::ShimRecords* out) {
  UniqueFd fd;
  std::string err;
  if (!proto::connect_unix(proto::shim_control_socket(g_dir, pid), std::chrono::seconds(5), &fd,
                           &err)) {
    fprintf(stderr, "inspect %d: %s\n", (int)pid, err.c_str());
    return false;
  }
  proto::Channel ch(std::move(fd), std::chrono::seconds(5));
  proto::Message m;
  if (!ch.send(proto::kMsgShimInspect, proto::Empty{}, &err) || !ch.recv(&m, &err) ||
      m.type != proto::kMsgShimRecords || !m.get(out, &err)) {
    fprintf(stderr, "inspect %d: %s\n", (int)pid, err.c_str());
    return false;
  }
  return out->format == proto::kShimRecordsFormat && out->pid == pid;
}

/// What a checkpoint does first, on this process's own shim: closes the
/// gate, drains the device work (within timeout_ms) and opens the gate; true
/// when each step was answered ok.
inline bool drain_self(uint64_t timeout_ms) {
  UniqueFd fd;
  std::string err;
  if (!proto::connect_unix(proto::shim_control_socket(g_dir, getpid()), std::chrono::seconds(5),
                           &fd, &err)) {
    fprintf(stderr, "drain: %s\n", err.c_str());
    return false;
  }
  proto::Channel ch(std::move(fd), std::chrono::seconds(10));
  auto step = [&](const char* type, const auto& payload) {
    proto::Message m;
    proto::Done d;
    if (!ch.send(type, payload, &err) || !ch.recv(&m, &err) || m.type != proto::kMsgDone ||
        !m.get(&d, &err)) {
      fprintf(stderr, "drain, %s: %s\n", type, err.c_str());
      return false;
    }
    if (!d.ok) fprintf(stderr, "drain, %s: %s\n", type, d.error.c_str());
    return d.ok;
  };
  if (!step(proto::kMsgGateClose, proto::GateRequest{5000})) return false;
  const bool drained = step(proto::kMsgShimDrain, proto::DrainRequest{timeout_ms});
  return step(proto::kMsgGateOpen, proto::Empty{}) && drained;
}

inline const proto::AllocationRecord* find_origin(const proto::ShimRecords& r, const char* origin,
                                                  int64_t creator = 0) {
  for (auto& a : r.allocations)
    if (a.origin == origin && (creator == 0 || a.creator_pid == creator)) return &a;
  return nullptr;
}

/// A tracked (logical) POSIX-fd allocation of `size` on device 0, mapped RW.
inline int make_buffer(size_t size, VmmBuffer* b) {
  return vmm_create(size, b) == CUDA_SUCCESS ? 0 : 1;
}

inline int export_ticket(CUmemGenericAllocationHandle h) {
  int fd = -1;
  if (cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != 0)
    return -1;
  return fd;
}

inline CUresult import_fd(int fd, CUmemGenericAllocationHandle* h) {
  return cuMemImportFromShareableHandle(h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
}

inline bool is_logical(uint64_t h) {
  return (h >> 48) == 0xC5A9;
}

inline void fill(CUdeviceptr p, size_t n, uint8_t v) {
  memset(reinterpret_cast<void*>(p), v, n);
}
inline bool all(CUdeviceptr p, size_t n, uint8_t v) {
  auto* b = reinterpret_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; i += 4096)
    if (b[i] != v) return false;
  return b[n - 1] == v;
}

// --- scenarios: each returns 0 when it passed ------------------------------

// VMM allocations and multicast objects (track_test_vmm.cpp).
int share2();
int share4();
int alias();
int access_unions();
int foreign();
int multicast();

// cuMemAlloc blocks: legacy IPC, stream captures, peer access, the driver's
// allocation where the shim cannot serve one, what a free waits for
// (track_test_legacy.cpp).
int ipc();
int free_in_capture();
int alloc_in_capture();
int peer();
int peer_free_race();
int alloc_fallback();
int free_sync();
int free_async();
int free_async_reap();
int nccl_free();
int context_blocks();
int context_ipc();
int ipc_open_race();

// Copies and memsets at a served block's end (track_test_ranges.cpp).
int block_end();
int block_end_threads();
int ipc_block_end();

// Processes: fork children, a busy creator, hostile peers, no cusnap
// (track_test.cpp).
int forkchild();
int busy_creator();
int hostile();
int passthrough();

}  // namespace track_test
