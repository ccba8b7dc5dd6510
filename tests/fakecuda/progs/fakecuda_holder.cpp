// A process holding simulated device memory with a known pattern: one
// cuMemAlloc buffer and one VMM mapping. It prints "ready <pid>", then once
// per 100 ms verifies both buffers (through the driver and by reading the
// device addresses directly) and prints "tick <n> ok". Any mismatch prints
// "CORRUPT" and exits 1. Usage: fakecuda_holder [MiB] [ticks, 0 = forever]
// [device]; each buffer is MiB (the VMM one rounded up to the granularity), on
// that device (0).
#include <cuda.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

#define CHECK(call)                                           \
  do {                                                        \
    CUresult r_ = (call);                                     \
    if (r_ != CUDA_SUCCESS) {                                 \
      printf("error %s = %d\n", #call, static_cast<int>(r_)); \
      fflush(stdout);                                         \
      exit(2);                                                \
    }                                                         \
  } while (0)

unsigned char pattern(size_t i, unsigned salt) {
  return static_cast<unsigned char>((i * 131 + salt) & 0xff);
}

bool verify(const unsigned char* p, size_t n, unsigned salt) {
  for (size_t i = 0; i < n; i += 4093)
    if (p[i] != pattern(i, salt)) return false;
  return p[n - 1] == pattern(n - 1, salt);
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = argc > 1 ? strtoull(argv[1], nullptr, 10) : 8;
  long ticks = argc > 2 ? strtol(argv[2], nullptr, 10) : 0;
  int ordinal = argc > 3 ? atoi(argv[3]) : 0;
  size_t n = mib << 20;
  CHECK(cuInit(0));
  CUdevice dev;
  CUcontext ctx;
  CHECK(cuDeviceGet(&dev, ordinal));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));

  std::vector<unsigned char> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = pattern(i, 7);
  CUdeviceptr plain;
  CHECK(cuMemAlloc(&plain, n));
  CHECK(cuMemcpyHtoD(plain, host.data(), n));

  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran = 0;
  CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  size_t vn = (n + gran - 1) / gran * gran;
  CUmemGenericAllocationHandle h;
  CUdeviceptr vmm;
  CHECK(cuMemCreate(&h, vn, &prop, 0));
  CHECK(cuMemAddressReserve(&vmm, vn, 0, 0, 0));
  CHECK(cuMemMap(vmm, vn, 0, h, 0));
  CUmemAccessDesc acc{};
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK(cuMemSetAccess(vmm, vn, &acc, 1));
  auto* vp = reinterpret_cast<unsigned char*>(vmm);
  for (size_t i = 0; i < vn; ++i) vp[i] = pattern(i, 11);

  printf("ready %d\n", static_cast<int>(getpid()));
  fflush(stdout);
  std::vector<unsigned char> back(n);
  for (long t = 1; ticks == 0 || t <= ticks; ++t) {
    usleep(100 * 1000);
    CHECK(cuMemcpyDtoH(back.data(), plain, n));  // waits at the gate while locked
    bool ok = verify(back.data(), n, 7) && verify(reinterpret_cast<unsigned char*>(plain), n, 7) &&
              verify(vp, vn, 11);
    if (!ok) {
      printf("CORRUPT at tick %ld\n", t);
      fflush(stdout);
      return 1;
    }
    printf("tick %ld ok\n", t);
    fflush(stdout);
  }
  CHECK(cuMemUnmap(vmm, vn));
  CHECK(cuMemRelease(h));
  CHECK(cuMemAddressFree(vmm, vn));
  CHECK(cuMemFree(plain));
  printf("done\n");
  return 0;
}
