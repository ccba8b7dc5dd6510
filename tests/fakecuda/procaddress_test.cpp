// Simulated driver: cuGetProcAddress resolution, and the export list.
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "fakecuda_test_util.h"

using namespace fctest;

extern "C" CUresult cuGetProcAddress_v2_ptsz(const char* symbol, void** funcPtr, int driverVersion,
                                             cuuint64_t flags,
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
  REQUIRE(cuGetProcAddress("cuMemcpyHtoDAsync", &fn, 13000,
                           CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st) == CUDA_SUCCESS);
  CHECK(fn == dlsym(RTLD_DEFAULT, "cuMemcpyHtoDAsync_v2_ptsz"));
  REQUIRE(cuGetProcAddress("cuMemcpyHtoDAsync", &fn, 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM,
                           &st) == CUDA_SUCCESS);
  CHECK(fn == dlsym(RTLD_DEFAULT, "cuMemcpyHtoDAsync_v2"));
  // No per-thread flavour: the default one.
  REQUIRE(cuGetProcAddress("cuMemCreate", &fn, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                           &st) == CUDA_SUCCESS);
  CHECK(fn == dlsym(RTLD_DEFAULT, "cuMemCreate"));
  CHECK(cuGetProcAddress(nullptr, &fn, 13000, 0, &st) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuGetProcAddress("cuMemCreate", nullptr, 13000, 0, &st) == CUDA_ERROR_INVALID_VALUE);
  // The v1 entry and the _v2_ptsz name.
  using V1 = CUresult (*)(const char*, void**, int, cuuint64_t);
  auto v1 = reinterpret_cast<V1>(dlsym(RTLD_DEFAULT, "cuGetProcAddress"));
  REQUIRE(reinterpret_cast<void*>(v1) != nullptr);
  CHECK(v1("cuInit", &fn, 12000, 0) == CUDA_SUCCESS);
  CHECK(fn == dlsym(RTLD_DEFAULT, "cuInit"));
  CHECK(cuGetProcAddress_v2_ptsz("cuStreamQuery", &fn, 13000,
                                 CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                                 &st) == CUDA_SUCCESS);
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
    cuuint64_t flags = r.flavour == CUSNAP_PROC_DEFAULT
                           ? CU_GET_PROC_ADDRESS_LEGACY_STREAM
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

TEST_CASE("fakecuda: the library exports every entry point cuda.h declares") {
  static const char* const names[] = {
#define CUSNAP_CU_ENTRY(symbol, params, args) #symbol,
#include "cudaapi/entry_points.inc"
#undef CUSNAP_CU_ENTRY
  };
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(lib != nullptr);
  for (const char* n : names) CHECK_MESSAGE(dlsym(lib, n) != nullptr, n);
  CHECK(dlsym(lib, "cuMulticastBindMem_v2") != nullptr);
  CHECK(dlsym(lib, "cuMulticastBindAddr_v2") != nullptr);
  // Internals stay hidden.
  CHECK(dlsym(lib, "_ZN2fc6driverEv") == nullptr);
  dlclose(lib);
}

TEST_CASE("fakecuda: the 32-bit legacy cuMemAlloc returns addresses below 4 GiB") {
  REQUIRE(init_primary() == CUDA_SUCCESS);
  using Alloc32 = CUresult (*)(unsigned int*, unsigned int);
  using Free32 = CUresult (*)(unsigned int);
  void* fa = nullptr;
  void* ff = nullptr;
  REQUIRE(cuGetProcAddress("cuMemAlloc", &fa, 3000, 0, nullptr) == CUDA_SUCCESS);
  REQUIRE(cuGetProcAddress("cuMemFree", &ff, 3000, 0, nullptr) == CUDA_SUCCESS);
  unsigned int p = 0;
  REQUIRE(reinterpret_cast<Alloc32>(fa)(&p, 4096) == CUDA_SUCCESS);
  CHECK(p != 0);
  reinterpret_cast<unsigned char*>(static_cast<uintptr_t>(p))[10] = 1;
  CHECK(reinterpret_cast<Free32>(ff)(p) == CUDA_SUCCESS);
}

TEST_CASE("fakecuda: FAKECUDA_LOG=1 traces calls to stderr") {
  CHECK(run_child([] {
          setenv("FAKECUDA_LOG", "1", 1);
          int pipefd[2];
          FC_REQ(pipe(pipefd) == 0);
          dup2(pipefd[1], 2);
          FC_REQ(cuInit(0) == CUDA_SUCCESS);
          int n;
          FC_REQ(cuDeviceGetCount(&n) == CUDA_SUCCESS);
          close(pipefd[1]);
          close(2);
          char buf[512] = {};
          ssize_t got = read(pipefd[0], buf, sizeof buf - 1);
          return got > 0 && strstr(buf, "cuDeviceGetCount") ? 0 : 1;
        }) == 0);
}
