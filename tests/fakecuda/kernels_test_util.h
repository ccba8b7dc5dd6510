// Helpers of the handshake-kernel tests (kernels_test.cpp,
// kernels_hooks_test.cpp): loading a kernel of the simulated driver, its
// flag words, polling, and the setup every forked child of those tests does
// first. Header-only; everything runs inside a forked child (FC_REQ).
#pragma once

#include <cuda.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <utility>

#include "fakecuda_test_util.h"

namespace fctest {

/// One granule of VMM memory: each test's flags live in one.
inline constexpr size_t kGran = 2 << 20;

/// The function `name` of a module loaded from the simulated driver's image;
/// nullptr when either step fails.
inline CUfunction load_function(const char* name) {
  static const char image[] = "fakecuda image";
  CUmodule m = nullptr;
  if (cuModuleLoadData(&m, image) != CUDA_SUCCESS) return nullptr;
  CUfunction f = nullptr;
  if (cuModuleGetFunction(&f, m, name) != CUDA_SUCCESS) return nullptr;
  return f;
}

/// A 64-bit flag word of device memory (host memory in the simulated driver).
inline volatile uint64_t* word(CUdeviceptr p) {
  return reinterpret_cast<volatile uint64_t*>(p);
}

/// Polls cond for up to ms milliseconds.
template <typename F>
bool within(int ms, F cond) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > end) return false;
    usleep(1000);
  }
  return true;
}

/// A child's start with a handshake kernel: cuInit, device 0's primary
/// context current (ctx), the kernel `name` loaded (f), one granule of VMM
/// memory (b).
struct HandshakeSetup {
  CUcontext ctx = nullptr;
  CUfunction f = nullptr;
  VmmBuffer b;

  /// 0, or 1 after printing the step that failed.
  int init(const char* name) {
    FC_REQ(init_primary(&ctx) == CUDA_SUCCESS);
    f = load_function(name);
    FC_REQ(f);
    FC_REQ(vmm_create(kGran, &b) == CUDA_SUCCESS);
    return 0;
  }
};

/// cuStreamCreate for each (stream, flags) in order; 0, or 1 after printing
/// the one that failed.
inline int create_streams(std::initializer_list<std::pair<CUstream*, unsigned>> streams) {
  for (const auto& [s, flags] : streams) FC_REQ(cuStreamCreate(s, flags) == CUDA_SUCCESS);
  return 0;
}

/// In a rank of run_rank_pair: sends the descriptor of own, receives the
/// peer's and maps it at *peer (kGran bytes, read-write). 0 on success.
inline int exchange_with_peer(int sock, const VmmBuffer& own, CUdeviceptr* peer) {
  int fd = -1;
  FC_REQ(cuMemExportToShareableHandle(&fd, own.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                      0) == CUDA_SUCCESS);
  FC_REQ(send_fd(sock, fd));
  close(fd);
  int in = recv_fd(sock);
  FC_REQ(in >= 0);
  CUmemGenericAllocationHandle h;
  FC_REQ(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(intptr_t(in)),
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == CUDA_SUCCESS);
  close(in);
  FC_REQ(vmm_map_handle(h, kGran, peer) == CUDA_SUCCESS);
  return 0;
}

/// Runs two ranks in forked children, each of which sends the descriptor of
/// its allocation and then receives the other's; forwards them crosswise.
/// Returns 0 when both ranks exit 0, else the first failure's description.
inline const char* run_rank_pair(const std::function<int(int)>& rank0,
                                 const std::function<int(int)>& rank1) {
  Child r0 = spawn(rank0), r1 = spawn(rank1);
  if (r0.pid <= 0 || r1.pid <= 0) return "a rank could not be forked";
  int fd0 = recv_fd(r0.sock), fd1 = recv_fd(r1.sock);
  const bool sent = fd0 >= 0 && fd1 >= 0 && send_fd(r0.sock, fd1) && send_fd(r1.sock, fd0);
  if (fd0 >= 0) close(fd0);
  if (fd1 >= 0) close(fd1);
  const int st0 = r0.join(), st1 = r1.join();
  if (!sent) return "the ranks' descriptors could not be exchanged";
  if (st0 != 0) return "rank 0 failed";
  if (st1 != 0) return "rank 1 failed";
  return nullptr;
}

}  // namespace fctest
