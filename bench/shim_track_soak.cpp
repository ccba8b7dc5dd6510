// Soak of the shim's tracking: N cycles of create / export / import / map /
// unmap / release between two processes, with memory (RSS of both) and time
// per cycle printed at intervals; the run fails when either grows (docs/benchmarks.md).
//
// Run under the preloaded shim with $CUSNAP_RUNTIME_DIR set (bench/CMakeLists.txt
// does), against the simulated or the real driver:
//   shim_track_soak [--cycles N] [--intervals K] [--max-rss-growth-kib KIB] [--max-slowdown X]
// The parent is the creator; a forked child imports each allocation through
// the creator's peer socket (a real ticket exchange every cycle).
#include <cuda.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

long rss_kib(pid_t pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/statm", (int)pid);
  FILE* f = fopen(path, "r");
  if (!f) return -1;
  long size = 0, res = 0;
  if (fscanf(f, "%ld %ld", &size, &res) != 2) res = -1;
  fclose(f);
  return res < 0 ? -1 : res * (sysconf(_SC_PAGESIZE) / 1024);
}

bool send_fd(int sock, int fd) {
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctl;
  m.msg_controllen = sizeof(ctl);
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof(int));
  return sendmsg(sock, &m, MSG_NOSIGNAL) == 1;
}

int recv_fd(int sock) {
  char byte;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctl;
  m.msg_controllen = sizeof(ctl);
  if (recvmsg(sock, &m, MSG_CMSG_CLOEXEC) != 1) return -1;
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  if (!c || c->cmsg_type != SCM_RIGHTS) return -1;
  int fd;
  memcpy(&fd, CMSG_DATA(c), sizeof(int));
  return fd;
}

#define CK(x)                                                               \
  do {                                                                      \
    CUresult r_ = (x);                                                      \
    if (r_ != CUDA_SUCCESS) {                                               \
      fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #x, (int)r_); \
      return 1;                                                             \
    }                                                                       \
  } while (0)

int init() {
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  return 0;
}

CUmemAllocationProp prop() {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = 0;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

/// The importer: per ticket, import, map at its reservation, set access,
/// touch, unmap, release; then acknowledge.
int importer(int sock, size_t size) {
  if (init()) return 1;
  CUdeviceptr va;
  CK(cuMemAddressReserve(&va, size, 0, 0, 0));
  CUmemAccessDesc d{};
  d.location = prop().location;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (;;) {
    int t = recv_fd(sock);
    if (t < 0) break;
    CUmemGenericAllocationHandle h;
    CK(cuMemImportFromShareableHandle(&h, (void*)(intptr_t)t,
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(t);
    CK(cuMemMap(va, size, 0, h, 0));
    CK(cuMemSetAccess(va, size, &d, 1));
    CK(cuMemUnmap(va, size));
    CK(cuMemRelease(h));
    char ack = 1;
    if (write(sock, &ack, 1) != 1) return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  long cycles = 1000000, intervals = 10;
  long max_growth_kib = 16384;
  double max_slowdown = 3.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--cycles")
      cycles = atol(argv[i + 1]);
    else if (a == "--intervals")
      intervals = atol(argv[i + 1]);
    else if (a == "--max-rss-growth-kib")
      max_growth_kib = atol(argv[i + 1]);
    else if (a == "--max-slowdown")
      max_slowdown = atof(argv[i + 1]);
    else {
      fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (!getenv("CUSNAP_RUNTIME_DIR")) {
    fprintf(stderr, "shim_track_soak: set CUSNAP_RUNTIME_DIR and preload the shim\n");
    return 2;
  }
  size_t gran = 2u << 20;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 1;
  fflush(nullptr);
  pid_t kid = fork();
  if (kid == 0) {
    close(sv[0]);
    _exit(importer(sv[1], gran));
  }
  close(sv[1]);
  if (init()) return 1;
  CUmemAllocationProp p = prop();
  CUdeviceptr va;
  CK(cuMemAddressReserve(&va, gran, 0, 0, 0));
  CUmemAccessDesc d{};
  d.location = p.location;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const long every = cycles / intervals > 0 ? cycles / intervals : 1;
  printf(
      "shim_track_soak: %ld cycles (create, map, set access, export, import in a second "
      "process through the peer socket, map, unmap, release on both sides)\n",
      cycles);
  printf("%10s %12s %14s %14s\n", "cycles", "ns/cycle", "creator KiB", "importer KiB");
  std::vector<double> ns;
  std::vector<long> rss_c, rss_i;
  auto t0 = std::chrono::steady_clock::now();
  for (long i = 1; i <= cycles; ++i) {
    CUmemGenericAllocationHandle h;
    CK(cuMemCreate(&h, gran, &p, 0));
    CK(cuMemMap(va, gran, 0, h, 0));
    CK(cuMemSetAccess(va, gran, &d, 1));
    int t = -1;
    CK(cuMemExportToShareableHandle(&t, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    if (!send_fd(sv[0], t)) return 1;
    close(t);
    char ack;
    if (read(sv[0], &ack, 1) != 1) {
      fprintf(stderr, "the importer stopped\n");
      return 1;
    }
    CK(cuMemUnmap(va, gran));
    CK(cuMemRelease(h));
    if (i % every == 0) {
      auto t1 = std::chrono::steady_clock::now();
      double per = std::chrono::duration<double, std::nano>(t1 - t0).count() / every;
      t0 = t1;
      ns.push_back(per);
      rss_c.push_back(rss_kib(getpid()));
      rss_i.push_back(rss_kib(kid));
      printf("%10ld %12.0f %14ld %14ld\n", i, per, rss_c.back(), rss_i.back());
      fflush(stdout);
    }
  }
  close(sv[0]);
  int status = 0;
  waitpid(kid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "the importer failed\n");
    return 1;
  }
  if (ns.size() < 3) return 0;
  // Flat: from the second interval on (the first warms the tables and the heap).
  long growth = std::max(rss_c.back() - rss_c[1], rss_i.back() - rss_i[1]);
  double slowdown = ns.back() / ns[1];
  printf(
      "RSS growth after the first interval: %ld KiB (limit %ld); last/second interval time: "
      "%.2f (limit %.1f)\n",
      growth, max_growth_kib, slowdown, max_slowdown);
  if (growth > max_growth_kib || slowdown > max_slowdown) {
    printf("NOT FLAT\n");
    return 1;
  }
  printf("flat\n");
  return 0;
}
