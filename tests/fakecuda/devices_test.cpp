// Simulated driver: initialisation, error strings, devices, contexts, the
// profiler API, streams, events and modules.
#include <cudaProfiler.h>
#include <dirent.h>
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>

#include "device_env.h"
#include "fakecuda_test_util.h"

using namespace fctest;

TEST_CASE("fakecuda: calls before cuInit fail NOT_INITIALIZED; version and errors need no init") {
  // The child is forked from this initialised process: the checkpoint API,
  // which acts on other processes, answers there (the real driver's rule,
  // checkpoint_test.cpp "a child forked after cuInit").
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CHECK(run_child([] {
          int n = 0;
          FC_REQ(cuDeviceGetCount(&n) == CUDA_ERROR_NOT_INITIALIZED);
          CUdeviceptr p;
          FC_REQ(cuMemAlloc(&p, 16) == CUDA_ERROR_NOT_INITIALIZED);
          CUprocessState s;
          FC_REQ(cuCheckpointProcessGetState(getppid(), &s) == CUDA_SUCCESS);
          FC_REQ(s == CU_PROCESS_STATE_RUNNING);
          int v = 0;
          FC_REQ(cuDriverGetVersion(&v) == CUDA_SUCCESS && v == 13000);
          FC_REQ(cuDriverGetVersion(nullptr) == CUDA_ERROR_INVALID_VALUE);
          FC_REQ(cuInit(1) == CUDA_ERROR_INVALID_VALUE);
          setenv("FAKECUDA_DRIVER_VERSION", "12080", 1);
          FC_REQ(cuDriverGetVersion(&v) == CUDA_SUCCESS && v == 12080);
          return 0;
        }) == 0);
}

namespace {

/// Lowers this process's soft RLIMIT_NOFILE to the highest limit below which
/// exactly `free_fds` descriptors can still be opened; the old limit in *old.
bool leave_descriptors(int free_fds, rlimit* old) {
  if (getrlimit(RLIMIT_NOFILE, old) != 0) return false;
  std::set<int> open;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return false;
  while (const dirent* e = readdir(d))
    if (e->d_name[0] != '.' && std::atoi(e->d_name) != dirfd(d)) open.insert(std::atoi(e->d_name));
  closedir(d);
  rlim_t limit = 0;
  for (int left = 0;; ++limit) {
    if (!open.count(static_cast<int>(limit)) && ++left > free_fds) break;
  }
  rlimit low = *old;
  low.rlim_cur = limit;  // descriptor `limit` would be the (free_fds + 1)-th
  return setrlimit(RLIMIT_NOFILE, &low) == 0;
}

}  // namespace

TEST_CASE("fakecuda: the first cuInit needs 13 descriptors below the soft RLIMIT_NOFILE") {
  // As the real driver (H100 and H200, 580.159.04): with 8-12 descriptors left
  // cuInit fails NO_DEVICE, with 6-7 UNKNOWN, and a later cuInit with the
  // limit raised succeeds; with 0-5 it fails OPERATING_SYSTEM, and so does
  // every later cuInit of the process, but a child forked after it
  // initialises. Once initialised the driver needs no descriptor for cuInit.
  // Children forked from here start afresh (FAKECUDA_FORK_REINIT).
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  struct Case {
    int free_fds;
    CUresult first, again;
  };
  const Case cases[] = {{0, CUDA_ERROR_OPERATING_SYSTEM, CUDA_ERROR_OPERATING_SYSTEM},
                        {5, CUDA_ERROR_OPERATING_SYSTEM, CUDA_ERROR_OPERATING_SYSTEM},
                        {6, CUDA_ERROR_UNKNOWN, CUDA_SUCCESS},
                        {7, CUDA_ERROR_UNKNOWN, CUDA_SUCCESS},
                        {8, CUDA_ERROR_NO_DEVICE, CUDA_SUCCESS},
                        {12, CUDA_ERROR_NO_DEVICE, CUDA_SUCCESS},
                        {13, CUDA_SUCCESS, CUDA_SUCCESS},
                        {40, CUDA_SUCCESS, CUDA_SUCCESS}};
  for (const Case& c : cases) {
    CAPTURE(c.free_fds);
    CHECK(run_child([c] {
            rlimit old{};
            FC_REQ(leave_descriptors(c.free_fds, &old));
            FC_REQ(cuInit(0) == c.first);
            int n = 0, v = 0;
            FC_REQ(cuDeviceGetCount(&n) ==
                   (c.first == CUDA_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED));
            FC_REQ(cuDriverGetVersion(&v) == CUDA_SUCCESS && v == 13000);
            FC_REQ(setrlimit(RLIMIT_NOFILE, &old) == 0);
            // The simulated driver keeps none of the descriptors it needed.
            FC_REQ(leave_descriptors(c.free_fds, &old));
            const CUresult again = cuInit(0);
            FC_REQ(setrlimit(RLIMIT_NOFILE, &old) == 0);
            FC_REQ(again == c.first);
            FC_REQ(cuInit(0) == c.again);
            FC_REQ(cuDeviceGetCount(&n) ==
                   (c.again == CUDA_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED));
            if (c.again == CUDA_SUCCESS) {
              // Initialised: no descriptor left is no matter.
              FC_REQ(leave_descriptors(0, &old));
              const CUresult r = cuInit(0);
              FC_REQ(setrlimit(RLIMIT_NOFILE, &old) == 0);
              FC_REQ(r == CUDA_SUCCESS);
            } else {
              FC_REQ(run_child([] {
                       int m = 0;
                       FC_REQ(cuInit(0) == CUDA_SUCCESS);
                       FC_REQ(cuDeviceGetCount(&m) == CUDA_SUCCESS && m == 1);
                       return 0;
                     }) == 0);
            }
            return 0;
          }) == 0);
  }
}

TEST_CASE("fakecuda: error names and strings") {
  const char* s = nullptr;
  CHECK(cuGetErrorName(CUDA_ERROR_ILLEGAL_STATE, &s) == CUDA_SUCCESS);
  CHECK(std::string(s) == "CUDA_ERROR_ILLEGAL_STATE");
  CHECK(cuGetErrorName(CUDA_ERROR_NOT_SUPPORTED, &s) == CUDA_SUCCESS);
  CHECK(std::string(s) == "CUDA_ERROR_NOT_SUPPORTED");
  CHECK(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s) == CUDA_SUCCESS);
  CHECK(std::strlen(s) > 0);
  CHECK(cuGetErrorName(static_cast<CUresult>(123456), &s) == CUDA_ERROR_INVALID_VALUE);
  CHECK(s == nullptr);
  CHECK(cuGetErrorName(CUDA_SUCCESS, nullptr) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("fakecuda: devices from the environment") {
  auto uuid_of = [](const char* seed, int dev, CUuuid* out) {
    return run_child([=] {
      setenv("FAKECUDA_DEVICES", "3", 1);
      if (seed)
        setenv("FAKECUDA_UUID_SEED", seed, 1);
      else
        unsetenv("FAKECUDA_UUID_SEED");
      FC_REQ(cuInit(0) == CUDA_SUCCESS);
      CUuuid u;
      FC_REQ(cuDeviceGetUuid_v2(&u, dev) == CUDA_SUCCESS);
      // Report the first byte pair through the exit status (hash check below).
      (void)out;
      return (static_cast<unsigned char>(u.bytes[0]) ^ static_cast<unsigned char>(u.bytes[15])) %
                 200 +
             1;
    });
  };
  // Deterministic: the same seed and index give the same UUID in two processes.
  CHECK(uuid_of("5", 1, nullptr) == uuid_of("5", 1, nullptr));
  CHECK(run_child([] {
          setenv("FAKECUDA_DEVICES", "3", 1);
          setenv("FAKECUDA_DEVICE_NAME", "Test GPU", 1);
          setenv("FAKECUDA_TOTAL_MEM", "1073741824", 1);
          unsetenv("FAKECUDA_MULTICAST");
          FC_REQ(cuInit(0) == CUDA_SUCCESS);
          int n = 0;
          FC_REQ(cuDeviceGetCount(&n) == CUDA_SUCCESS && n == 3);
          FC_REQ(cuDeviceGetCount(nullptr) == CUDA_ERROR_INVALID_VALUE);
          CUdevice d;
          FC_REQ(cuDeviceGet(&d, 2) == CUDA_SUCCESS && d == 2);
          FC_REQ(cuDeviceGet(&d, 3) == CUDA_ERROR_INVALID_DEVICE);
          FC_REQ(cuDeviceGet(nullptr, 0) == CUDA_ERROR_INVALID_VALUE);
          char name[64];
          FC_REQ(cuDeviceGetName(name, sizeof name, 1) == CUDA_SUCCESS &&
                 std::string(name) == "Test GPU");
          FC_REQ(cuDeviceGetName(name, sizeof name, 7) == CUDA_ERROR_INVALID_DEVICE);
          size_t total = 0;
          FC_REQ(cuDeviceTotalMem(&total, 0) == CUDA_SUCCESS && total == (size_t{1} << 30));
          CUuuid a, b, a2;
          FC_REQ(cuDeviceGetUuid(&a, 0) == CUDA_SUCCESS);
          FC_REQ(cuDeviceGetUuid_v2(&b, 1) == CUDA_SUCCESS);
          FC_REQ(cuDeviceGetUuid_v2(&a2, 0) == CUDA_SUCCESS);
          FC_REQ(memcmp(&a, &b, sizeof a) != 0);
          FC_REQ(memcmp(&a, &a2, sizeof a) == 0);
          FC_REQ(cuDeviceGetUuid(nullptr, 0) == CUDA_ERROR_INVALID_VALUE);
          int v = -1;
          FC_REQ(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0) ==
                     CUDA_SUCCESS &&
                 v == 9);
          FC_REQ(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0) ==
                     CUDA_SUCCESS &&
                 v == 0);
          FC_REQ(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                      0) == CUDA_SUCCESS &&
                 v == 1);
          FC_REQ(cuDeviceGetAttribute(
                     &v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0) ==
                     CUDA_SUCCESS &&
                 v == 1);
          FC_REQ(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, 0) ==
                     CUDA_SUCCESS &&
                 v == 0);
          FC_REQ(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX, 0) == CUDA_ERROR_INVALID_VALUE);
          FC_REQ(cuDeviceGetAttribute(nullptr, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0) ==
                 CUDA_ERROR_INVALID_VALUE);
          FC_REQ(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 9) ==
                 CUDA_ERROR_INVALID_DEVICE);
          char bus[32];
          FC_REQ(cuDeviceGetPCIBusId(bus, sizeof bus, 2) == CUDA_SUCCESS);
          FC_REQ(cuDeviceGetByPCIBusId(&d, bus) == CUDA_SUCCESS && d == 2);
          return 0;
        }) == 0);
  CHECK(run_child([] {
          setenv("FAKECUDA_MULTICAST", "1", 1);
          FC_REQ(cuInit(0) == CUDA_SUCCESS);
          int v = 0;
          FC_REQ(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, 0) ==
                     CUDA_SUCCESS &&
                 v == 1);
          return 0;
        }) == 0);
  CHECK(run_child([] {
          setenv("FAKECUDA_DEVICES", "0", 1);
          FC_REQ(cuInit(0) == CUDA_ERROR_NO_DEVICE);
          return 0;
        }) == 0);
}

TEST_CASE("fakecuda: CUDA_VISIBLE_DEVICES chooses and orders the devices a process sees") {
  // Which machine device (by UUID) ordinal `ord` is under `visible`, of 3
  // devices: 1 + the machine index, 0 when there is no such ordinal, 9 when
  // cuInit fails NO_DEVICE; the count of devices is checked against `count`.
  auto seen = [](const char* visible, int ord, int count) {
    return run_child([=] {
      setenv("FAKECUDA_DEVICES", "3", 1);
      unsetenv("FAKECUDA_UUID_SEED");
      setenv("CUDA_VISIBLE_DEVICES", visible, 1);
      CUresult r = cuInit(0);
      if (r == CUDA_ERROR_NO_DEVICE) return 9;
      FC_REQ(r == CUDA_SUCCESS);
      int n = -1;
      FC_REQ(cuDeviceGetCount(&n) == CUDA_SUCCESS && n == count);
      CUuuid u;
      if (cuDeviceGetUuid_v2(&u, ord) != CUDA_SUCCESS) return 0;
      for (int i = 0; i < 3; ++i) {
        unsigned char want[16];
        fc::device_uuid(i, 0, want);
        if (memcmp(u.bytes, want, 16) == 0) return i + 1;
      }
      return 8;
    });
  };
  CHECK(seen("2,0", 0, 2) == 3);
  CHECK(seen("2,0", 1, 2) == 1);
  CHECK(seen("2,0", 2, 2) == 0);
  CHECK(seen(" 1 ", 0, 1) == 2);
  // The list ends at its first entry that names no device, or one named before.
  CHECK(seen("1,7,0", 0, 1) == 2);
  CHECK(seen("1,x,0", 0, 1) == 2);
  CHECK(seen("0,2,0", 1, 2) == 3);
  CHECK(seen("", 0, 0) == 9);
  CHECK(seen("5", 0, 0) == 9);
  // A UUID, whole or a prefix naming one device.
  unsigned char u2[16];
  fc::device_uuid(2, 0, u2);
  const std::string whole = fc::gpu_uuid_string(u2);
  CHECK(seen(whole.c_str(), 0, 1) == 3);
  CHECK(seen(whole.substr(0, 12).c_str(), 0, 1) == 3);
  CHECK(seen("GPU-", 0, 0) == 9);
}

TEST_CASE("fakecuda: UUID seed changes UUIDs") {
  auto first_bytes = [](const char* seed) {
    return run_child([=] {
      setenv("FAKECUDA_UUID_SEED", seed, 1);
      FC_REQ(cuInit(0) == CUDA_SUCCESS);
      CUuuid u;
      FC_REQ(cuDeviceGetUuid(&u, 0) == CUDA_SUCCESS);
      return static_cast<unsigned char>(u.bytes[0]) % 250 + 2;
    });
  };
  int a = first_bytes("1"), b = first_bytes("1"), c = first_bytes("2"), d = first_bytes("3");
  CHECK(a == b);
  CHECK((a != c || a != d));
}

TEST_CASE("fakecuda: primary and created contexts") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CHECK(run_child([] {
          FC_REQ(cuInit(0) == CUDA_SUCCESS);
          CUcontext cur = reinterpret_cast<CUcontext>(1);
          FC_REQ(cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == nullptr);
          CUdevice dev;
          FC_REQ(cuCtxGetDevice(&dev) == CUDA_ERROR_INVALID_CONTEXT);
          unsigned flags = 1;
          int active = 1;
          FC_REQ(cuDevicePrimaryCtxGetState(0, &flags, &active) == CUDA_SUCCESS && active == 0);
          FC_REQ(cuDevicePrimaryCtxSetFlags(0, CU_CTX_SCHED_BLOCKING_SYNC) == CUDA_SUCCESS);
          CUcontext p1, p2;
          FC_REQ(cuDevicePrimaryCtxRetain(&p1, 0) == CUDA_SUCCESS);
          FC_REQ(cuDevicePrimaryCtxRetain(&p2, 0) == CUDA_SUCCESS && p1 == p2);
          FC_REQ(cuDevicePrimaryCtxGetState(0, &flags, &active) == CUDA_SUCCESS && active == 1 &&
                 flags == CU_CTX_SCHED_BLOCKING_SYNC);
          FC_REQ(cuDevicePrimaryCtxRetain(&p1, 5) == CUDA_ERROR_INVALID_DEVICE);
          FC_REQ(cuDevicePrimaryCtxRetain(nullptr, 0) == CUDA_ERROR_INVALID_VALUE);
          FC_REQ(cuCtxSetCurrent(p1) == CUDA_SUCCESS);
          FC_REQ(cuCtxGetDevice(&dev) == CUDA_SUCCESS && dev == 0);
          FC_REQ(cuCtxSynchronize() == CUDA_SUCCESS);
          FC_REQ(cuCtxDestroy(p1) == CUDA_ERROR_INVALID_CONTEXT);  // primary: release, not destroy
          CUcontext c;
          FC_REQ(cuCtxCreate(&c, nullptr, 0, 0) == CUDA_SUCCESS);
          FC_REQ(cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == c);
          CUcontext popped;
          FC_REQ(cuCtxPopCurrent(&popped) == CUDA_SUCCESS && popped == c);
          FC_REQ(cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == p1);
          FC_REQ(cuCtxPushCurrent(c) == CUDA_SUCCESS);
          unsigned long long id1 = 0, id2 = 0;
          FC_REQ(cuCtxGetId(c, &id1) == CUDA_SUCCESS && cuCtxGetId(p1, &id2) == CUDA_SUCCESS &&
                 id1 != id2);
          FC_REQ(cuCtxDestroy(c) == CUDA_SUCCESS);
          FC_REQ(cuCtxDestroy(c) == CUDA_ERROR_INVALID_CONTEXT);
          FC_REQ(cuCtxPushCurrent(c) == CUDA_ERROR_INVALID_CONTEXT);
          FC_REQ(cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == p1);
          CUctxCreateParams params{};
          FC_REQ(cuCtxCreate_v4(&c, &params, 0, 0) == CUDA_SUCCESS);
          FC_REQ(cuCtxDestroy(c) == CUDA_SUCCESS);
          FC_REQ(cuCtxCreate(&c, nullptr, 0, 3) == CUDA_ERROR_INVALID_DEVICE);
          FC_REQ(cuDevicePrimaryCtxRelease(0) == CUDA_SUCCESS);
          FC_REQ(cuDevicePrimaryCtxRelease(0) == CUDA_SUCCESS);
          FC_REQ(cuDevicePrimaryCtxRelease(0) == CUDA_ERROR_INVALID_CONTEXT);
          FC_REQ(cuDevicePrimaryCtxReset(0) == CUDA_SUCCESS);
          return 0;
        }) == 0);
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static CUresult profiler_initialize() {
  return cuProfilerInitialize("cfg", "out", CU_OUT_CSV);
}
#pragma GCC diagnostic pop

TEST_CASE("fakecuda: cuProfilerStart/Stop need a current context") {
  CHECK(run_child([] {
          FC_REQ(cuProfilerStart() == CUDA_ERROR_NOT_INITIALIZED);
          FC_REQ(cuProfilerStop() == CUDA_ERROR_NOT_INITIALIZED);
          FC_REQ(cuInit(0) == CUDA_SUCCESS);
          // No context on this thread.
          FC_REQ(cuProfilerStart() == CUDA_ERROR_INVALID_CONTEXT);
          FC_REQ(cuProfilerStop() == CUDA_ERROR_INVALID_CONTEXT);
          // The primary context current: started and stopped, twice is no error.
          CUcontext p;
          FC_REQ(cuDevicePrimaryCtxRetain(&p, 0) == CUDA_SUCCESS);
          FC_REQ(cuCtxSetCurrent(p) == CUDA_SUCCESS);
          FC_REQ(cuProfilerStart() == CUDA_SUCCESS);
          FC_REQ(cuProfilerStart() == CUDA_SUCCESS);
          FC_REQ(cuProfilerStop() == CUDA_SUCCESS);
          FC_REQ(cuProfilerStop() == CUDA_SUCCESS);
          // A created context; once destroyed while current elsewhere, invalid.
          CUcontext c;
          FC_REQ(cuCtxCreate(&c, nullptr, 0, 0) == CUDA_SUCCESS);
          FC_REQ(cuProfilerStart() == CUDA_SUCCESS);
          FC_REQ(cuProfilerStop() == CUDA_SUCCESS);
          int rc = -1;
          std::thread([&] {
            rc = cuCtxSetCurrent(c) == CUDA_SUCCESS && cuCtxDestroy(c) == CUDA_SUCCESS ? 0 : 1;
          }).join();
          FC_REQ(rc == 0);
          // This thread's stack still has the destroyed context on top.
          FC_REQ(cuProfilerStart() == CUDA_ERROR_INVALID_CONTEXT);
          FC_REQ(cuProfilerStop() == CUDA_ERROR_INVALID_CONTEXT);
          FC_REQ(cuCtxPopCurrent(&c) == CUDA_SUCCESS);
          FC_REQ(cuProfilerStart() == CUDA_SUCCESS);  // the primary context again
          // Popping the primary context too leaves none.
          FC_REQ(cuCtxSetCurrent(nullptr) == CUDA_SUCCESS);
          FC_REQ(cuProfilerStop() == CUDA_ERROR_INVALID_CONTEXT);
          // The deprecated cuProfilerInitialize: NOT_SUPPORTED, as the CUDA 13 driver.
          FC_REQ(profiler_initialize() == CUDA_ERROR_NOT_SUPPORTED);
          // cuGetProcAddress resolves the profiler API to the exported functions.
          for (const char* n : {"cuProfilerInitialize", "cuProfilerStart", "cuProfilerStop"}) {
            void* fn = nullptr;
            CUdriverProcAddressQueryResult st{};
            FC_REQ(cuGetProcAddress(n, &fn, 13000, 0, &st) == CUDA_SUCCESS);
            FC_REQ(st == CU_GET_PROC_ADDRESS_SUCCESS && fn != nullptr);
            FC_REQ(fn == dlsym(RTLD_DEFAULT, n));
          }
          void* fn = nullptr;
          FC_REQ(cuGetProcAddress("cuProfilerStart", &fn, 3020, 0, nullptr) ==
                 CUDA_ERROR_NOT_FOUND);  // PFN_cuProfilerStart_v4000: since CUDA 4.0
          return 0;
        }) == 0);
}

TEST_CASE("fakecuda: streams, events and a no-op kernel") {
  REQUIRE(init_primary() == CUDA_SUCCESS);
  CUstream s;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CHECK(cuStreamQuery(s) == CUDA_SUCCESS);
  CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS);
  CHECK(cuStreamSynchronize(nullptr) == CUDA_SUCCESS);
  CHECK(cuStreamSynchronize(CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
  CUevent a, b;
  REQUIRE(cuEventCreate(&a, 0) == CUDA_SUCCESS);
  REQUIRE(cuEventCreate(&b, 0) == CUDA_SUCCESS);
  float ms = -1;
  CHECK(cuEventElapsedTime(&ms, a, b) == CUDA_ERROR_NOT_READY);
  CHECK(cuEventRecord(a, s) == CUDA_SUCCESS);
  CHECK(cuEventRecord(b, s) == CUDA_SUCCESS);
  CHECK(cuEventSynchronize(b) == CUDA_SUCCESS);
  CHECK(cuEventElapsedTime(&ms, a, b) == CUDA_SUCCESS);
  CHECK(ms >= 0);
  CUmodule m;
  const char image[] = "any image";
  REQUIRE(cuModuleLoadData(&m, image) == CUDA_SUCCESS);
  CUfunction f;
  REQUIRE(cuModuleGetFunction(&f, m, "kernel") == CUDA_SUCCESS);
  CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, nullptr, nullptr) == CUDA_SUCCESS);
  CHECK(cuModuleUnload(m) == CUDA_SUCCESS);
  CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, nullptr, nullptr) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuEventDestroy(a) == CUDA_SUCCESS);
  CHECK(cuEventDestroy(b) == CUDA_SUCCESS);
  CHECK(cuEventDestroy(b) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuStreamDestroy(s) == CUDA_SUCCESS);
  CHECK(cuStreamDestroy(s) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuStreamQuery(s) == CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE("fakecuda: fault injection by environment") {
  CHECK(run_child([] {
          setenv("FAKECUDA_FAIL", "cuMemAlloc:2:2,cuStreamCreate:1:999", 1);
          setenv("FAKECUDA_DELAY", "cuMemGetInfo:200", 1);
          FC_REQ(init_primary() == CUDA_SUCCESS);
          CUdeviceptr p;
          FC_REQ(cuMemAlloc(&p, 100) == CUDA_SUCCESS);
          FC_REQ(cuMemAlloc(&p, 100) == CUDA_ERROR_OUT_OF_MEMORY);
          FC_REQ(cuMemAlloc(&p, 100) == CUDA_SUCCESS);
          CUstream s;
          FC_REQ(cuStreamCreate(&s, 0) == static_cast<CUresult>(999));
          FC_REQ(cuStreamCreate(&s, 0) == CUDA_SUCCESS);
          auto t0 = std::chrono::steady_clock::now();
          size_t fr, tot;
          FC_REQ(cuMemGetInfo(&fr, &tot) == CUDA_SUCCESS);
          FC_REQ(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(190));
          return 0;
        }) == 0);
}

TEST_CASE("fakecuda: a fault file is taken once its line has ended, however long") {
  CHECK(run_child([] {
          char dir[] = "/tmp/fakecuda-fail-file.XXXXXX";
          FC_REQ(mkdtemp(dir) != nullptr);
          const std::string path = std::string(dir) + "/fail." + std::to_string(getpid());
          setenv("FAKECUDA_FAIL_FILE", (std::string(dir) + "/fail.%p").c_str(), 1);
          FC_REQ(init_primary() == CUDA_SUCCESS);
          // A writer caught between creating the file and ending its line:
          // the file is left for a later call, no fault armed.
          FILE* out = fopen(path.c_str(), "w");
          FC_REQ(out != nullptr);
          std::string spec = "cuMemAlloc:1:999,";
          for (int i = 0; i < 40; ++i) spec += "cuCtxSynchronize:1000:999,";
          spec += "cuMemAlloc:2:2";  // past the first 1000 bytes
          FC_REQ(spec.size() > 1000);
          fputs(spec.c_str(), out);
          fflush(out);
          CUdeviceptr p;
          FC_REQ(cuMemAlloc(&p, 100) == CUDA_SUCCESS);
          FC_REQ(access(path.c_str(), F_OK) == 0);
          fputs("\n", out);
          fclose(out);
          // The line ended: taken whole (its last item too), the file removed.
          FC_REQ(cuMemAlloc(&p, 100) == static_cast<CUresult>(999));
          FC_REQ(access(path.c_str(), F_OK) != 0);
          FC_REQ(cuMemAlloc(&p, 100) == CUDA_ERROR_OUT_OF_MEMORY);
          FC_REQ(cuMemAlloc(&p, 100) == CUDA_SUCCESS);
          rmdir(dir);
          return 0;
        }) == 0);
}

TEST_CASE("fakecuda: peer access between contexts of two devices") {
  CHECK(run_child([] {
          setenv("FAKECUDA_DEVICES", "2", 1);
          CUcontext c0, c1;
          FC_REQ(init_primary(&c0) == CUDA_SUCCESS);
          FC_REQ(cuDevicePrimaryCtxRetain(&c1, 1) == CUDA_SUCCESS);
          int can = 0;
          FC_REQ(cuDeviceCanAccessPeer(&can, 0, 1) == CUDA_SUCCESS && can == 1);
          FC_REQ(cuCtxEnablePeerAccess(c1, 0) == CUDA_SUCCESS);
          FC_REQ(cuCtxEnablePeerAccess(c1, 0) == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
          FC_REQ(cuCtxEnablePeerAccess(c0, 0) == CUDA_ERROR_INVALID_DEVICE);
          FC_REQ(cuCtxDisablePeerAccess(c1) == CUDA_SUCCESS);
          FC_REQ(cuCtxDisablePeerAccess(c1) == CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
          CUdeviceptr p;
          FC_REQ(cuMemAllocAsync(&p, 4096, nullptr) == CUDA_SUCCESS);
          FC_REQ(cuMemFreeAsync(p, nullptr) == CUDA_SUCCESS);
          return 0;
        }) == 0);
}
