// Two processes sharing a POSIX-fd VMM allocation, for the CRIU tests.
//   fakecuda_share export MiB
//     creates an allocation filled with a pattern, exports it, prints
//     "export <pid> <fd>" and then "tick <n> <byte>" every 100 ms, where byte
//     is the allocation's byte 1 (the importer writes it). SIGUSR1: export a
//     fresh descriptor (after a driver restore the old one names released
//     memory) and print "export <pid> <fd>" again.
//   fakecuda_share import PID FD MiB
//     takes descriptor FD from process PID (pidfd_getfd), imports and maps it,
//     checks the pattern, prints "imported". SIGUSR1: unmap and release the
//     import, keeping the address reservation ("released"). SIGUSR2: take a
//     fresh descriptor (the PID and FD in the file ./reimport), import and map
//     it at the same address, check the
//     pattern, write byte 1 = 0x42 ("reimported ok"). Prints "tick <n>" every
//     100 ms. Any mismatch prints "CORRUPT" and exits 1.
#include <cuda.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

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

volatile sig_atomic_t g_release = 0;
volatile sig_atomic_t g_reimport = 0;

unsigned char pattern(size_t i) {
  return static_cast<unsigned char>((i * 37 + 5) & 0xff);
}

bool verify(const unsigned char* p, size_t n) {
  for (size_t i = 2; i < n; i += 4099)
    if (p[i] != pattern(i)) return false;
  return p[n - 1] == pattern(n - 1);
}

void say(const char* fmt, long a = 0, long b = 0) {
  printf(fmt, a, b);
  fflush(stdout);
}

CUmemAccessDesc rw() {
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = 0;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return a;
}

void init() {
  CHECK(cuInit(0));
  CUcontext ctx;
  CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
  CHECK(cuCtxSetCurrent(ctx));
}

int run_export(size_t mib) {
  init();
  size_t n = mib << 20;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle h;
  CHECK(cuMemCreate(&h, n, &prop, 0));
  CUdeviceptr va;
  CHECK(cuMemAddressReserve(&va, n, 0, 0, 0));
  CHECK(cuMemMap(va, n, 0, h, 0));
  CUmemAccessDesc acc = rw();
  CHECK(cuMemSetAccess(va, n, &acc, 1));
  auto* p = reinterpret_cast<unsigned char*>(va);
  for (size_t i = 0; i < n; ++i) p[i] = pattern(i);
  int fd = -1;
  CHECK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  say("export %ld %ld\n", getpid(), fd);
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_release = 1; };
  sigaction(SIGUSR1, &sa, nullptr);
  for (long t = 1;; ++t) {
    usleep(100 * 1000);
    if (g_release) {
      g_release = 0;
      close(fd);
      CHECK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
      say("export %ld %ld\n", getpid(), fd);
    }
    unsigned char b = 0;
    CHECK(cuMemcpyDtoH(&b, va + 1, 1));
    if (!verify(p, n)) {
      say("CORRUPT\n");
      return 1;
    }
    say("tick %ld %ld\n", t, b);
  }
}

int take_fd(int pid, int fd) {
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return -1;
  int got = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, fd, 0));
  close(pidfd);
  return got;
}

CUmemGenericAllocationHandle import_at(int pid, int fd, CUdeviceptr va, size_t size) {
  int mine = take_fd(pid, fd);
  if (mine < 0) {
    say("error pidfd_getfd\n");
    exit(2);
  }
  CUmemGenericAllocationHandle h;
  CHECK(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(mine)),
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(mine);
  CHECK(cuMemMap(va, size, 0, h, 0));
  CUmemAccessDesc acc = rw();
  CHECK(cuMemSetAccess(va, size, &acc, 1));
  return h;
}

int run_import(int pid, int fd, size_t size) {
  init();
  struct sigaction sa {};
  sa.sa_handler = [](int s) { (s == SIGUSR1 ? g_release : g_reimport) = 1; };
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGUSR2, &sa, nullptr);
  CUdeviceptr va;
  CHECK(cuMemAddressReserve(&va, size, 0, 0, 0));
  CUmemGenericAllocationHandle h = import_at(pid, fd, va, size);
  auto* p = reinterpret_cast<unsigned char*>(va);
  if (!verify(p, size)) {
    say("CORRUPT\n");
    return 1;
  }
  say("imported\n");
  bool mapped = true;
  for (long t = 1;; ++t) {
    usleep(100 * 1000);
    if (g_release && mapped) {
      g_release = 0;
      CHECK(cuMemUnmap(va, size));
      CHECK(cuMemRelease(h));
      mapped = false;
      say("released\n");
    }
    if (g_reimport && !mapped) {
      g_reimport = 0;
      FILE* f = fopen("reimport", "r");
      if (!f || fscanf(f, "%d %d", &pid, &fd) != 2) {
        say("error reading ./reimport\n");
        return 2;
      }
      fclose(f);
      h = import_at(pid, fd, va, size);
      mapped = true;
      if (!verify(p, size)) {
        say("CORRUPT\n");
        return 1;
      }
      unsigned char mark = 0x42;
      CHECK(cuMemcpyHtoD(va + 1, &mark, 1));
      say("reimported ok\n");
    }
    int n = 0;
    CHECK(cuDeviceGetCount(&n));  // waits at the gate while locked
    say("tick %ld\n", t);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && !strcmp(argv[1], "export")) return run_export(strtoull(argv[2], nullptr, 10));
  if (argc >= 5 && !strcmp(argv[1], "import"))
    return run_import(atoi(argv[2]), atoi(argv[3]), strtoull(argv[4], nullptr, 10) << 20);
  fprintf(stderr, "usage: %s export MiB | import PID FD MiB\n", argv[0]);
  return 2;
}
