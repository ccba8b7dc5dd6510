// Simulated driver: two processes really sharing device memory, through
// POSIX-fd export/import and through legacy IPC handles.
#include <doctest/doctest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "fakecuda_test_util.h"

using namespace fctest;

namespace {
constexpr size_t kGran = 2 << 20;

/// A creator: a child that fills a 1 MiB cuMemAlloc block with fill and
/// sends its legacy IPC handle (received into *h); told to go on, it checks
/// that the block's byte at reads expect (when at >= 0), and exits.
Child ipc_creator(unsigned char fill, CUipcMemHandle* h, int at = -1, unsigned char expect = 0) {
  Child creator = spawn([fill, at, expect](int sock) {
    FC_REQ(init_primary() == CUDA_SUCCESS);
    CUdeviceptr p;
    FC_REQ(cuMemAlloc(&p, 1 << 20) == CUDA_SUCCESS);
    FC_REQ(cuMemsetD8(p, fill, 1 << 20) == CUDA_SUCCESS);
    CUipcMemHandle mine;
    FC_REQ(cuIpcGetMemHandle(&mine, p) == CUDA_SUCCESS);
    FC_REQ(send(sock, &mine, sizeof mine, 0) == sizeof mine);
    uint64_t v;
    FC_REQ(recv_u64(sock, &v));
    if (at >= 0) FC_REQ(reinterpret_cast<unsigned char*>(p)[at] == expect);
    return 0;
  });
  REQUIRE(recv(creator.sock, h, sizeof *h, MSG_WAITALL) == sizeof *h);
  return creator;
}
}

TEST_CASE("fakecuda: two processes share a POSIX-fd VMM allocation") {
  REQUIRE(init_primary() == CUDA_SUCCESS);
  Child exporter = spawn([](int sock) {
    FC_REQ(init_primary() == CUDA_SUCCESS);
    VmmBuffer buf;
    FC_REQ(vmm_create(2 * kGran, &buf) == CUDA_SUCCESS);
    FC_REQ(cuMemsetD32(buf.ptr, 0x11223344, 2 * kGran / 4) == CUDA_SUCCESS);
    int fd = -1;
    FC_REQ(cuMemExportToShareableHandle(&fd, buf.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                        0) == CUDA_SUCCESS);
    FC_REQ(send_fd(sock, fd));
    uint64_t v = 0;
    FC_REQ(recv_u64(sock, &v));  // the importer wrote
    FC_REQ(reinterpret_cast<uint32_t*>(buf.ptr)[7] == 0xcafef00du);
    FC_REQ(reinterpret_cast<uint32_t*>(buf.ptr)[8] == 0x11223344u);
    FC_REQ(vmm_destroy(buf) == CUDA_SUCCESS);
    return 0;
  });
  int fd = recv_fd(exporter.sock);
  REQUIRE(fd >= 0);
  CUmemGenericAllocationHandle h = 0;
  REQUIRE(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == CUDA_SUCCESS);
  close(fd);
  CUmemAllocationProp prop{};
  CHECK(cuMemGetAllocationPropertiesFromHandle(&prop, h) == CUDA_SUCCESS);
  CUdeviceptr va = 0;
  REQUIRE(vmm_map_handle(h, 2 * kGran, &va) == CUDA_SUCCESS);
  CHECK(reinterpret_cast<uint32_t*>(va)[100] == 0x11223344u);
  reinterpret_cast<uint32_t*>(va)[7] = 0xcafef00du;
  REQUIRE(send_u64(exporter.sock, 1));
  CHECK(exporter.join() == 0);
  CHECK(reinterpret_cast<uint32_t*>(va)[7] == 0xcafef00du);  // bytes outlive the creator's release
  CHECK(cuMemUnmap(va, 2 * kGran) == CUDA_SUCCESS);
  CHECK(cuMemRelease(h) == CUDA_SUCCESS);
  CHECK(cuMemAddressFree(va, 2 * kGran) == CUDA_SUCCESS);
}

TEST_CASE("fakecuda: legacy IPC handles open the creator's cuMemAlloc memory") {
  REQUIRE(init_primary() == CUDA_SUCCESS);
  Child creator = spawn([](int sock) {
    FC_REQ(init_primary() == CUDA_SUCCESS);
    CUdeviceptr p;
    FC_REQ(cuMemAlloc(&p, 1 << 20) == CUDA_SUCCESS);
    FC_REQ(cuMemsetD8(p, 0x5a, 1 << 20) == CUDA_SUCCESS);
    CUipcMemHandle h;
    FC_REQ(cuIpcGetMemHandle(&h, p) == CUDA_SUCCESS);
    FC_REQ(cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) ==
           CUDA_ERROR_INVALID_CONTEXT);  // own
    FC_REQ(send(sock, &h, sizeof h, 0) == sizeof h);
    uint64_t v;
    FC_REQ(recv_u64(sock, &v));
    FC_REQ(reinterpret_cast<unsigned char*>(p)[3] == 0xa5);
    FC_REQ(cuMemFree(p) == CUDA_SUCCESS);
    return 0;
  });
  CUipcMemHandle h;
  REQUIRE(recv(creator.sock, &h, sizeof h, MSG_WAITALL) == sizeof h);
  CUdeviceptr p = 0, p2 = 0;
  REQUIRE(cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
  CHECK(reinterpret_cast<unsigned char*>(p)[12345] == 0x5a);
  CHECK(cuIpcOpenMemHandle(&p2, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
  CHECK(p2 == p);
  unsigned char v = 0xa5;
  CHECK(cuMemcpyHtoD(p + 3, &v, 1) == CUDA_SUCCESS);
  REQUIRE(send_u64(creator.sock, 1));
  CHECK(creator.join() == 0);
  CHECK(cuIpcCloseMemHandle(p) == CUDA_SUCCESS);
  CHECK(cuIpcCloseMemHandle(p) == CUDA_SUCCESS);
  CHECK(cuIpcCloseMemHandle(p) == CUDA_ERROR_INVALID_VALUE);
  CUipcMemHandle junk{};
  CHECK(cuIpcOpenMemHandle(&p, junk, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(cuIpcOpenMemHandle(nullptr, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) ==
        CUDA_ERROR_INVALID_VALUE);  // creator gone
}

TEST_CASE("fakecuda: a legacy IPC open is the bytes the exporter asked") {
  // As the real driver (measured on an H100, driver 580.159.04,
  // tests/gpu/probes/alloc_sizes.cpp ipc_tail) for a 1 MiB block in its
  // 2 MiB page: the open's range is 1 MiB, one past it is not found, and a
  // copy or memset that starts there or crosses the end is refused.
  REQUIRE(init_primary() == CUDA_SUCCESS);
  CUipcMemHandle h;
  Child creator = ipc_creator(0x4b, &h);
  const size_t n = 1 << 20;
  CUdeviceptr p = 0, base = 1, q = 0;
  size_t size = 1, attr = 0;
  REQUIRE(cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&q, 4 << 20) == CUDA_SUCCESS);
  CHECK(cuMemGetAddressRange(&base, &size, p + n - 1) == CUDA_SUCCESS);
  CHECK((base == p && size == n));
  CHECK(cuPointerGetAttribute(&attr, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p) == CUDA_SUCCESS);
  CHECK(attr == n);
  // Its context is the one it was opened in; not legacy-IPC capable, no
  // shareable handle types (alloc_sizes.cpp ipc_attrs, on the same H100).
  CUcontext ctx = nullptr, cur = nullptr;
  CHECK(cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, p) == CUDA_SUCCESS);
  CHECK(cuCtxGetCurrent(&cur) == CUDA_SUCCESS);
  CHECK(ctx == cur);
  unsigned long long types = 1;
  int capable = 1;
  CHECK(cuPointerGetAttribute(&types, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, p) ==
        CUDA_SUCCESS);
  CHECK(types == 0);
  CHECK(cuPointerGetAttribute(&capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p) ==
        CUDA_SUCCESS);
  CHECK(capable == 0);
  // Neither the open nor a cuMemAlloc block is a VMM mapping: no access
  // flags, and cuMemSetAccess refused (alloc_sizes.cpp ctx_attrs, ipc_attrs).
  CUmemLocation loc{};
  loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
  loc.id = 0;
  CUmemAccessDesc acc{};
  acc.location = loc;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (CUdeviceptr at : {p, q}) {
    unsigned long long access = 7;
    CHECK(cuMemGetAccess(&access, &loc, at) == CUDA_SUCCESS);
    CHECK(access == 0);
    CHECK(cuMemSetAccess(at, 2 << 20, &acc, 1) == CUDA_ERROR_INVALID_VALUE);
  }
  CHECK(cuMemSetAccess(q, 4 << 20, &acc, 1) == CUDA_ERROR_INVALID_VALUE);
  {  // past the bytes asked, in the rest of the granule: no memory, nothing
     // written (ctx_attrs, on an H100, for a block); the open likewise
    CUdeviceptr b = 0;
    REQUIRE(cuMemAlloc(&b, 1 << 20) == CUDA_SUCCESS);
    unsigned long long access = 7;
    CHECK(cuMemGetAccess(&access, &loc, b + (1 << 20) + 4096) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemGetAccess(&access, &loc, p + n) == CUDA_ERROR_INVALID_VALUE);
    CHECK(access == 7);
    CHECK(cuMemGetAccess(&access, &loc, b + (1 << 20) - 1) == CUDA_SUCCESS);  // its last byte
    CHECK(access == 0);
    CHECK(cuMemFree(b) == CUDA_SUCCESS);
  }
  const unsigned one = 1;
  CHECK(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p) == CUDA_SUCCESS);
  CHECK(cuMemGetAddressRange(&base, &size, p + n) == CUDA_ERROR_NOT_FOUND);
  CHECK((base == 0 && size == 0));
  unsigned char buf[32] = {};
  CHECK(cuMemcpyDtoH(buf, p + n - 16, 16) == CUDA_SUCCESS);  // up to the end
  CHECK(buf[15] == 0x4b);
  CHECK(cuMemsetD8(p + n - 16, 0x5a, 16) == CUDA_SUCCESS);
  CHECK(cuMemcpyDtoH(buf, p + n, 16) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemcpyDtoH(buf, p + n - 8, 16) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemcpyHtoD(p + n - 8, buf, 16) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemcpyDtoD(q, p + n - 8, 16) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemsetD8(p + n, 0x5a, 16) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemsetD8(p + n - 8, 0x5a, 16) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
  CHECK(cuMemFree(q) == CUDA_SUCCESS);
  CHECK(cuIpcCloseMemHandle(p) == CUDA_SUCCESS);
  REQUIRE(send_u64(creator.sock, 1));
  CHECK(creator.join() == 0);
}

TEST_CASE("fakecuda: a legacy IPC open goes with the context it was made in") {
  // As the real driver (tests/gpu/probes/context_ipc.cpp, on an H100): the
  // address is unknown after, its close refused, a new open succeeds.
  REQUIRE(init_primary() == CUDA_SUCCESS);
  CUipcMemHandle h;
  Child creator = ipc_creator(0x3c, &h);
  CUcontext before = nullptr, own = nullptr;
  REQUIRE(cuCtxGetCurrent(&before) == CUDA_SUCCESS);
  CUdevice dev;
  REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
  REQUIRE(cuCtxCreate(&own, nullptr, 0, dev) == CUDA_SUCCESS);
  CUdeviceptr p = 0;
  REQUIRE(cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
  CHECK(reinterpret_cast<unsigned char*>(p)[77] == 0x3c);
  REQUIRE(cuCtxDestroy(own) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(before) == CUDA_SUCCESS);
  CUdeviceptr base = 0;
  size_t size = 0;
  CHECK(cuMemGetAddressRange(&base, &size, p) == CUDA_ERROR_NOT_FOUND);
  CHECK(cuIpcCloseMemHandle(p) == CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr q = 0;
  REQUIRE(cuIpcOpenMemHandle(&q, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
  CHECK(reinterpret_cast<unsigned char*>(q)[77] == 0x3c);
  CHECK(cuIpcCloseMemHandle(q) == CUDA_SUCCESS);
  REQUIRE(send_u64(creator.sock, 1));
  CHECK(creator.join() == 0);
}

TEST_CASE("fakecuda: one context per device opens a legacy IPC handle") {
  // As the real driver (measured on an H200, driver 580.159.04,
  // tests/gpu/probes/context_ipc.cpp): opened twice in a created context it
  // gives one address, counted; the primary context of the same device then
  // gets CUDA_ERROR_INVALID_HANDLE. Once the created context's opens are
  // closed, the primary context's open succeeds.
  REQUIRE(init_primary() == CUDA_SUCCESS);
  CUipcMemHandle h;
  Child creator = ipc_creator(0x2d, &h);
  CUcontext primary = nullptr, own = nullptr;
  REQUIRE(cuCtxGetCurrent(&primary) == CUDA_SUCCESS);
  CUdevice dev;
  REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
  REQUIRE(cuCtxCreate(&own, nullptr, 0, dev) == CUDA_SUCCESS);
  CUdeviceptr p = 0, p2 = 0, q = 0;
  REQUIRE(cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
  CHECK(cuIpcOpenMemHandle(&p2, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
  CHECK(p2 == p);
  REQUIRE(cuCtxSetCurrent(primary) == CUDA_SUCCESS);
  CHECK(cuIpcOpenMemHandle(&q, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(reinterpret_cast<unsigned char*>(p)[99] == 0x2d);  // the open in `own` stands
  CHECK(cuIpcCloseMemHandle(p) == CUDA_SUCCESS);
  CHECK(cuIpcOpenMemHandle(&q, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) ==
        CUDA_ERROR_INVALID_HANDLE);  // one reference left
  CHECK(cuIpcCloseMemHandle(p) == CUDA_SUCCESS);
  REQUIRE(cuIpcOpenMemHandle(&q, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
  CHECK(reinterpret_cast<unsigned char*>(q)[99] == 0x2d);
  // Now the created context is refused.
  REQUIRE(cuCtxSetCurrent(own) == CUDA_SUCCESS);
  CHECK(cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_ERROR_INVALID_HANDLE);
  REQUIRE(cuCtxDestroy(own) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(primary) == CUDA_SUCCESS);
  CHECK(cuIpcCloseMemHandle(q) == CUDA_SUCCESS);
  REQUIRE(send_u64(creator.sock, 1));
  CHECK(creator.join() == 0);
}

TEST_CASE("fakecuda: a legacy IPC handle opens apart in a context of another device") {
  // Chosen, not measured (it takes two GPUs): the driver documents one
  // context per device, so each device's context gets its own open.
  REQUIRE(init_primary() == CUDA_SUCCESS);
  CUipcMemHandle h;
  Child creator = ipc_creator(0x4b, &h, 5, 0x99);
  CHECK(run_child([&h] {
          setenv("FAKECUDA_DEVICES", "2", 1);
          FC_REQ(init_primary() == CUDA_SUCCESS);  // device 0
          CUdeviceptr p0 = 0, p1 = 0, again = 0;
          FC_REQ(cuIpcOpenMemHandle(&p0, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
          CUdevice dev1;
          FC_REQ(cuDeviceGet(&dev1, 1) == CUDA_SUCCESS);
          CUcontext ctx1 = nullptr;
          FC_REQ(cuCtxCreate(&ctx1, nullptr, 0, dev1) == CUDA_SUCCESS);
          FC_REQ(cuIpcOpenMemHandle(&p1, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
          FC_REQ(p1 != p0);
          FC_REQ(cuIpcOpenMemHandle(&again, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
          FC_REQ(again == p1);
          FC_REQ(reinterpret_cast<unsigned char*>(p1)[5] == 0x4b);
          reinterpret_cast<unsigned char*>(p1)[5] = 0x99;  // one memory under both
          FC_REQ(reinterpret_cast<unsigned char*>(p0)[5] == 0x99);
          FC_REQ(cuIpcCloseMemHandle(p1) == CUDA_SUCCESS);
          FC_REQ(cuIpcCloseMemHandle(p1) == CUDA_SUCCESS);
          FC_REQ(cuIpcCloseMemHandle(p0) == CUDA_SUCCESS);
          FC_REQ(cuCtxDestroy(ctx1) == CUDA_SUCCESS);
          return 0;
        }) == 0);
  REQUIRE(send_u64(creator.sock, 1));
  CHECK(creator.join() == 0);
}
