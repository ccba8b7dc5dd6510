// Simulated driver: the operations outside streams.cpp that wait for
// asynchronous handshake kernels: cuCtxSynchronize (every stream of the
// context, the NULL stream and per-thread streams included) and copies and
// memsets ordered after a pending kernel of their stream.
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "fakecuda_test_util.h"
#include "kernels_test_util.h"

using namespace fctest;

extern "C" CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int, unsigned int, unsigned int,
                                       unsigned int, unsigned int, unsigned int, unsigned int,
                                       CUstream, void**, void**);

namespace {

constexpr const char* kHandshake = "ncclDevKernel_Handshake_Hooks";

CUresult launch(CUfunction f, CUstream s, CUdeviceptr mine, CUdeviceptr peer, uint64_t step,
                bool ptsz = false) {
  void* params[] = {&mine, &peer, &step};
  return ptsz ? cuLaunchKernel_ptsz(f, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr)
              : cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr);
}

/// Runs call on a thread (with ctx current): it must still be running after
/// 100 ms, return `want` within 5 s once release() ran. 0 when so.
template <typename Call, typename Release>
int blocks_until(CUcontext ctx, Call call, Release release, CUresult want) {
  std::atomic<bool> done{false};
  std::atomic<int> result{-1};
  std::thread t([&] {
    cuCtxSetCurrent(ctx);
    result = call();
    done = true;
  });
  usleep(100 * 1000);
  bool early = done.load();
  release();
  bool returned = within(5000, [&] { return done.load(); });
  if (!returned) {
    fprintf(stderr, "child %d: the call did not return after the release\n", (int)getpid());
    _exit(1);  // the thread is stuck: no join
  }
  t.join();
  if (early) fprintf(stderr, "child %d: the call returned before the release\n", (int)getpid());
  if (result != want) fprintf(stderr, "child %d: result %d\n", (int)getpid(), result.load());
  return early || result != want ? 1 : 0;
}

/// Runs body(ctx, f, b, s, nb) in a forked child after the start both cases
/// share: the kernel f in context ctx, one granule b, a blocking stream s and
/// a non-blocking one nb. The child's exit status (0 = passed).
template <typename Body>
int run_with_kernel(Body body) {
  return run_child([&] {
    HandshakeSetup k;
    FC_REQ(k.init(kHandshake) == 0);
    CUstream s, nb;
    FC_REQ(create_streams({{&s, 0}, {&nb, CU_STREAM_NON_BLOCKING}}) == 0);
    return body(k.ctx, k.f, k.b, s, nb);
  });
}

}  // namespace

TEST_CASE("fakecuda: cuCtxSynchronize waits for the kernels of every stream") {
  CHECK(run_with_kernel([](CUcontext ctx, CUfunction f, const VmmBuffer& b, CUstream s,
                           CUstream nb) {
          CUdeviceptr flag = b.ptr, peer = b.ptr + 8;
          // A created stream, a non-blocking one, the legacy NULL stream and
          // this thread's per-thread stream.
          FC_REQ(launch(f, s, flag, peer, 1) == CUDA_SUCCESS);
          FC_REQ(blocks_until(ctx, [] { return cuCtxSynchronize(); }, [&] { *word(peer) = 1; },
                              CUDA_SUCCESS) == 0);
          FC_REQ(launch(f, nb, flag, peer, 2) == CUDA_SUCCESS);
          FC_REQ(blocks_until(ctx, [&] { return cuCtxSynchronize_v2(ctx); },
                              [&] { *word(peer) = 2; }, CUDA_SUCCESS) == 0);
          FC_REQ(launch(f, nullptr, flag, peer, 3) == CUDA_SUCCESS);
          FC_REQ(blocks_until(ctx, [] { return cuCtxSynchronize(); }, [&] { *word(peer) = 3; },
                              CUDA_SUCCESS) == 0);
          FC_REQ(launch(f, nullptr, flag, peer, 4, true) == CUDA_SUCCESS);
          FC_REQ(blocks_until(ctx, [] { return cuCtxSynchronize(); }, [&] { *word(peer) = 4; },
                              CUDA_SUCCESS) == 0);
          // Another context's kernel is not waited for.
          CUcontext other;
          FC_REQ(cuCtxCreate(&other, nullptr, 0, 0) == CUDA_SUCCESS);
          FC_REQ(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
          FC_REQ(launch(f, s, flag, peer, 5) == CUDA_SUCCESS);
          FC_REQ(cuCtxSetCurrent(other) == CUDA_SUCCESS);
          FC_REQ(cuCtxSynchronize() == CUDA_SUCCESS);
          FC_REQ(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
          FC_REQ(cuStreamQuery(s) == CUDA_ERROR_NOT_READY);
          *word(peer) = 5;
          FC_REQ(cuCtxSynchronize() == CUDA_SUCCESS);
          // A fault is reported by the context's synchronization.
          FC_REQ(launch(f, s, flag, b.ptr + b.size + (64 << 20), 6) == CUDA_SUCCESS);
          FC_REQ(cuCtxSynchronize() == CUDA_ERROR_ILLEGAL_ADDRESS);
          return 0;
        }) == 0);
}

TEST_CASE("fakecuda: copies and memsets wait for a pending kernel of their stream") {
  CHECK(run_with_kernel([](CUcontext ctx, CUfunction f, const VmmBuffer& b, CUstream s,
                           CUstream other) {
          CUdeviceptr flag = b.ptr, peer = b.ptr + 8, data = b.ptr + 4096;
          static const uint64_t v77 = 77;

          // An async copy on the kernel's stream lands after the kernel's store.
          FC_REQ(launch(f, s, flag, peer, 1) == CUDA_SUCCESS);
          FC_REQ(within(2000, [&] { return *word(flag) == 1; }));
          FC_REQ(blocks_until(ctx, [&] { return cuMemcpyHtoDAsync(flag, &v77, 8, s); },
                              [&] { *word(peer) = 1; }, CUDA_SUCCESS) == 0);
          FC_REQ(*word(flag) == 77);
          // A memset on the kernel's stream.
          FC_REQ(launch(f, s, flag, peer, 2) == CUDA_SUCCESS);
          FC_REQ(blocks_until(ctx, [&] { return cuMemsetD32Async(data, 5, 16, s); },
                              [&] { *word(peer) = 2; }, CUDA_SUCCESS) == 0);
          // The synchronous forms run on the legacy stream: ordered after a
          // blocking stream's kernel.
          FC_REQ(launch(f, s, flag, peer, 3) == CUDA_SUCCESS);
          uint64_t out = 0;
          FC_REQ(blocks_until(ctx, [&] { return cuMemcpyDtoH(&out, flag, 8); },
                              [&] { *word(peer) = 3; }, CUDA_SUCCESS) == 0);
          FC_REQ(out == 3);
          // Another stream's copy does not wait (non-blocking stream).
          FC_REQ(launch(f, s, flag, peer, 4) == CUDA_SUCCESS);
          FC_REQ(cuMemsetD32Async(data, 6, 16, other) == CUDA_SUCCESS);
          FC_REQ(cuStreamQuery(s) == CUDA_ERROR_NOT_READY);
          *word(peer) = 4;
          FC_REQ(cuStreamSynchronize(s) == CUDA_SUCCESS);
          return 0;
        }) == 0);
}
