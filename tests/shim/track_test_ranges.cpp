// shim_track_test scenario on the ranges of copies and memsets at a served
// block's end: the shim serves cuMemAlloc from a mapping of whole granules,
// and the driver refuses a copy or memset that starts past the bytes asked
// or crosses their end (measured on an H100: tests/gpu/probes/alloc_sizes.cpp
// tail); the simulated driver sees only the mapping and accepts them, so
// what is refused here the shim refused. Helpers: track_test.h.
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <thread>

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

/// Calls each of the entries `names` (the shim's, found as the application
/// finds them) with the arguments a; false, saying which, when one answers
/// other than `want`.
template <class Fn, class... A>
bool each(std::initializer_list<const char*> names, CUresult want, A... a) {
  bool ok = true;
  for (const char* name : names) {
    auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
    const CUresult r = fn ? fn(a...) : CUDA_ERROR_NOT_FOUND;
    if (r != want) {
      fprintf(stderr, "%s: %d, not %d\n", name, static_cast<int>(r), static_cast<int>(want));
      ok = false;
    }
  }
  return ok;
}

/// Every copy and memset entry the shim checks (src/shim/track_hooks.h), each
/// flavour by its own name: across the end of the block that ends at `end`
/// refused, up to it the driver's answer (done); e is another block.
int every_entry(CUdeviceptr end, CUdeviceptr e, CUcontext ctx, CUstream st, uint8_t* host) {
  const CUresult bad = CUDA_ERROR_INVALID_VALUE;
  const CUresult ok = CUDA_SUCCESS;
  const auto to_dev = {"cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds"};
  const auto to_dev_async = {"cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync_v2_ptsz"};
  REQ(each<decltype(&cuMemcpyHtoD_v2)>(to_dev, bad, end - 8, host, size_t{16}));
  REQ(each<decltype(&cuMemcpyHtoD_v2)>(to_dev, ok, end - 16, host, size_t{16}));
  REQ(each<decltype(&cuMemcpyHtoDAsync_v2)>(to_dev_async, bad, end - 8, host, size_t{16}, st));
  REQ(each<decltype(&cuMemcpyHtoDAsync_v2)>(to_dev_async, ok, end - 16, host, size_t{16}, st));
  const auto from_dev = {"cuMemcpyDtoH_v2", "cuMemcpyDtoH_v2_ptds"};
  const auto from_dev_async = {"cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync_v2_ptsz"};
  REQ(each<decltype(&cuMemcpyDtoH_v2)>(from_dev, bad, host, end - 8, size_t{16}));
  REQ(each<decltype(&cuMemcpyDtoH_v2)>(from_dev, ok, host, end - 16, size_t{16}));
  REQ(each<decltype(&cuMemcpyDtoHAsync_v2)>(from_dev_async, bad, host, end - 8, size_t{16}, st));
  REQ(each<decltype(&cuMemcpyDtoHAsync_v2)>(from_dev_async, ok, host, end - 16, size_t{16}, st));
  const auto dev_dev = {"cuMemcpy", "cuMemcpy_ptds", "cuMemcpyDtoD_v2", "cuMemcpyDtoD_v2_ptds"};
  const auto dev_dev_async = {"cuMemcpyAsync", "cuMemcpyAsync_ptsz", "cuMemcpyDtoDAsync_v2",
                              "cuMemcpyDtoDAsync_v2_ptsz"};
  REQ(each<decltype(&cuMemcpy)>(dev_dev, bad, e, end - 8, size_t{16}));  // the source crosses
  REQ(each<decltype(&cuMemcpy)>(dev_dev, bad, end - 8, e, size_t{16}));  // the destination
  REQ(each<decltype(&cuMemcpy)>(dev_dev, ok, end - 16, e, size_t{16}));
  REQ(each<decltype(&cuMemcpyAsync)>(dev_dev_async, bad, e, end - 8, size_t{16}, st));
  REQ(each<decltype(&cuMemcpyAsync)>(dev_dev_async, bad, end - 8, e, size_t{16}, st));
  REQ(each<decltype(&cuMemcpyAsync)>(dev_dev_async, ok, e, end - 16, size_t{16}, st));
  const auto peer = {"cuMemcpyPeer", "cuMemcpyPeer_ptds"};
  const auto peer_async = {"cuMemcpyPeerAsync", "cuMemcpyPeerAsync_ptsz"};
  REQ(each<decltype(&cuMemcpyPeer)>(peer, bad, end - 8, ctx, e, ctx, size_t{16}));
  REQ(each<decltype(&cuMemcpyPeer)>(peer, bad, e, ctx, end - 8, ctx, size_t{16}));
  REQ(each<decltype(&cuMemcpyPeer)>(peer, ok, e, ctx, end - 16, ctx, size_t{16}));
  REQ(each<decltype(&cuMemcpyPeerAsync)>(peer_async, bad, end - 8, ctx, e, ctx, size_t{16}, st));
  REQ(each<decltype(&cuMemcpyPeerAsync)>(peer_async, ok, end - 16, ctx, e, ctx, size_t{16}, st));
  // Arrays: the simulated driver has none; the shim refuses before it asks.
  REQ(each<decltype(&cuMemcpyAtoD_v2)>({"cuMemcpyAtoD_v2", "cuMemcpyAtoD_v2_ptds"}, bad, end - 8,
                                       CUarray{}, size_t{0}, size_t{16}));
  REQ(each<decltype(&cuMemcpyDtoA_v2)>({"cuMemcpyDtoA_v2", "cuMemcpyDtoA_v2_ptds"}, bad, CUarray{},
                                       size_t{0}, end - 8, size_t{16}));
  // Memsets of 8, 16 and 32 bits: 16, 10 and 12 bytes from 8 before the end.
  const unsigned char v8 = 0x22;
  const unsigned short v16 = 0x2222;
  const unsigned v32 = 0x22222222u;
  REQ(each<decltype(&cuMemsetD8_v2)>({"cuMemsetD8_v2", "cuMemsetD8_v2_ptds"}, bad, end - 8, v8,
                                     size_t{16}));
  REQ(each<decltype(&cuMemsetD8Async)>({"cuMemsetD8Async", "cuMemsetD8Async_ptsz"}, bad, end - 8,
                                       v8, size_t{16}, st));
  REQ(each<decltype(&cuMemsetD16_v2)>({"cuMemsetD16_v2", "cuMemsetD16_v2_ptds"}, bad, end - 8, v16,
                                      size_t{5}));
  REQ(each<decltype(&cuMemsetD16Async)>({"cuMemsetD16Async", "cuMemsetD16Async_ptsz"}, bad, end - 8,
                                        v16, size_t{5}, st));
  REQ(each<decltype(&cuMemsetD32_v2)>({"cuMemsetD32_v2", "cuMemsetD32_v2_ptds"}, bad, end - 8, v32,
                                      size_t{3}));
  REQ(each<decltype(&cuMemsetD32Async)>({"cuMemsetD32Async", "cuMemsetD32Async_ptsz"}, bad, end - 8,
                                        v32, size_t{3}, st));
  REQ(each<decltype(&cuMemsetD16_v2)>({"cuMemsetD16_v2", "cuMemsetD16_v2_ptds"}, ok, end - 8, v16,
                                      size_t{4}));
  REQ(each<decltype(&cuMemsetD32Async)>({"cuMemsetD32Async", "cuMemsetD32Async_ptsz"}, ok, end - 8,
                                        v32, size_t{2}, st));
  // 2D: two rows of 16 bytes, 64 apart, the second crossing the end (from
  // 72 before it) or ending there (from 80 before it).
  const auto d2d8 = {"cuMemsetD2D8_v2", "cuMemsetD2D8_v2_ptds"};
  const auto d2d8_async = {"cuMemsetD2D8Async", "cuMemsetD2D8Async_ptsz"};
  const auto d2d16 = {"cuMemsetD2D16_v2", "cuMemsetD2D16_v2_ptds"};
  const auto d2d16_async = {"cuMemsetD2D16Async", "cuMemsetD2D16Async_ptsz"};
  const auto d2d32 = {"cuMemsetD2D32_v2", "cuMemsetD2D32_v2_ptds"};
  const auto d2d32_async = {"cuMemsetD2D32Async", "cuMemsetD2D32Async_ptsz"};
  const size_t pitch = 64, two = 2;
  REQ(each<decltype(&cuMemsetD2D8_v2)>(d2d8, bad, end - 72, pitch, v8, size_t{16}, two));
  REQ(each<decltype(&cuMemsetD2D8_v2)>(d2d8, ok, end - 80, pitch, v8, size_t{16}, two));
  REQ(each<decltype(&cuMemsetD2D8Async)>(d2d8_async, bad, end - 72, pitch, v8, size_t{16}, two,
                                         st));
  REQ(each<decltype(&cuMemsetD2D8Async)>(d2d8_async, ok, end - 80, pitch, v8, size_t{16}, two, st));
  REQ(each<decltype(&cuMemsetD2D16_v2)>(d2d16, bad, end - 72, pitch, v16, size_t{8}, two));
  REQ(each<decltype(&cuMemsetD2D16_v2)>(d2d16, ok, end - 80, pitch, v16, size_t{8}, two));
  REQ(each<decltype(&cuMemsetD2D16Async)>(d2d16_async, bad, end - 72, pitch, v16, size_t{8}, two,
                                          st));
  REQ(each<decltype(&cuMemsetD2D16Async)>(d2d16_async, ok, end - 80, pitch, v16, size_t{8}, two,
                                          st));
  REQ(each<decltype(&cuMemsetD2D32_v2)>(d2d32, bad, end - 72, pitch, v32, size_t{4}, two));
  REQ(each<decltype(&cuMemsetD2D32_v2)>(d2d32, ok, end - 80, pitch, v32, size_t{4}, two));
  REQ(each<decltype(&cuMemsetD2D32Async)>(d2d32_async, bad, end - 72, pitch, v32, size_t{4}, two,
                                          st));
  REQ(each<decltype(&cuMemsetD2D32Async)>(d2d32_async, ok, end - 80, pitch, v32, size_t{4}, two,
                                          st));
  REQ_OK(cuStreamSynchronize(st));
  REQ_OK(cuCtxSynchronize());
  return 0;
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
  // Each entry, each flavour: what is accepted writes 0x22, up to the end.
  REQ(every_entry(end, e, ctx, stream, host) == 0);
  REQ(holds(d, kAsked - 8, kAsked, 0x22) && holds(d, kAsked, mapped, 0x11));

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

/// The check's table of tailed blocks while it changes and across forks:
/// two threads memset across a tailed block's end (refused) and up to it
/// (done) while a third allocates and frees blocks with and without tails,
/// checking each, and the main thread forks children that do the same with
/// a block of their own (the table's lock, read-held by a copying thread the
/// child lacks, must be free in the child). Under AddressSanitizer (preloaded
/// with an instrumented shim) the threads are parked at each fork: its
/// allocator's lock is not renewed in a fork child (GCC 12), and a child
/// forked while another thread allocates can wait on it for ever; there the
/// forks check a child of a process whose table is in use, not one forked
/// mid-read, which the run without it checks.
int block_end_threads() {
  const bool park_at_fork = dlsym(RTLD_DEFAULT, "__asan_init") != nullptr;
  CUcontext ctx = nullptr;
  REQ_OK(init_primary(&ctx));
  CUdeviceptr d = 0;
  REQ_OK(cuMemAlloc(&d, kAsked));
  fill(d, 4u << 20, 0x11);
  const CUdeviceptr end = d + kAsked;
  const CUresult bad = CUDA_ERROR_INVALID_VALUE;
  std::atomic<bool> stop{false}, hold{false};
  std::atomic<int> wrong{0}, parked{0}, live{3};
  std::atomic<long> checks{0}, churned{0};
  auto park = [&] {  // between two calls, while the main thread forks
    if (!hold.load()) return;
    ++parked;
    while (hold.load()) std::this_thread::yield();
    --parked;
  };
  auto checker = [&] {
    if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) ++wrong;
    while (!stop.load()) {
      park();
      if (cuMemsetD8(end - 8, 0x44, 16) != bad) ++wrong;
      if (cuMemsetD8(end - 8, 0x44, 8) != CUDA_SUCCESS) ++wrong;
      ++checks;
    }
    --live;
  };
  auto churn = [&] {
    if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) ++wrong;
    for (size_t i = 0; !stop.load(); ++i) {
      park();
      const bool tailed = i % 3 != 0;
      const size_t asked = tailed ? (1u << 20) + 4096 * (i % 200) + 1 : 2u << 20;
      CUdeviceptr b = 0;
      if (cuMemAlloc(&b, asked) != CUDA_SUCCESS) {
        ++wrong;
        break;
      }
      if (tailed) fill(b + asked, 16, 0x11);
      if (cuMemsetD8(b + asked - 8, 0x55, 8) != CUDA_SUCCESS) ++wrong;
      if (tailed &&
          (cuMemsetD8(b + asked - 8, 0x55, 16) != bad || !holds(b, asked, asked + 16, 0x11)))
        ++wrong;
      if (cuMemFree(b) != CUDA_SUCCESS) ++wrong;
      ++churned;
    }
    --live;
  };
  std::thread threads[] = {std::thread(checker), std::thread(checker), std::thread(churn)};
  int children_failed = 0;
  for (int k = 0; k < 100; ++k) {  // a fork while a reader holds the lock, most runs
    if (park_at_fork) {
      hold = true;
      while (parked.load() < live.load()) std::this_thread::yield();
    }
    Child c = spawn([](int) {
      CUcontext own = nullptr;
      FC_REQ(init_primary(&own) == CUDA_SUCCESS);
      // The parent's table (a tailed block held) went with the fork.
      proto::ShimRecords rr;
      FC_REQ(inspect(getpid(), &rr) && rr.tailed_blocks == 0);
      CUdeviceptr b = 0;
      FC_REQ(cuMemAlloc(&b, kAsked) == CUDA_SUCCESS);
      FC_REQ(inspect(getpid(), &rr) && rr.tailed_blocks == 1);
      FC_REQ(cuMemsetD8(b + kAsked - 8, 0x66, 16) == CUDA_ERROR_INVALID_VALUE);
      FC_REQ(cuMemsetD8(b + kAsked - 8, 0x66, 8) == CUDA_SUCCESS);
      FC_REQ(cuMemFree(b) == CUDA_SUCCESS);
      return 0;
    });
    hold = false;
    if (c.join() != 0) ++children_failed;
    // A block with a tail made and freed while the checkers read without
    // pause: the table's writer gets in (a lock that prefers readers may
    // keep it waiting for ever).
    CUdeviceptr b = 0;
    REQ_OK(cuMemAlloc(&b, kAsked));
    REQ_OK(cuMemFree(b));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  stop = true;
  for (auto& t : threads) t.join();
  fprintf(stderr, "block_end_threads: %ld checks, %ld blocks churned, %d wrong%s\n", checks.load(),
          churned.load(), wrong.load(),
          park_at_fork ? " (threads parked at each fork: AddressSanitizer)" : "");
  REQ(children_failed == 0);
  REQ(wrong.load() == 0 && checks.load() > 0 && churned.load() > 0);
  REQ(holds(d, kAsked - 8, kAsked, 0x44) && holds(d, kAsked, 4u << 20, 0x11));
  REQ_OK(cuMemFree(d));
  return 0;
}

/// A block another process exported, opened from its IPC handle, is the bytes
/// the exporter asked, as on the driver (measured on an H100:
/// tests/gpu/probes/alloc_sizes.cpp ipc_tail), though the shim maps the
/// exporter's whole granules: the range and RANGE_SIZE say so, one past is
/// unknown, every copy and memset entry refuses what crosses the end. An
/// open of a whole-granule block has no tail; the handle of a shim that
/// carried no size asked opens whole; a size asked past the mapping is
/// refused; cuMemUnmap of the open is refused, SYNC_MEMOPS taken (the
/// context's flag). Once the open is closed, or
/// its context destroyed, its tail is forgotten (the records' count).
int ipc_block_end() {
  REQ_OK(init_primary());
  CUdeviceptr d = 0, w = 0;
  REQ_OK(cuMemAlloc(&d, kAsked));
  REQ_OK(cuMemAlloc(&w, 2u << 20));
  fill(d, 4u << 20, 0x11);
  CUipcMemHandle hd, hw;
  REQ_OK(cuIpcGetMemHandle(&hd, d));
  REQ_OK(cuIpcGetMemHandle(&hw, w));
  proto::IpcHandleBlob b;
  memcpy(&b, &hd, sizeof b);
  REQ(b.size == 4u << 20 && b.asked == kAsked);
  Child c = spawn([&](int) {
    CUcontext ctx = nullptr;
    FC_REQ(init_primary(&ctx) == CUDA_SUCCESS);
    CUstream st = nullptr;
    FC_REQ(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CUdeviceptr p = 0, e = 0, base = 1;
    size_t size = 1, attr = 0;
    FC_REQ(cuIpcOpenMemHandle(&p, hd, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
    FC_REQ(cuMemAlloc(&e, 2u << 20) == CUDA_SUCCESS);
    proto::ShimRecords rr;
    FC_REQ(inspect(getpid(), &rr));
    FC_REQ(rr.tailed_blocks == 1);  // the open's: e is whole granules
    FC_REQ(cuMemGetAddressRange(&base, &size, p + kAsked - 1) == CUDA_SUCCESS);
    FC_REQ(base == p && size == kAsked);
    FC_REQ(cuMemGetAddressRange(&base, &size, p + kAsked) == CUDA_ERROR_NOT_FOUND);
    FC_REQ(base == 0 && size == 0);
    FC_REQ(cuPointerGetAttribute(&attr, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p) == CUDA_SUCCESS);
    FC_REQ(attr == kAsked);
    FC_REQ(cuPointerGetAttribute(&attr, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + kAsked) ==
           CUDA_ERROR_INVALID_VALUE);
    // Its context is the one it was opened in (the mapping has none).
    CUcontext in = nullptr;
    FC_REQ(cuPointerGetAttribute(&in, CU_POINTER_ATTRIBUTE_CONTEXT, p + 8) == CUDA_SUCCESS);
    FC_REQ(in == ctx);
    // Neither legacy-IPC capable nor shareable, as on the driver (a served
    // block is the first).
    int legacy = 1;
    FC_REQ(cuPointerGetAttribute(&legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p) ==
           CUDA_SUCCESS);
    FC_REQ(legacy == 0);
    unsigned long long types = 1;  // a bitmask: as wide as the driver may write
    FC_REQ(cuPointerGetAttribute(&types, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, p) ==
           CUDA_SUCCESS);
    FC_REQ(types == 0);
    {
      CUpointer_attribute which[3] = {CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                      CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                      CU_POINTER_ATTRIBUTE_CONTEXT};
      size_t range_size = 1;
      int ordinal = 0;
      in = nullptr;
      void* data[3] = {&range_size, &ordinal, &in};
      FC_REQ(cuPointerGetAttributes(3, which, data, p + 8) == CUDA_SUCCESS);
      FC_REQ(range_size == kAsked && ordinal == 0 && in == ctx);
      FC_REQ(cuPointerGetAttributes(3, which, data, p + kAsked) == CUDA_SUCCESS);
      // As for an address the driver does not know.
      FC_REQ(range_size == 0 && ordinal == -2 && in == nullptr);
    }
    // Not a VMM mapping to the application: cuIpcCloseMemHandle takes it;
    // no access flags to get or set, as on the driver (ipc_attrs).
    FC_REQ(cuMemUnmap(p, 4u << 20) == CUDA_ERROR_INVALID_VALUE);
    {
      CUmemLocation loc{};
      loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
      loc.id = 0;
      unsigned long long access = 7;
      FC_REQ(cuMemGetAccess(&access, &loc, p + 8) == CUDA_SUCCESS && access == 0);
      CUmemAccessDesc acc{};
      acc.location = loc;
      acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      FC_REQ(cuMemSetAccess(p, 4u << 20, &acc, 1) == CUDA_ERROR_INVALID_VALUE);
    }
    // SYNC_MEMOPS is taken, as on the driver: the open's context's flag.
    unsigned flags = 0;
    const unsigned one = 1;
    FC_REQ(cuCtxGetFlags(&flags) == CUDA_SUCCESS && !(flags & CU_CTX_SYNC_MEMOPS));
    FC_REQ(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p + 8) == CUDA_SUCCESS);
    FC_REQ(cuCtxGetFlags(&flags) == CUDA_SUCCESS && (flags & CU_CTX_SYNC_MEMOPS));
    unsigned sync = 0;  // the open's attribute reads what was set
    FC_REQ(cuPointerGetAttribute(&sync, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p) == CUDA_SUCCESS);
    FC_REQ(sync == 1);
    FC_REQ(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p + kAsked) ==
           CUDA_ERROR_INVALID_VALUE);
    uint8_t host[64];
    memset(host, 0x22, sizeof host);
    FC_REQ(every_entry(p + kAsked, e, ctx, st, host) == 0);
    FC_REQ(cuStreamSynchronize(st) == CUDA_SUCCESS && cuCtxSynchronize() == CUDA_SUCCESS);
    FC_REQ(holds(p, kAsked - 8, kAsked, 0x22) && holds(p, kAsked, 4u << 20, 0x11));
    FC_REQ(holds(p, 0, kAsked - 80, 0x11));

    // A whole-granule block: its end is the mapping's, the driver's to answer.
    CUdeviceptr q = 0;
    FC_REQ(cuIpcOpenMemHandle(&q, hw, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
    FC_REQ(cuMemGetAddressRange(&base, &size, q) == CUDA_SUCCESS && size == 2u << 20);
    FC_REQ(cuMemsetD8(q + (2u << 20) - 16, 0x66, 16) == CUDA_SUCCESS);
    FC_REQ(cuIpcCloseMemHandle(q) == CUDA_SUCCESS);

    // Closed, the open's tail goes with it.
    FC_REQ(cuIpcCloseMemHandle(p) == CUDA_SUCCESS);
    FC_REQ(inspect(getpid(), &rr));
    FC_REQ(rr.tailed_blocks == 0 && rr.ipc.empty());
    // A handle with no size asked (a shim before it carried one) opens
    // whole; one asking past the mapping is refused.
    proto::IpcHandleBlob old;
    memcpy(&old, &hd, sizeof old);
    old.asked = 0;
    CUipcMemHandle h;
    memcpy(&h, &old, sizeof h);
    FC_REQ(cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
    FC_REQ(cuMemGetAddressRange(&base, &size, p) == CUDA_SUCCESS && size == 4u << 20);
    FC_REQ(inspect(getpid(), &rr));
    FC_REQ(rr.tailed_blocks == 0);
    FC_REQ(cuMemsetD8(p + kAsked, 0x33, 16) == CUDA_SUCCESS);
    FC_REQ(cuCtxSynchronize() == CUDA_SUCCESS);
    FC_REQ(cuIpcCloseMemHandle(p) == CUDA_SUCCESS);
    old.asked = old.size + 1;
    memcpy(&h, &old, sizeof h);
    FC_REQ(cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) ==
           CUDA_ERROR_INVALID_VALUE);

    // Opened in a context that is then destroyed: the tail goes with it.
    CUdevice dev = 0;
    CUcontext own = nullptr;
    FC_REQ(cuCtxGetDevice(&dev) == CUDA_SUCCESS);
    FC_REQ(cuCtxCreate(&own, nullptr, 0, dev) == CUDA_SUCCESS);
    FC_REQ(cuIpcOpenMemHandle(&p, hd, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
    FC_REQ(cuPointerGetAttribute(&in, CU_POINTER_ATTRIBUTE_CONTEXT, p) == CUDA_SUCCESS);
    FC_REQ(in == own);
    FC_REQ(cuMemsetD8(p + kAsked - 8, 0x44, 16) == CUDA_ERROR_INVALID_VALUE);
    FC_REQ(inspect(getpid(), &rr));
    FC_REQ(rr.tailed_blocks == 1);
    FC_REQ(cuCtxDestroy(own) == CUDA_SUCCESS);
    FC_REQ(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    FC_REQ(inspect(getpid(), &rr));
    FC_REQ(rr.tailed_blocks == 0 && rr.ipc.empty());
    FC_REQ(cuMemFree(e) == CUDA_SUCCESS);
    FC_REQ(cuStreamDestroy(st) == CUDA_SUCCESS);
    return 0;
  });
  REQ(c.join() == 0);
  REQ(holds(d, kAsked - 8, kAsked, 0x22) && holds(d, kAsked, kAsked + 16, 0x33));
  REQ_OK(cuMemFree(d));
  REQ_OK(cuMemFree(w));
  return 0;
}

}  // namespace track_test
