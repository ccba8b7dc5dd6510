// The control socket: server thread (target side) and client (caller side).
#include "control.h"
#include "gate.h"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <new>
#include <thread>

namespace fc {

namespace {

std::mutex g_server_mu;
int g_listen_fd = -1;
std::atomic<int> g_server_tid{0};

socklen_t ctl_address(int pid, sockaddr_un* addr) {
  memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  int n = snprintf(addr->sun_path + 1, sizeof addr->sun_path - 1, "fakecuda-ctl.%d", pid);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

bool read_full(int fd, void* buf, size_t n) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t r = recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool write_full(int fd, const void* buf, size_t n) {
  auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool peer_allowed(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  return cred.uid == 0 || cred.uid == geteuid();
}

void serve_one(int conn) {
  timeval tv{10, 0};
  setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  CtlRequest req{};
  if (!peer_allowed(conn) || !read_full(conn, &req, sizeof req) || req.magic != kCtlMagic) return;
  int fd_send = -1;
  CtlReply reply = ctl_handle(req, &fd_send);
  reply.magic = kCtlMagic;
  msghdr msg{};
  iovec iov{&reply, sizeof reply};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int))] = {};
  if (fd_send >= 0) {
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof cbuf;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd_send, sizeof(int));
  }
  while (sendmsg(conn, &msg, MSG_NOSIGNAL) < 0 && errno == EINTR) {
  }
  if (fd_send >= 0) close(fd_send);
}

void server_loop(int lfd, std::promise<void>* started) {
  g_server_tid = static_cast<int>(syscall(SYS_gettid));
  started->set_value();
  for (;;) {
    int conn = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EBADF || errno == EINVAL) return;
      continue;
    }
    serve_one(conn);
    close(conn);
  }
}

}  // namespace

int control_thread_id() {
  return g_server_tid.load();
}

CUresult start_control_server() {
  std::lock_guard<std::mutex> l(g_server_mu);
  if (g_listen_fd >= 0) return CUDA_SUCCESS;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OPERATING_SYSTEM;
  sockaddr_un addr;
  socklen_t len = ctl_address(getpid(), &addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, 64) != 0) {
    close(fd);
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  g_listen_fd = fd;
  // Return only once the thread runs its loop: a fork during thread start-up
  // could copy allocator locks held by the starting thread into the child.
  auto started = std::make_shared<std::promise<void>>();  // owned by the thread too
  std::future<void> running = started->get_future();
  std::thread([fd, started] { server_loop(fd, started.get()); }).detach();
  running.wait();
  return CUDA_SUCCESS;
}

void control_server_after_fork() {
  // The server thread did not survive fork; the listening socket is the
  // parent's name, not ours.
  if (g_listen_fd >= 0) close(g_listen_fd);
  g_listen_fd = -1;
  g_server_tid = 0;
  new (&g_server_mu) std::mutex;
}

CUresult ctl_call(int pid, const CtlRequest& req, CtlReply* reply, int* fd_out) {
  if (fd_out) *fd_out = -1;
  if (pid <= 0) return CUDA_ERROR_INVALID_VALUE;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OPERATING_SYSTEM;
  sockaddr_un addr;
  socklen_t len = ctl_address(pid, &addr);
  int rc;
  do {
    rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), len);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    close(fd);
    // Measured on an H200 (docs/gpu-runs/state-and-lock-h200.log): a process
    // that never called cuInit (libcuda loaded or not) is answered
    // NOT_INITIALIZED by GetState and Lock alike.
    return ::kill(pid, 0) == 0 || errno == EPERM ? CUDA_ERROR_NOT_INITIALIZED
                                                 : CUDA_ERROR_INVALID_VALUE;
  }
  if (!write_full(fd, &req, sizeof req)) {
    close(fd);
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  msghdr msg{};
  iovec iov{reply, sizeof *reply};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = cbuf;
  msg.msg_controllen = sizeof cbuf;
  ssize_t n;
  do {
    n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
  } while (n < 0 && errno == EINTR);
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); n > 0 && c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      int got;
      memcpy(&got, CMSG_DATA(c), sizeof got);
      if (fd_out && *fd_out < 0)
        *fd_out = got;
      else
        close(got);
    }
  }
  // Read until EOF: the server has closed its end before we return.
  char tail;
  for (;;) {
    ssize_t t = recv(fd, &tail, 1, 0);
    if (t > 0 || (t < 0 && errno == EINTR)) continue;
    break;
  }
  close(fd);
  if (n != static_cast<ssize_t>(sizeof *reply) || reply->magic != kCtlMagic) {
    if (fd_out && *fd_out >= 0) {
      close(*fd_out);
      *fd_out = -1;
    }
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  return CUDA_SUCCESS;
}

}  // namespace fc
