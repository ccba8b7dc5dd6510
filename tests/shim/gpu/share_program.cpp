// Two real processes share device memory through the shim (scripts/gpu-test-share.sh):
// a POSIX-fd VMM allocation exported as a ticket and a cuMemAlloc block shared
// through legacy IPC; each side reads the other's writes. No multicast call.
// Exit 0: shared both ways; 1: a failure (printed). Prints whether the
// exported descriptor was a ticket (the shim tracking) or the driver's.
#include <cuda.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <vector>

#define CK(x)                                                                                     \
  do {                                                                                            \
    CUresult r_ = (x);                                                                            \
    if (r_ != CUDA_SUCCESS) {                                                                     \
      const char* s_ = nullptr;                                                                   \
      cuGetErrorName(r_, &s_);                                                                    \
      fprintf(stderr, "[%d] %s:%d: %s = %d %s\n", (int)getpid(), __FILE__, __LINE__, #x, (int)r_, \
              s_ ? s_ : "");                                                                      \
      return 1;                                                                                   \
    }                                                                                             \
  } while (0)
#define REQ(c)                                                                            \
  do {                                                                                    \
    if (!(c)) {                                                                           \
      fprintf(stderr, "[%d] %s:%d: failed: %s\n", (int)getpid(), __FILE__, __LINE__, #c); \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)

namespace {

bool send_all(int s, const void* p, size_t n, int fd = -1) {
  iovec iov{const_cast<void*>(p), n};
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  if (fd >= 0) {
    m.msg_control = ctl;
    m.msg_controllen = sizeof(ctl);
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  return sendmsg(s, &m, MSG_NOSIGNAL) == (ssize_t)n;
}

bool recv_all(int s, void* p, size_t n, int* fd = nullptr) {
  iovec iov{p, n};
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctl;
  m.msg_controllen = sizeof(ctl);
  if (recvmsg(s, &m, MSG_WAITALL | MSG_CMSG_CLOEXEC) != (ssize_t)n) return false;
  if (fd) {
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    if (!c || c->cmsg_type != SCM_RIGHTS) return false;
    memcpy(fd, CMSG_DATA(c), sizeof(int));
  }
  return true;
}

int init(CUdevice* dev) {
  CK(cuInit(0));
  CK(cuDeviceGet(dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, *dev));
  CK(cuCtxSetCurrent(ctx));
  return 0;
}

bool is_ticket(int fd) {
  char path[64], target[256] = {};
  snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, target, sizeof(target) - 1);
  return n > 0 && strstr(target, "cusnap-ticket") != nullptr;
}

bool check(CUdeviceptr p, size_t n, unsigned char v) {
  std::vector<unsigned char> host(n);
  if (cuMemcpyDtoH(host.data(), p, n) != CUDA_SUCCESS) return false;
  for (unsigned char b : host)
    if (b != v) return false;
  return true;
}

constexpr size_t kIpcBytes = 3u << 20;

int child(int s) {
  CUdevice dev;
  if (init(&dev)) return 1;
  // 1. POSIX-fd VMM allocation from the parent.
  size_t size = 0;
  int fd = -1;
  REQ(recv_all(s, &size, sizeof(size), &fd));
  printf("child: received descriptor is %s\n", is_ticket(fd) ? "a cusnap ticket" : "the driver's");
  CUmemGenericAllocationHandle h;
  CK(cuMemImportFromShareableHandle(&h, (void*)(intptr_t)fd,
                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(fd);
  CUdeviceptr va;
  CK(cuMemAddressReserve(&va, size, 0, 0, 0));
  CK(cuMemMap(va, size, 0, h, 0));
  CUmemAccessDesc d{};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = dev;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CK(cuMemSetAccess(va, size, &d, 1));
  REQ(check(va, size, 0xA1));
  CK(cuMemsetD8(va, 0xB2, size));
  CK(cuCtxSynchronize());
  // 2. Legacy IPC.
  CUipcMemHandle ih;
  REQ(recv_all(s, &ih, sizeof(ih)));
  CUdeviceptr p1, p2;
  CK(cuIpcOpenMemHandle(&p1, ih, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  CK(cuIpcOpenMemHandle(&p2, ih, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  printf("child: repeated IPC opens %s\n", p1 == p2 ? "return the same address" : "differ");
  REQ(p1 == p2);
  REQ(check(p1, kIpcBytes, 0xC3));
  CK(cuMemsetD8(p1, 0xD4, kIpcBytes));
  CK(cuCtxSynchronize());
  char ok = 1;
  REQ(send_all(s, &ok, 1));
  REQ(recv_all(s, &ok, 1));
  CK(cuIpcCloseMemHandle(p1));
  CK(cuIpcCloseMemHandle(p2));
  CK(cuMemUnmap(va, size));
  CK(cuMemRelease(h));
  CK(cuMemAddressFree(va, size));
  return 0;
}

int parent(int s, pid_t kid) {
  CUdevice dev;
  if (init(&dev)) return 1;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran = 0;
  CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  size_t size = 4 * gran;
  CUmemGenericAllocationHandle h;
  CK(cuMemCreate(&h, size, &prop, 0));
  CUdeviceptr va;
  CK(cuMemAddressReserve(&va, size, 0, 0, 0));
  CK(cuMemMap(va, size, 0, h, 0));
  CUmemAccessDesc d{};
  d.location = prop.location;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CK(cuMemSetAccess(va, size, &d, 1));
  CK(cuMemsetD8(va, 0xA1, size));
  CK(cuCtxSynchronize());
  int fd = -1;
  CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  printf("parent: exported descriptor is %s\n", is_ticket(fd) ? "a cusnap ticket" : "the driver's");
  REQ(send_all(s, &size, sizeof(size), fd));
  close(fd);
  CUdeviceptr legacy;
  CK(cuMemAlloc(&legacy, kIpcBytes));
  CK(cuMemsetD8(legacy, 0xC3, kIpcBytes));
  CK(cuCtxSynchronize());
  CUipcMemHandle ih;
  CK(cuIpcGetMemHandle(&ih, legacy));
  REQ(send_all(s, &ih, sizeof(ih)));
  char ok = 0;
  REQ(recv_all(s, &ok, 1) && ok == 1);
  REQ(check(va, size, 0xB2));
  REQ(check(legacy, kIpcBytes, 0xD4));
  printf("parent: read the child's writes through both shares\n");
  REQ(send_all(s, &ok, 1));
  int status = 0;
  waitpid(kid, &status, 0);
  REQ(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CK(cuMemFree(legacy));
  CK(cuMemUnmap(va, size));
  CK(cuMemRelease(h));
  CK(cuMemAddressFree(va, size));
  printf("share: ok\n");
  return 0;
}

}  // namespace

int main() {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 1;
  fflush(nullptr);
  pid_t kid = fork();  // before any CUDA call: each process initialises its own
  if (kid == 0) {
    close(sv[0]);
    _exit(child(sv[1]));
  }
  close(sv[1]);
  int rc = parent(sv[0], kid);
  if (rc != 0) kill(kid, SIGKILL);
  return rc;
}
