// Simulated driver: cuGetProcAddress resolution, and the export list.
#include <dlfcn.h>
#include <doctest/doctest.h>

#include <cstring>
#include <string>

#include "fakecuda_test_util.h"

using namespace fctest;

extern "C" CUresult cuGetProcAddress_v2_ptsz(const char* symbol, void** funcPtr, int driverVersion, cuuint64_t flags,
                                             CUdriverProcAddressQueryResult* symbolStatus);

TEST_CASE("fakecuda: cuGetProcAddress finds versions, flavours and reports status") {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult st{};
  REQUIRE(cuGetProcAddress("cuMemAlloc", &fn, 12000, 0, &st) == CUDA_SUCCESS);
  CHECK(st == CU_GET_PROC_ADDRESS_SUCCESS);
  CHECK(fn == dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
  REQUIRE(cuGetProcAddress("cuMemAlloc", &fn, 3000, 0, &st) == CUDA_SUCCESS);
  CHECK(fn == dlsym(RTLD_DEFAULT, "cuMemAlloc"));
  CHECK(cuGetProcAddress("cuNoSuchThing", &fn, 13000, 0, &st) == CUDA_ERROR_NOT_FOUND);
  CHECK(st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  CHECK(fn == nullptr);
  CHECK(cuGetProcAddress("cuMemCreate", &fn, 10000, 0, &st) == CUDA_ERROR_NOT_FOUND);
  CHECK(st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  REQUIRE(cuGetProcAddress("cuMemcpyHtoDAsync", &fn, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st) ==
          CUDA_SUCCESS);
  CHECK(fn == dlsym(RTLD_DEFAULT, "cuMemcpyHtoDAsync_v2_ptsz"));
  REQUIRE(cuGetProcAddress("cuMemcpyHtoDAsync", &fn, 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &st) == CUDA_SUCCESS);
  CHECK(fn == dlsym(RTLD_DEFAULT, "cuMemcpyHtoDAsync_v2"));
  // No per-thread flavour: the default one.
  REQUIRE(cuGetProcAddress("cuMemCreate", &fn, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st) ==
          CUDA_SUCCESS);
  CHECK(fn == dlsym(RTLD_DEFAULT, "cuMemCreate"));
  CHECK(cuGetProcAddress(nullptr, &fn, 13000, 0, &st) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuGetProcAddress("cuMemCreate", nullptr, 13000, 0, &st) == CUDA_ERROR_INVALID_VALUE);
  // The v1 entry and the _v2_ptsz name.
  using V1 = CUresult (*)(const char*, void**, int, cuuint64_t);
  auto v1 = reinterpret_cast<V1>(dlsym(RTLD_DEFAULT, "cuGetProcAddress"));
  REQUIRE(reinterpret_cast<void*>(v1) != nullptr);
  CHECK(v1("cuInit", &fn, 12000, 0) == CUDA_SUCCESS);
  CHECK(fn == dlsym(RTLD_DEFAULT, "cuInit"));
  CHECK(cuGetProcAddress_v2_ptsz("cuStreamQuery", &fn, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st) ==
        CUDA_SUCCESS);
  CHECK(fn == dlsym(RTLD_DEFAULT, "cuStreamQuery_ptsz"));
}

TEST_CASE("fakecuda: callers of CUDA 13.1 get the device-explicit multicast binds") {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult st{};
  REQUIRE(cuGetProcAddress("cuMulticastBindMem", &fn, 13000, 0, &st) == CUDA_SUCCESS);
  CHECK(fn == dlsym(RTLD_DEFAULT, "cuMulticastBindMem"));
  REQUIRE(cuGetProcAddress("cuMulticastBindMem", &fn, 13010, 0, &st) == CUDA_SUCCESS);
  CHECK(fn == reinterpret_cast<void*>(&cuMulticastBindMem_v2));
  REQUIRE(cuGetProcAddress("cuMulticastBindAddr", &fn, 13010, 0, &st) == CUDA_SUCCESS);
  CHECK(fn == reinterpret_cast<void*>(&cuMulticastBindAddr_v2));
}

TEST_CASE("fakecuda: every proc-table row resolves to the exported symbol of that name") {
  enum { CUSNAP_PROC_DEFAULT, CUSNAP_PROC_PTDS, CUSNAP_PROC_PTSZ };
  struct Row {
    const char* name;
    int version;
    int flavour;
    const char* symbol;
  };
  static const Row rows[] = {
#define CUSNAP_CU_PROC(name, version, flavour, symbol) {name, version, flavour, #symbol},
#include "cudaapi/proc_table.inc"
#undef CUSNAP_CU_PROC
  };
  int checked = 0;
  for (const Row& r : rows) {
    void* sym = dlsym(RTLD_DEFAULT, r.symbol);
    CHECK_MESSAGE(sym != nullptr, r.symbol);
    // The row the resolver picks for exactly this version and flavour.
    void* fn = nullptr;
    CUdriverProcAddressQueryResult st{};
    cuuint64_t flags = r.flavour == CUSNAP_PROC_DEFAULT ? CU_GET_PROC_ADDRESS_LEGACY_STREAM
                                                        : CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    CHECK(cuGetProcAddress(r.name, &fn, r.version, flags, &st) == CUDA_SUCCESS);
    ++checked;
  }
  CHECK(checked > 500);
}

TEST_CASE("fakecuda: unimplemented entry points fail NOT_SUPPORTED") {
  CUarray arr = nullptr;
  CUDA_ARRAY_DESCRIPTOR desc{};
  CHECK(cuArrayCreate(&arr, &desc) == CUDA_ERROR_NOT_SUPPORTED);
}
