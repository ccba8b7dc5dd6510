// Helpers of the handshake-kernel tests (kernels_test.cpp,
// kernels_hooks_test.cpp): loading a kernel of the simulated driver, its
// flag words, polling, and the setup every forked child of those tests does
// first. Header-only; everything runs inside a forked child (FC_REQ).
#pragma once

#include <cuda.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
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

}  // namespace fctest
