#include "fakecuda_test_util.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

namespace fctest {

namespace {
// The tests fork their processes (targets, coordinators, peers) from this
// one, which has called cuInit; the real driver refuses cuInit in such a
// child, so they ask the simulated one to allow it. "fakecuda: a child forked
// after cuInit" checks the rule itself with the variable unset.
[[maybe_unused]] const int kForkReinit = setenv("FAKECUDA_FORK_REINIT", "1", 0);
}  // namespace

CUresult init_primary(CUcontext* out) {
  CUresult r = cuInit(0);
  if (r != CUDA_SUCCESS) return r;
  CUcontext ctx;
  if ((r = cuDevicePrimaryCtxRetain(&ctx, 0)) != CUDA_SUCCESS) return r;
  if ((r = cuCtxSetCurrent(ctx)) != CUDA_SUCCESS) return r;
  if (out) *out = ctx;
  return CUDA_SUCCESS;
}

int run_child(const std::function<int()>& fn) {
  fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) _exit(fn());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

Child spawn(const std::function<int(int)>& fn) {
  int sv[2];
  Child c;
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return c;
  fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    close(sv[0]);
    _exit(fn(sv[1]));
  }
  close(sv[1]);
  c.pid = pid;
  c.sock = sv[0];
  return c;
}

int Child::join() {
  if (sock >= 0) close(sock);
  sock = -1;
  if (pid > 0 && waitpid(pid, &status, 0) != pid) status = 127 << 8;
  pid = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void Child::kill() {
  if (pid <= 0) return;
  ::kill(pid, SIGKILL);
  join();
}

CUresult driver_cycle(pid_t pid, unsigned timeout_ms) {
  CUcheckpointLockArgs la{};
  la.timeoutMs = timeout_ms;
  if (CUresult r = cuCheckpointProcessLock(pid, &la)) return r;
  if (CUresult r = cuCheckpointProcessCheckpoint(pid, nullptr)) return r;
  if (CUresult r = cuCheckpointProcessRestore(pid, nullptr)) return r;
  return cuCheckpointProcessUnlock(pid, nullptr);
}

bool send_u64(int sock, uint64_t v) {
  return send(sock, &v, sizeof v, MSG_NOSIGNAL) == sizeof v;
}

bool recv_u64(int sock, uint64_t* v) {
  return recv(sock, v, sizeof *v, MSG_WAITALL) == sizeof *v;
}

bool send_fd(int sock, int fd) {
  char byte = 'F';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char buf[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = buf;
  msg.msg_controllen = sizeof buf;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof fd);
  return sendmsg(sock, &msg, MSG_NOSIGNAL) == 1;
}

int recv_fd(int sock) {
  char byte;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char buf[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = buf;
  msg.msg_controllen = sizeof buf;
  if (recvmsg(sock, &msg, MSG_CMSG_CLOEXEC) != 1) return -1;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (!c || c->cmsg_type != SCM_RIGHTS) return -1;
  int fd;
  memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

CUresult vmm_map_handle(CUmemGenericAllocationHandle h, size_t size, CUdeviceptr* ptr) {
  CUresult r = cuMemAddressReserve(ptr, size, 0, 0, 0);
  if (r != CUDA_SUCCESS) return r;
  if ((r = cuMemMap(*ptr, size, 0, h, 0)) != CUDA_SUCCESS) return r;
  CUmemAccessDesc acc{};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = 0;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return cuMemSetAccess(*ptr, size, &acc, 1);
}

CUresult vmm_create(size_t size, VmmBuffer* out) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUresult r = cuMemCreate(&out->handle, size, &prop, 0);
  if (r != CUDA_SUCCESS) return r;
  out->size = size;
  return vmm_map_handle(out->handle, size, &out->ptr);
}

CUresult vmm_destroy(const VmmBuffer& b) {
  CUresult r = cuMemUnmap(b.ptr, b.size);
  if (r == CUDA_SUCCESS) r = cuMemAddressFree(b.ptr, b.size);
  if (r == CUDA_SUCCESS) r = cuMemRelease(b.handle);
  return r;
}

}  // namespace fctest
