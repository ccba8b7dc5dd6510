// Simulated driver: cuMemAlloc memory, host memory, memcpy and memset.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fakecuda_test_util.h"

using namespace fctest;

// Per-thread default stream names (cuda.h declares them only under
// CUDA_API_PER_THREAD_DEFAULT_STREAM).
extern "C" CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void* srcHost,
                                         size_t ByteCount);
extern "C" CUresult cuMemcpyDtoHAsync_v2_ptsz(void* dstHost, CUdeviceptr srcDevice,
                                              size_t ByteCount, CUstream hStream);
extern "C" CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N);

namespace {

/// The /proc/self/maps line of the mapping containing p.
std::string maps_line(uintptr_t p) {
  std::ifstream in("/proc/self/maps");
  std::string line;
  while (std::getline(in, line)) {
    unsigned long lo = 0, hi = 0;
    if (sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2 && p >= lo && p < hi) return line;
  }
  return "";
}

}  // namespace

TEST_CASE("fakecuda: cuMemAlloc memory is host-readable and named by creator and id") {
  REQUIRE(init_primary() == CUDA_SUCCESS);
  // Free memory is the machine's (other processes' simulated memory counts):
  // measured around an allocation and its free until no other process
  // changed it meanwhile.
  size_t free0 = 0, free1 = 0, total = 0;
  CUdeviceptr p = 0;
  for (int tries = 0; tries < 20; ++tries) {
    size_t again = 0;
    REQUIRE(cuMemGetInfo(&free0, &total) == CUDA_SUCCESS);
    REQUIRE(cuMemAlloc(&p, 3 << 20) == CUDA_SUCCESS);
    REQUIRE(cuMemGetInfo(&free1, &total) == CUDA_SUCCESS);
    REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
    REQUIRE(cuMemGetInfo(&again, &total) == CUDA_SUCCESS);
    if (again == free0) break;
    usleep(50000);
  }
  CHECK(free0 - free1 == (4u << 20));  // rounded up to the 2 MiB granularity
  REQUIRE(cuMemAlloc(&p, 3 << 20) == CUDA_SUCCESS);
  CHECK(p % (2 << 20) == 0);
  std::string line = maps_line(p);
  CHECK(line.find("/memfd:fakecuda:" + std::to_string(getpid()) + ":") != std::string::npos);
  std::vector<unsigned char> h(3 << 20);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<unsigned char>(i * 7);
  REQUIRE(cuMemcpyHtoD(p, h.data(), h.size()) == CUDA_SUCCESS);
  CHECK(memcmp(reinterpret_cast<void*>(p), h.data(), h.size()) == 0);
  CUdeviceptr base = 0;
  size_t size = 0;
  CHECK(cuMemGetAddressRange(&base, &size, p + 100) == CUDA_SUCCESS);
  CHECK(base == p);
  CHECK(size == (3u << 20));  // the bytes asked for, not the rounded mapping
  int ordinal = -1;
  CHECK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) == CUDA_SUCCESS);
  CHECK(ordinal == 0);
  CHECK(cuMemFree(p) == CUDA_SUCCESS);
  CHECK(cuMemFree(p) == CUDA_ERROR_INVALID_VALUE);
  CHECK(maps_line(p).find("memfd") == std::string::npos);
  CHECK(cuMemAlloc(&p, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemAlloc(nullptr, 16) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemAlloc(&p, size_t{1} << 60) == CUDA_ERROR_OUT_OF_MEMORY);
  // Every byte given back: the process itself holds none on the device.
  size_t free2 = 0;
  REQUIRE(cuMemGetInfo(&free2, &total) == CUDA_SUCCESS);
  CHECK(free2 <= total);
  const std::string own = "/memfd:fakecuda:" + std::to_string(getpid()) + ":";
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    CHECK(std::filesystem::read_symlink(e.path(), ec).string().rfind(own, 0) != 0);
  }
}

TEST_CASE("fakecuda: a cuMemAlloc block is as big as asked for, the rest unknown") {
  // As the real driver (measured on an H200, driver 580.159.04,
  // tests/gpu/probes/alloc_sizes.cpp): the base is 2 MiB aligned, the range
  // of the base and of the last byte is the base and the bytes asked for,
  // one past them is not found. In a child: no other block lies next to one.
  CHECK(run_child([] {
          FC_REQ(init_primary() == CUDA_SUCCESS);
          const size_t sizes[] = {
              1, 100, 512, 513, 4096, 65537, (1u << 20) + 1, 2u << 20, (2u << 20) + 1, 3u << 20};
          for (size_t n : sizes) {
            CUdeviceptr p = 0, base = 0;
            size_t size = 0, attr = 0;
            FC_REQ(cuMemAlloc(&p, n) == CUDA_SUCCESS);
            FC_REQ(p % (2u << 20) == 0);
            FC_REQ(cuMemGetAddressRange(&base, &size, p) == CUDA_SUCCESS);
            FC_REQ(base == p && size == n);
            base = 0;
            size = 0;
            FC_REQ(cuMemGetAddressRange(&base, &size, p + n - 1) == CUDA_SUCCESS);
            FC_REQ(base == p && size == n);
            FC_REQ(cuMemGetAddressRange(&base, &size, p + n) == CUDA_ERROR_NOT_FOUND);
            FC_REQ(cuPointerGetAttribute(&attr, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p) ==
                   CUDA_SUCCESS);
            FC_REQ(attr == n);
            FC_REQ(cuMemFree(p) == CUDA_SUCCESS);
          }
          return 0;
        }) == 0);
  // The same in this process, checked one by one: 1 byte and 2 MiB + 1.
  REQUIRE(init_primary() == CUDA_SUCCESS);
  for (size_t n : {size_t{1}, (size_t{2} << 20) + 1}) {
    CAPTURE(n);
    CUdeviceptr p = 0, base = 0;
    size_t size = 0, attr = 0;
    REQUIRE(cuMemAlloc(&p, n) == CUDA_SUCCESS);
    CHECK(cuMemGetAddressRange(&base, &size, p) == CUDA_SUCCESS);
    CHECK(base == p);
    CHECK(size == n);
    CHECK(cuMemGetAddressRange(&base, &size, p + n - 1) == CUDA_SUCCESS);
    CHECK(size == n);
    CHECK(cuMemGetAddressRange(&base, &size, p + n) == CUDA_ERROR_NOT_FOUND);
    CHECK((base == 0 && size == 0));  // written, as the driver writes them
    CHECK(cuPointerGetAttribute(&attr, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p) == CUDA_SUCCESS);
    CHECK(attr == n);
    CHECK(cuMemFree(p) == CUDA_SUCCESS);
  }
}

TEST_CASE("fakecuda: copies, memsets and IPC handles stop at a cuMemAlloc block's end") {
  // Measured on an H100, driver 580.159.04 (tests/gpu/probes/alloc_sizes.cpp
  // tail) past a 1 MiB block in its 2 MiB page: cuIpcGetMemHandle there,
  // copies and memsets that start there or cross the block's end all fail
  // INVALID_VALUE; the last byte's handle is the block's.
  REQUIRE(init_primary() == CUDA_SUCCESS);
  const size_t n = 1 << 20;
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, n) == CUDA_SUCCESS);
  unsigned char buf[32] = {};
  CUipcMemHandle h;
  CHECK(cuIpcGetMemHandle(&h, p + n - 1) == CUDA_SUCCESS);
  CHECK(cuIpcGetMemHandle(&h, p + n) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemcpyHtoD(p + n, buf, 16) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemcpyHtoD(p + n - 8, buf, 16) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemcpyDtoH(buf, p + n - 8, 16) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemcpyDtoD(p, p + n - 8, 16) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemsetD8(p + n, 0x5a, 16) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemsetD8(p + n - 8, 0x5a, 16) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemcpyHtoD(p + n - 16, buf, 16) == CUDA_SUCCESS);  // up to the end
  CHECK(cuMemsetD8(p + n - 16, 0x5a, 16) == CUDA_SUCCESS);
  CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
  CHECK(cuMemFree(p) == CUDA_SUCCESS);
}

TEST_CASE("fakecuda: past a cuMemAlloc block's bytes the pointer attributes are unknown") {
  // Measured on an H200, driver 580.159.04 (tests/gpu/probes/alloc_sizes.cpp)
  // one past the byte of cuMemAlloc(1): each attribute alone fails
  // INVALID_VALUE; all together succeed with 0 in each, the device ordinal
  // -2 (an int).
  REQUIRE(init_primary() == CUDA_SUCCESS);
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 1) == CUDA_SUCCESS);
  const CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_CONTEXT,
                                       CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                       CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
                                       CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                       CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                       CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                       CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                       CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                       CU_POINTER_ATTRIBUTE_MAPPED,
                                       CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                       CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
                                       CU_POINTER_ATTRIBUTE_ACCESS_FLAGS,
                                       CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE};
  constexpr unsigned kN = sizeof attrs / sizeof attrs[0];
  for (CUpointer_attribute a : attrs) {
    CAPTURE(a);
    unsigned long long v = 0;
    CHECK(cuPointerGetAttribute(&v, a, p + 1) == CUDA_ERROR_INVALID_VALUE);
  }
  unsigned long long all[kN] = {};  // zeroed, as the probe's
  void* data[kN];
  for (unsigned i = 0; i < kN; ++i) data[i] = &all[i];
  CUpointer_attribute which[kN];
  std::copy(attrs, attrs + kN, which);
  REQUIRE(cuPointerGetAttributes(kN, which, data, p + 1) == CUDA_SUCCESS);
  for (unsigned i = 0; i < kN; ++i) {
    CAPTURE(attrs[i]);
    CHECK(all[i] == (attrs[i] == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL ? 0xfffffffeull : 0));
  }
  // Written, not left as the caller set them: in their cuda.h widths.
  CUcontext ctx = reinterpret_cast<CUcontext>(1);
  unsigned type = 7;
  CUdeviceptr dptr = 7, start = 7;
  unsigned long long id = 7;
  int ordinal = 7;
  size_t range = 7;
  void* pool = &range;
  CUpointer_attribute typed[] = {
      CU_POINTER_ATTRIBUTE_CONTEXT,        CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
      CU_POINTER_ATTRIBUTE_DEVICE_POINTER, CU_POINTER_ATTRIBUTE_BUFFER_ID,
      CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
      CU_POINTER_ATTRIBUTE_RANGE_SIZE,     CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE};
  void* into[] = {&ctx, &type, &dptr, &id, &ordinal, &start, &range, &pool};
  REQUIRE(cuPointerGetAttributes(8, typed, into, p + 1) == CUDA_SUCCESS);
  CHECK(ctx == nullptr);
  CHECK(type == 0);
  CHECK(dptr == 0);
  CHECK(id == 0);
  CHECK(ordinal == -2);
  CHECK(start == 0);
  CHECK(range == 0);
  CHECK(pool == nullptr);
  // At the byte itself they answer for the block.
  ordinal = 7;
  range = 7;
  CUpointer_attribute two[] = {CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                               CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  void* two_into[] = {&ordinal, &range};
  REQUIRE(cuPointerGetAttributes(2, two, two_into, p) == CUDA_SUCCESS);
  CHECK(ordinal == 0);
  CHECK(range == 1);
  // cuPointerSetAttribute there: INVALID_VALUE, as for any unknown address.
  unsigned one = 1;
  CHECK(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p + 1) ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p) == CUDA_SUCCESS);
  CHECK(cuMemFree(p) == CUDA_SUCCESS);
  // A freed block's address is no more known than the tail was.
  ordinal = 7;
  REQUIRE(cuPointerGetAttributes(1, two, two_into, p) == CUDA_SUCCESS);
  CHECK(ordinal == -2);
}

TEST_CASE("fakecuda: memory calls need a context") {
  CHECK(run_child([] {
          FC_REQ(cuInit(0) == CUDA_SUCCESS);
          CUdeviceptr p;
          FC_REQ(cuMemAlloc(&p, 16) == CUDA_ERROR_INVALID_CONTEXT);
          size_t f, t;
          FC_REQ(cuMemGetInfo(&f, &t) == CUDA_ERROR_INVALID_CONTEXT);
          return 0;
        }) == 0);
}

TEST_CASE("fakecuda: a context's cuMemAlloc blocks go with it, its VMM memory stays") {
  CHECK(run_child([] {
          FC_REQ(cuInit(0) == CUDA_SUCCESS);
          CUdevice dev = 0;
          CUcontext own = nullptr, primary = nullptr;
          FC_REQ(cuCtxCreate(&own, nullptr, 0, dev) == CUDA_SUCCESS);
          CUdeviceptr a = 0, b = 0;
          FC_REQ(cuMemAlloc(&a, 16) == CUDA_SUCCESS);
          VmmBuffer v;
          FC_REQ(vmm_create(2 << 20, &v) == CUDA_SUCCESS);
          // The block names the context it was allocated in (cuda.h), the
          // VMM mapping none (measured on an H100: alloc_sizes.cpp ctx_attrs).
          CUcontext of = nullptr;
          FC_REQ(cuPointerGetAttribute(&of, CU_POINTER_ATTRIBUTE_CONTEXT, a) == CUDA_SUCCESS);
          FC_REQ(of == own);
          of = own;
          FC_REQ(cuPointerGetAttribute(&of, CU_POINTER_ATTRIBUTE_CONTEXT, v.ptr) == CUDA_SUCCESS);
          FC_REQ(of == nullptr);
          FC_REQ(cuCtxDestroy(own) == CUDA_SUCCESS);
          FC_REQ(maps_line(a).find("memfd") == std::string::npos);      // gone
          FC_REQ(maps_line(v.ptr).find("memfd") != std::string::npos);  // stays
          FC_REQ(cuDevicePrimaryCtxRetain(&primary, dev) == CUDA_SUCCESS);
          FC_REQ(cuDevicePrimaryCtxRetain(&primary, dev) == CUDA_SUCCESS);
          FC_REQ(cuCtxSetCurrent(primary) == CUDA_SUCCESS);
          FC_REQ(cuMemAlloc(&b, 16) == CUDA_SUCCESS);
          FC_REQ(cuDevicePrimaryCtxRelease(dev) == CUDA_SUCCESS);  // not the last
          FC_REQ(cuMemFree(b) == CUDA_SUCCESS);
          FC_REQ(cuMemAlloc(&b, 16) == CUDA_SUCCESS);
          FC_REQ(cuDevicePrimaryCtxRelease(dev) == CUDA_SUCCESS);  // the last
          FC_REQ(cuMemFree(b) == CUDA_ERROR_INVALID_VALUE);
          FC_REQ(cuDevicePrimaryCtxRetain(&primary, dev) == CUDA_SUCCESS);
          FC_REQ(cuMemAlloc(&b, 16) == CUDA_SUCCESS);
          FC_REQ(cuDevicePrimaryCtxReset(dev) == CUDA_SUCCESS);
          FC_REQ(cuMemFree(b) == CUDA_ERROR_INVALID_VALUE);
          FC_REQ(vmm_destroy(v) == CUDA_SUCCESS);
          return 0;
        }) == 0);
}

TEST_CASE("fakecuda: SYNC_MEMOPS is the block's attribute, whichever context is current") {
  // Measured on an H100, driver 580.159.04 (alloc_sizes.cpp ctx_attrs): set
  // on a block of context A with B current, the attribute reads 1 with A, B
  // or the primary context current (no context's flags change); a VMM
  // mapping reads 0. The block's context stays the one it was allocated in.
  CHECK(run_child([] {
          FC_REQ(cuInit(0) == CUDA_SUCCESS);
          CUcontext a = nullptr, b = nullptr, primary = nullptr;
          FC_REQ(cuDevicePrimaryCtxRetain(&primary, 0) == CUDA_SUCCESS);
          FC_REQ(cuCtxCreate(&a, nullptr, 0, 0) == CUDA_SUCCESS);
          CUdeviceptr p = 0;
          FC_REQ(cuMemAlloc(&p, 1 << 20) == CUDA_SUCCESS);
          VmmBuffer v;
          FC_REQ(vmm_create(2 << 20, &v) == CUDA_SUCCESS);
          FC_REQ(cuCtxCreate(&b, nullptr, 0, 0) == CUDA_SUCCESS);
          unsigned got = 7;
          FC_REQ(cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p) == CUDA_SUCCESS);
          FC_REQ(got == 0);
          const unsigned one = 1, zero = 0;
          FC_REQ(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p) == CUDA_SUCCESS);
          for (CUcontext c : {a, b, primary}) {
            FC_REQ(cuCtxSetCurrent(c) == CUDA_SUCCESS);
            got = 0;
            FC_REQ(cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p) ==
                   CUDA_SUCCESS);
            FC_REQ(got == 1);
            CUcontext of = nullptr;
            FC_REQ(cuPointerGetAttribute(&of, CU_POINTER_ATTRIBUTE_CONTEXT, p) == CUDA_SUCCESS);
            FC_REQ(of == a);
            got = 7;
            FC_REQ(cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, v.ptr) ==
                   CUDA_SUCCESS);
            FC_REQ(got == 0);
          }
          FC_REQ(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, v.ptr) ==
                 CUDA_ERROR_NOT_SUPPORTED);
          FC_REQ(cuPointerSetAttribute(&zero, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p) == CUDA_SUCCESS);
          got = 7;
          FC_REQ(cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p) == CUDA_SUCCESS);
          FC_REQ(got == 0);
          FC_REQ(cuMemFree(p) == CUDA_SUCCESS);
          FC_REQ(vmm_destroy(v) == CUDA_SUCCESS);
          FC_REQ(cuDevicePrimaryCtxRelease(0) == CUDA_SUCCESS);
          return 0;
        }) == 0);
}

TEST_CASE("fakecuda: memcpy families") {
  REQUIRE(init_primary() == CUDA_SUCCESS);
  const size_t n = 1 << 20;
  CUdeviceptr a, b;
  REQUIRE(cuMemAlloc(&a, n) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&b, n) == CUDA_SUCCESS);
  std::vector<unsigned char> h(n), back(n);
  for (size_t i = 0; i < n; ++i) h[i] = static_cast<unsigned char>(i ^ (i >> 8));
  CUstream s;
  REQUIRE(cuStreamCreate(&s, 0) == CUDA_SUCCESS);

  REQUIRE(cuMemcpyHtoDAsync(a, h.data(), n, s) == CUDA_SUCCESS);
  REQUIRE(cuMemcpyDtoD(b, a, n) == CUDA_SUCCESS);
  REQUIRE(cuMemcpyDtoH(back.data(), b, n) == CUDA_SUCCESS);
  CHECK(back == h);
  std::fill(back.begin(), back.end(), 0);
  REQUIRE(cuMemcpy(reinterpret_cast<CUdeviceptr>(back.data()), b, n) == CUDA_SUCCESS);
  CHECK(back == h);
  REQUIRE(cuMemcpyAsync(a + 1, reinterpret_cast<CUdeviceptr>(h.data()), 10, s) == CUDA_SUCCESS);
  CHECK(reinterpret_cast<unsigned char*>(a)[1] == h[0]);
  REQUIRE(cuMemcpyDtoDAsync(a, b, n, s) == CUDA_SUCCESS);
  REQUIRE(cuMemcpyDtoHAsync(back.data(), a, n, s) == CUDA_SUCCESS);
  CHECK(back == h);
  // Per-thread default stream names behave the same.
  REQUIRE(cuMemcpyHtoD_v2_ptds(a, h.data() + 1, 16) == CUDA_SUCCESS);
  CHECK(memcmp(reinterpret_cast<void*>(a), h.data() + 1, 16) == 0);
  REQUIRE(cuMemcpyDtoHAsync_v2_ptsz(back.data(), a, 16, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  CHECK(memcmp(back.data(), h.data() + 1, 16) == 0);

  // Out of bounds or unknown device addresses fail without touching memory.
  CHECK(cuMemcpyHtoD(a + (2 << 20) - 8, h.data(), 16) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemcpyDtoH(back.data(), 0, 16) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemcpyDtoD(a, 0x1000, 16) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemcpyHtoDAsync(a, h.data(), 16, reinterpret_cast<CUstream>(0x1234)) ==
        CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuMemcpyHtoD(a, h.data(), 0) == CUDA_SUCCESS);

  CHECK(cuStreamDestroy(s) == CUDA_SUCCESS);
  CHECK(cuMemFree(a) == CUDA_SUCCESS);
  CHECK(cuMemFree(b) == CUDA_SUCCESS);
}

TEST_CASE("fakecuda: memset D8, D16, D32, 2D and async") {
  REQUIRE(init_primary() == CUDA_SUCCESS);
  CUdeviceptr p;
  REQUIRE(cuMemAlloc(&p, 4096) == CUDA_SUCCESS);
  auto* b = reinterpret_cast<unsigned char*>(p);
  CHECK(cuMemsetD8(p, 0xab, 4096) == CUDA_SUCCESS);
  CHECK(b[0] == 0xab);
  CHECK(b[4095] == 0xab);
  CHECK(cuMemsetD16(p, 0x1234, 10) == CUDA_SUCCESS);
  CHECK(reinterpret_cast<uint16_t*>(p)[9] == 0x1234);
  CHECK(b[20] == 0xab);
  CHECK(cuMemsetD32Async(p, 0xdeadbeef, 4, nullptr) == CUDA_SUCCESS);
  CHECK(reinterpret_cast<uint32_t*>(p)[3] == 0xdeadbeefu);
  CHECK(cuMemsetD16(p + 1, 1, 1) == CUDA_ERROR_INVALID_VALUE);  // misaligned
  CHECK(cuMemsetD32(p + 2, 1, 1) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemsetD8_v2_ptds(p, 0, 4096) == CUDA_SUCCESS);
  CHECK(cuMemsetD2D8(p, 64, 0x7f, 8, 4) == CUDA_SUCCESS);
  CHECK(b[64 * 3 + 7] == 0x7f);
  CHECK(b[64 * 3 + 8] == 0);
  CHECK(cuMemsetD8(0x10, 1, 1) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemsetD8(p, 1, (2 << 20) + 1) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemFree(p) == CUDA_SUCCESS);
}

TEST_CASE("fakecuda: page-locked host memory") {
  REQUIRE(init_primary() == CUDA_SUCCESS);
  void* h = nullptr;
  REQUIRE(cuMemAllocHost(&h, 8192) == CUDA_SUCCESS);
  memset(h, 3, 8192);
  void* h2 = nullptr;
  REQUIRE(cuMemHostAlloc(&h2, 100, CU_MEMHOSTALLOC_PORTABLE) == CUDA_SUCCESS);
  unsigned flags = 0;
  CHECK(cuMemHostGetFlags(&flags, h2) == CUDA_SUCCESS);
  CHECK(flags == CU_MEMHOSTALLOC_PORTABLE);
  CUdeviceptr dp = 0;
  CHECK(cuMemHostGetDevicePointer(&dp, h, 0) == CUDA_SUCCESS);
  CHECK(dp == reinterpret_cast<CUdeviceptr>(h));
  CUdeviceptr d;
  REQUIRE(cuMemAlloc(&d, 8192) == CUDA_SUCCESS);
  CHECK(cuMemcpyHtoD(d, h, 8192) == CUDA_SUCCESS);
  CHECK(cuMemcpyDtoD(d, dp, 8192) ==
        CUDA_SUCCESS);  // a mapped host pointer is a valid device address
  CHECK(reinterpret_cast<unsigned char*>(d)[8191] == 3);
  CHECK(cuMemFreeHost(h) == CUDA_SUCCESS);
  CHECK(cuMemFreeHost(h) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemFreeHost(h2) == CUDA_SUCCESS);
  CHECK(cuMemFree(d) == CUDA_SUCCESS);
}
