// shim_track_test scenario on the ranges of copies and memsets at a served
// block's end: the shim serves cuMemAlloc from a mapping of whole granules,
// and the driver refuses a copy or memset that starts past the bytes asked
// or crosses their end (measured on an H100: tests/gpu/probes/alloc_sizes.cpp
// tail); the simulated driver sees only the mapping and accepts them, so
// what is refused here the shim refused. Helpers: track_test.h.
#include <cstdint>
#include <cstring>

#include "tests/shim/track_test.h"

namespace track_test {

namespace {

constexpr size_t kAsked = (3u << 20) + 100;  // a tail of almost a granule

/// Whether the bytes [from, to) of the block at d all hold v.
bool holds(CUdeviceptr d, size_t from, size_t to, uint8_t v) {
  auto* b = reinterpret_cast<const uint8_t*>(d);
  for (size_t i = from; i < to; ++i)
    if (b[i] != v) return false;
  return true;
}

}  // namespace

int block_end() {
  CUcontext ctx = nullptr;
  REQ_OK(init_primary(&ctx));
  CUstream stream = nullptr;
  REQ_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CUdeviceptr d = 0, e = 0;
  REQ_OK(cuMemAlloc(&d, kAsked));
  REQ_OK(cuMemAlloc(&e, kAsked));
  proto::ShimRecords r;
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.size() == 2 && r.allocations[0].legacy);
  const size_t mapped = r.allocations[0].size;
  REQ(mapped == 4u << 20);  // served: the mapping is whole granules
  fill(d, mapped, 0x11);
  uint8_t host[64];
  memset(host, 0x22, sizeof host);
  const CUdeviceptr end = d + kAsked;
  const CUresult bad = CUDA_ERROR_INVALID_VALUE;

  // Up to the last byte asked: the driver's answer (done).
  REQ_OK(cuMemcpyHtoD(end - 16, host, 16));
  REQ_OK(cuMemsetD8(end - 8, 0x33, 8));
  REQ_OK(cuMemsetD32(end - 8, 0x33333333u, 2));
  REQ_OK(cuMemcpyDtoH(host, end - 16, 16));
  REQ_OK(cuMemcpyDtoD(e, end - 32, 32));
  REQ_OK(cuMemcpy(e + 64, end - 32, 32));
  REQ_OK(cuCtxSynchronize());
  REQ(holds(d, kAsked - 8, kAsked, 0x33));
  fill(d, mapped, 0x11);
  memset(host, 0x22, sizeof host);

  // Starting at the end, or crossing it: refused, nothing written.
  REQ(cuMemcpyHtoD(end, host, 16) == bad);
  REQ(cuMemcpyHtoD(end - 8, host, 16) == bad);
  REQ(cuMemcpyHtoDAsync(end - 8, host, 16, stream) == bad);
  REQ(cuMemcpyDtoH(host, end - 8, 16) == bad);
  REQ(cuMemcpyDtoHAsync(host, end + 4096, 16, stream) == bad);
  REQ(cuMemcpyDtoD(e, end - 8, 16) == bad);  // the source crosses
  REQ(cuMemcpyDtoD(end - 8, e, 16) == bad);  // the destination crosses
  REQ(cuMemcpyDtoDAsync(end, e, 16, stream) == bad);
  REQ(cuMemcpy(end - 8, e, 16) == bad);
  REQ(cuMemcpyAsync(e, end, 16, stream) == bad);
  REQ(cuMemcpyPeer(end - 8, ctx, e, ctx, 16) == bad);
  REQ(cuMemcpyPeerAsync(e, ctx, end - 8, ctx, 16, stream) == bad);
  REQ(cuMemsetD8(end, 0x44, 16) == bad);
  REQ(cuMemsetD8(end - 8, 0x44, 16) == bad);
  REQ(cuMemsetD8Async(end - 8, 0x44, 16, stream) == bad);
  REQ(cuMemsetD16(end - 8, 0x4444, 5) == bad);       // 10 bytes
  REQ(cuMemsetD32(end - 8, 0x44444444u, 3) == bad);  // 12 bytes
  REQ(cuMemsetD32Async(end - 8, 0x44444444u, 3, stream) == bad);
  // Two rows of 16 bytes, 64 apart: the second row crosses.
  REQ(cuMemsetD2D8(end - 72, 64, 0x44, 16, 2) == bad);
  REQ(cuMemsetD2D32Async(end - 72, 64, 0x44444444u, 4, 2, stream) == bad);
  REQ_OK(cuMemsetD2D8(end - 80, 64, 0x55, 16, 2));  // the second row ends at the end
  // The per-thread default stream's entries (what cuGetProcAddress gives a
  // program built for them) are checked too.
  void* fn = nullptr;
  CUdriverProcAddressQueryResult found{};
  REQ_OK(cuGetProcAddress("cuMemcpyHtoD", &fn, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                          &found));
  REQ(fn && found == CU_GET_PROC_ADDRESS_SUCCESS);
  REQ(reinterpret_cast<decltype(&cuMemcpyHtoD_v2)>(fn)(end - 8, host, 16) == bad);
  REQ_OK(reinterpret_cast<decltype(&cuMemcpyHtoD_v2)>(fn)(end - 16, host, 16));
  REQ_OK(cuStreamSynchronize(stream));
  REQ_OK(cuCtxSynchronize());
  REQ(holds(d, kAsked - 80, kAsked - 64, 0x55) && holds(d, kAsked - 16, kAsked, 0x22));
  REQ(holds(d, kAsked - 64, kAsked - 16, 0x11) && holds(d, kAsked, mapped, 0x11));

  // A block of whole granules has no tail: its copies go to the driver as
  // they came (its end is the mapping's, where the driver refuses them).
  CUdeviceptr whole = 0;
  REQ_OK(cuMemAlloc(&whole, 2u << 20));
  REQ_OK(cuMemsetD8(whole + (2u << 20) - 16, 0x66, 16));
  REQ_OK(cuMemFree(whole));
  // Once the blocks with a tail are freed, the next block at their address
  // answers by its own bytes.
  REQ_OK(cuMemFree(d));
  REQ_OK(cuMemFree(e));
  REQ_OK(cuMemAlloc(&d, 4u << 20));
  REQ_OK(cuMemsetD8(d + (4u << 20) - 16, 0x77, 16));
  REQ_OK(cuMemFree(d));
  REQ_OK(cuStreamDestroy(stream));
  return 0;
}

}  // namespace track_test
