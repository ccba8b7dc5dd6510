// cusnap-share-job: two processes sharing one device allocation, the case the
// driver's process checkpoint cannot restore (cusnap refuses it without the
// shim).
//
//   cusnap-share-job [--mib N] [--interval-ms M]
//
// Forks first (before any driver call). The parent creates an exportable VMM
// allocation (cuMemCreate, POSIX file descriptor handle), writes a pattern,
// and passes the exported descriptor to the child over a Unix socket; the
// child imports and maps it. Both then read the shared bytes in a loop and
// print "count N ok" (the child: "importer count N ok"). Exit status 2 when a
// driver call fails, 3 when a byte is wrong.
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "workload_util.h"

namespace {

void send_fd(int sock, int fd) {
  char byte = 'f';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctrl;
  msg.msg_controllen = sizeof ctrl;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  if (sendmsg(sock, &msg, 0) != 1) std::perror("cusnap-share-job: sendmsg");
}

int recv_fd(int sock) {
  char byte;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctrl;
  msg.msg_controllen = sizeof ctrl;
  if (recvmsg(sock, &msg, MSG_CMSG_CLOEXEC) != 1) return -1;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (!c || c->cmsg_type != SCM_RIGHTS) return -1;
  int fd;
  std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

inline uint8_t pattern(size_t i) {
  return uint8_t(i * 131 + 17);
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 4;
  long interval_ms = 100;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--mib")
      mib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--interval-ms")
      interval_ms = std::strtol(argv[i + 1], nullptr, 10);
  }
  setvbuf(stdout, nullptr, _IOLBF, 0);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 2;
  pid_t child = fork();
  bool importer = child == 0;
  const char* who = importer ? "cusnap-share-job importer" : "cusnap-share-job";
  CUdevice dev = workload::init_device(who);

  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran = 0;
  WL_CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), who);
  size_t size = ((mib << 20) + gran - 1) / gran * gran;
  CUmemGenericAllocationHandle h;
  if (importer) {
    int fd = recv_fd(sv[1]);
    if (fd < 0) {
      std::fprintf(stderr, "%s: no descriptor from the exporter\n", who);
      return 2;
    }
    WL_CHECK(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(intptr_t(fd)),
                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
             who);
    close(fd);
  } else {
    WL_CHECK(cuMemCreate(&h, size, &prop, 0), who);
  }
  CUdeviceptr ptr;
  WL_CHECK(cuMemAddressReserve(&ptr, size, 0, 0, 0), who);
  WL_CHECK(cuMemMap(ptr, size, 0, h, 0), who);
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  WL_CHECK(cuMemSetAccess(ptr, size, &access, 1), who);
  std::vector<uint8_t> buf(size);
  if (!importer) {
    for (size_t i = 0; i < size; ++i) buf[i] = pattern(i);
    WL_CHECK(cuMemcpyHtoD(ptr, buf.data(), size), who);
    int fd = -1;
    WL_CHECK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
             who);
    send_fd(sv[0], fd);
    close(fd);
  }
  std::printf("%sready pid %d\n", importer ? "importer " : "", int(getpid()));
  for (long count = 1;; ++count) {
    WL_CHECK(cuMemcpyDtoH(buf.data(), ptr, size), who);
    for (size_t i = 0; i < size; ++i)
      if (buf[i] != pattern(i)) {
        std::fprintf(stderr, "%s: shared byte %zu is 0x%02x, expected 0x%02x\n", who, i, buf[i],
                     pattern(i));
        return 3;
      }
    std::printf("%scount %ld ok\n", importer ? "importer " : "", count);
    if (!importer && waitpid(child, nullptr, WNOHANG) == child) return 4;
    usleep(useconds_t(interval_ms * 1000));
  }
}
