// Simulated driver: virtual memory management rules, export/import within a
// process, and multicast on and off.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "fakecuda_test_util.h"

using namespace fctest;

namespace {

constexpr size_t kGran = 2 << 20;

CUmemAllocationProp device_prop(int dev = 0) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

CUmemAccessDesc rw(int dev = 0) {
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = dev;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return a;
}

}  // namespace

TEST_CASE("fakecuda: VMM create, reserve, map, access and their rules") {
  REQUIRE(init_primary() == CUDA_SUCCESS);
  CUmemAllocationProp prop = device_prop();
  size_t g = 0;
  REQUIRE(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ==
          CUDA_SUCCESS);
  CHECK(g == kGran);
  CHECK(cuMemGetAllocationGranularity(nullptr, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ==
        CUDA_ERROR_INVALID_VALUE);

  CUmemGenericAllocationHandle h = 0;
  CHECK(cuMemCreate(&h, kGran + 4096, &prop, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemCreate(&h, kGran, &prop, 1) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemCreate(nullptr, kGran, &prop, 0) == CUDA_ERROR_INVALID_VALUE);
  CUmemAllocationProp bad = device_prop(7);
  CHECK(cuMemCreate(&h, kGran, &bad, 0) == CUDA_ERROR_INVALID_DEVICE);
  REQUIRE(cuMemCreate(&h, 2 * kGran, &prop, 0) == CUDA_SUCCESS);

  CUdeviceptr va = 0;
  CHECK(cuMemAddressReserve(&va, kGran + 1, 0, 0, 0) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuMemAddressReserve(&va, 4 * kGran, 0, 0, 0) == CUDA_SUCCESS);
  CHECK(va % kGran == 0);
  CHECK(cuMemMap(va + 4096, kGran, 0, h, 0) == CUDA_ERROR_INVALID_VALUE);  // unaligned address
  CHECK(cuMemMap(va, kGran, 4096, h, 0) == CUDA_ERROR_INVALID_VALUE);      // unaligned offset
  CHECK(cuMemMap(va, 3 * kGran, 0, h, 0) == CUDA_ERROR_INVALID_VALUE);     // beyond the allocation
  CHECK(cuMemMap(va + 3 * kGran, 2 * kGran, 0, h, 0) ==
        CUDA_ERROR_INVALID_VALUE);  // beyond the reservation
  CHECK(cuMemMap(va, kGran, 0, 0xdead, 0) == CUDA_ERROR_INVALID_HANDLE);
  REQUIRE(cuMemMap(va, 2 * kGran, 0, h, 0) == CUDA_SUCCESS);
  CHECK(cuMemMap(va + kGran, kGran, 0, h, 0) == CUDA_ERROR_INVALID_VALUE);  // overlaps
  REQUIRE(cuMemMap(va + 2 * kGran, kGran, kGran, h, 0) == CUDA_SUCCESS);    // second half again

  // No access yet: the driver refuses copies.
  unsigned char byte = 1;
  CHECK(cuMemcpyHtoD(va, &byte, 1) == CUDA_ERROR_INVALID_VALUE);
  CUmemLocation loc{CU_MEM_LOCATION_TYPE_DEVICE, 0};
  unsigned long long flags = 99;
  CHECK(cuMemGetAccess(&flags, &loc, va) == CUDA_SUCCESS);
  CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_NONE);
  CUmemAccessDesc acc = rw();
  CHECK(cuMemSetAccess(va, kGran, &acc, 1) == CUDA_ERROR_INVALID_VALUE);      // part of a mapping
  CHECK(cuMemSetAccess(va, 4 * kGran, &acc, 1) == CUDA_ERROR_INVALID_VALUE);  // unmapped tail
  REQUIRE(cuMemSetAccess(va, 3 * kGran, &acc, 1) == CUDA_SUCCESS);
  CHECK(cuMemGetAccess(&flags, &loc, va + kGran) == CUDA_SUCCESS);
  CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  CHECK(cuMemGetAccess(&flags, &loc, va + 3 * kGran) == CUDA_ERROR_INVALID_VALUE);

  // Both views of the second half share bytes.
  auto* p = reinterpret_cast<unsigned char*>(va);
  p[kGran + 5] = 42;
  CHECK(p[2 * kGran + 5] == 42);
  CHECK(cuMemsetD8(va + 2 * kGran, 9, 16) == CUDA_SUCCESS);
  CHECK(p[kGran + 5] == 9);

  // Retain gives the same handle and needs its own release.
  CUmemGenericAllocationHandle r = 0;
  CHECK(cuMemRetainAllocationHandle(&r, reinterpret_cast<void*>(va + 100)) == CUDA_SUCCESS);
  CHECK(r == h);
  CHECK(cuMemRelease(r) == CUDA_SUCCESS);
  CUmemAllocationProp got{};
  CHECK(cuMemGetAllocationPropertiesFromHandle(&got, h) == CUDA_SUCCESS);
  CHECK(got.location.id == 0);
  CHECK(got.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);

  // Release while mapped: the memory stays until unmapped.
  CHECK(cuMemRelease(h) == CUDA_SUCCESS);
  CHECK(cuMemRelease(h) == CUDA_ERROR_INVALID_VALUE);
  CHECK(p[kGran + 5] == 9);
  CHECK(cuMemAddressFree(va, 4 * kGran) == CUDA_ERROR_INVALID_VALUE);  // still mapped
  CHECK(cuMemUnmap(va, kGran) == CUDA_ERROR_INVALID_VALUE);            // part of a mapping
  CHECK(cuMemUnmap(va, 3 * kGran) == CUDA_SUCCESS);
  CHECK(cuMemUnmap(va, 2 * kGran) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemAddressFree(va, 2 * kGran) == CUDA_ERROR_INVALID_VALUE);  // not the whole reservation
  CHECK(cuMemAddressFree(va, 4 * kGran) == CUDA_SUCCESS);
}

TEST_CASE("fakecuda: address hints are honoured when free") {
  REQUIRE(init_primary() == CUDA_SUCCESS);
  CUdeviceptr a = 0, b = 0;
  REQUIRE(cuMemAddressReserve(&a, 2 * kGran, 0, 0, 0) == CUDA_SUCCESS);
  REQUIRE(cuMemAddressFree(a, 2 * kGran) == CUDA_SUCCESS);
  REQUIRE(cuMemAddressReserve(&b, 2 * kGran, 0, a, 0) == CUDA_SUCCESS);
  CHECK(b == a);
  CUdeviceptr c = 0;
  REQUIRE(cuMemAddressReserve(&c, 2 * kGran, 0, a, 0) == CUDA_SUCCESS);  // taken: elsewhere
  CHECK(c != a);
  CHECK(cuMemAddressFree(b, 2 * kGran) == CUDA_SUCCESS);
  CHECK(cuMemAddressFree(c, 2 * kGran) == CUDA_SUCCESS);
}

TEST_CASE("fakecuda: POSIX fd export and import within one process") {
  REQUIRE(init_primary() == CUDA_SUCCESS);
  VmmBuffer buf;
  REQUIRE(vmm_create(kGran, &buf) == CUDA_SUCCESS);
  int fd = -1;
  CHECK(cuMemExportToShareableHandle(&fd, buf.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                     1) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemExportToShareableHandle(nullptr, buf.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                     0) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuMemExportToShareableHandle(&fd, buf.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                       0) == CUDA_SUCCESS);
  CHECK(fd >= 0);
  char link[128] = {};
  CHECK(readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), link, sizeof link - 1) > 0);
  CHECK(std::string(link).rfind("/memfd:fakecuda:" + std::to_string(getpid()) + ":", 0) == 0);
  CUmemGenericAllocationHandle imp = 0;
  REQUIRE(cuMemImportFromShareableHandle(&imp, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == CUDA_SUCCESS);
  CHECK(imp == buf.handle);  // one driver handle per allocation per process
  CUdeviceptr view = 0;
  REQUIRE(vmm_map_handle(imp, kGran, &view) == CUDA_SUCCESS);
  reinterpret_cast<int*>(buf.ptr)[10] = 1234;
  CHECK(reinterpret_cast<int*>(view)[10] == 1234);
  CHECK(cuMemUnmap(view, kGran) == CUDA_SUCCESS);
  CHECK(cuMemAddressFree(view, kGran) == CUDA_SUCCESS);
  CHECK(cuMemRelease(imp) == CUDA_SUCCESS);
  CHECK(vmm_destroy(buf) == CUDA_SUCCESS);
  close(fd);

  // Not a simulated-driver descriptor.
  int other = open("/dev/null", O_RDONLY);
  CHECK(cuMemImportFromShareableHandle(&imp, reinterpret_cast<void*>(static_cast<intptr_t>(other)),
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ==
        CUDA_ERROR_INVALID_VALUE);
  close(other);

  // Not requested at creation: no export.
  CUmemAllocationProp plain = {};
  plain.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  plain.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemGenericAllocationHandle h;
  REQUIRE(cuMemCreate(&h, kGran, &plain, 0) == CUDA_SUCCESS);
  CHECK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemRelease(h) == CUDA_SUCCESS);
}

TEST_CASE("fakecuda: multicast is NOT_SUPPORTED unless FAKECUDA_MULTICAST=1") {
  CHECK(run_child([] {
          unsetenv("FAKECUDA_MULTICAST");
          FC_REQ(init_primary() == CUDA_SUCCESS);
          CUmulticastObjectProp mp{};
          mp.numDevices = 1;
          mp.size = kGran;
          CUmemGenericAllocationHandle mc;
          FC_REQ(cuMulticastCreate(&mc, &mp) == CUDA_ERROR_NOT_SUPPORTED);
          size_t g;
          FC_REQ(cuMulticastGetGranularity(&g, &mp, CU_MULTICAST_GRANULARITY_MINIMUM) ==
                 CUDA_ERROR_NOT_SUPPORTED);
          FC_REQ(cuMulticastAddDevice(1, 0) == CUDA_ERROR_NOT_SUPPORTED);
          return 0;
        }) == 0);
}

TEST_CASE("fakecuda: multicast objects, devices and bindings") {
  CHECK(run_child([] {
          setenv("FAKECUDA_MULTICAST", "1", 1);
          setenv("FAKECUDA_DEVICES", "2", 1);
          FC_REQ(init_primary() == CUDA_SUCCESS);
          CUmulticastObjectProp mp{};
          mp.numDevices = 2;
          mp.size = 2 * kGran;
          mp.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
          size_t g = 0;
          FC_REQ(cuMulticastGetGranularity(&g, &mp, CU_MULTICAST_GRANULARITY_RECOMMENDED) ==
                     CUDA_SUCCESS &&
                 g == kGran);
          CUmemGenericAllocationHandle mc;
          CUmulticastObjectProp bad = mp;
          bad.numDevices = 3;
          FC_REQ(cuMulticastCreate(&mc, &bad) == CUDA_ERROR_INVALID_VALUE);
          FC_REQ(cuMulticastCreate(&mc, &mp) == CUDA_SUCCESS);
          FC_REQ(cuMulticastAddDevice(mc, 0) == CUDA_SUCCESS);
          FC_REQ(cuMulticastAddDevice(mc, 0) == CUDA_ERROR_INVALID_VALUE);
          FC_REQ(cuMulticastAddDevice(mc, 5) == CUDA_ERROR_INVALID_DEVICE);
          FC_REQ(cuMulticastAddDevice(mc, 1) == CUDA_SUCCESS);
          VmmBuffer mem;
          FC_REQ(vmm_create(2 * kGran, &mem) == CUDA_SUCCESS);
          FC_REQ(cuMulticastBindMem(mc, 0, mem.handle, 0, kGran, 0) ==
                 CUDA_SUCCESS);  // context device 0
          FC_REQ(cuMulticastBindMem(mc, 0, mem.handle, 0, kGran, 0) ==
                 CUDA_ERROR_INVALID_VALUE);  // overlap
          FC_REQ(cuMulticastBindMem_v2(mc, 1, 0, mem.handle, kGran, kGran, 0) == CUDA_SUCCESS);
          FC_REQ(cuMulticastBindAddr_v2(mc, 1, kGran, mem.ptr, kGran, 0) == CUDA_SUCCESS);
          FC_REQ(cuMulticastBindAddr(mc, kGran, mem.ptr + kGran, kGran, 0) == CUDA_SUCCESS);
          FC_REQ(cuMulticastBindMem(mc, 4096, mem.handle, 0, kGran, 0) == CUDA_ERROR_INVALID_VALUE);
          FC_REQ(cuMulticastBindMem(mc, 0, mem.handle, 0, kGran, 1) == CUDA_ERROR_INVALID_VALUE);
          FC_REQ(cuMulticastBindMem(0xbad, 0, mem.handle, 0, kGran, 0) ==
                 CUDA_ERROR_INVALID_HANDLE);
          FC_REQ(cuMulticastUnbind(mc, 1, 0, kGran) == CUDA_SUCCESS);
          FC_REQ(cuMulticastUnbind(mc, 1, 0, kGran) == CUDA_ERROR_INVALID_VALUE);
          // The multicast handle maps like memory.
          CUdeviceptr mva = 0;
          FC_REQ(vmm_map_handle(mc, 2 * kGran, &mva) == CUDA_SUCCESS);
          reinterpret_cast<int*>(mva)[0] = 5;
          FC_REQ(cuMemUnmap(mva, 2 * kGran) == CUDA_SUCCESS);
          FC_REQ(cuMemAddressFree(mva, 2 * kGran) == CUDA_SUCCESS);
          FC_REQ(cuMemRelease(mc) == CUDA_SUCCESS);
          FC_REQ(vmm_destroy(mem) == CUDA_SUCCESS);
          return 0;
        }) == 0);
}
