// libFuzzer harness for the wire format (src/proto): the body decoder, the
// control messages' conversions and validation, and the framing of a
// Channel receiving from a real socket, descriptors attached.
//
// The first input byte picks the path:
//   bit 0 = 1   decode_body(rest), then every control message type
//   bit 0 = 0   rest is written to one end of a socket pair in two chunks
//               (where byte 1 says), each carrying 0-3 descriptors
//               (bits 1-2, 3-4) through SCM_RIGHTS; the other end is read
//               with Channel::recv until it fails.
// Besides crashes, leaks and hangs it checks that no descriptor outlives a
// message: the process has as many open descriptors after each input as
// before it.
#include <dirent.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "proto/control.h"
#include "proto/wire.h"

namespace {

using namespace cusnap;

int open_fd_count() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n - 1;  // the directory's own descriptor
}

template <class T>
void try_as(const proto::Message& m) {
  T v;
  std::string err;
  (void)m.get(&v, &err);
}

void exercise(const proto::Message& m) {
  std::string err;
  proto::CheckpointRequest c;
  if (m.get(&c, &err)) (void)proto::validate(c, &err);
  proto::TimeoutRequest t;
  if (m.get(&t, &err)) (void)proto::validate(t, &err);
  try_as<proto::Empty>(m);
  try_as<proto::JobStatus>(m);
  try_as<proto::ProgressEvent>(m);
  try_as<proto::Result>(m);
}

bool send_chunk(int fd, const uint8_t* p, size_t n, int ndesc, int passed) {
  iovec iov{const_cast<uint8_t*>(p), n};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 3)];
  if (ndesc > 0) {
    std::memset(control, 0, sizeof control);
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * ndesc);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * ndesc);
    for (int i = 0; i < ndesc; ++i)
      std::memcpy(CMSG_DATA(c) + i * sizeof(int), &passed, sizeof(int));
  }
  return sendmsg(fd, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(n);
}

/// The descriptor that messages carry; open for the whole run.
int passed_fd() {
  static int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  return fd;
}

void channel_path(uint8_t mode, const uint8_t* data, size_t size) {
  const int passed = passed_fd();
  UniqueFd a, b;
  std::string err;
  if (!proto::socket_pair(&a, &b, &err)) std::abort();
  // Blocking writes: the inputs are far below the socket buffer.
  fcntl(a.get(), F_SETFL, 0);
  size_t split = size;
  if (size > 1) {
    split = 1 + data[0] % (size - 1);  // 1 .. size-1 of what follows
    ++data;
    --size;
  }
  const int d1 = (mode >> 1) & 3, d2 = (mode >> 3) & 3;
  if (split > 0) send_chunk(a.get(), data, split, d1, passed);
  if (size > split) send_chunk(a.get(), data + split, size - split, d2, passed);
  a.reset();  // EOF after the data: recv never waits for more
  proto::Channel ch(std::move(b), std::chrono::milliseconds(200));
  for (int i = 0; i < 64; ++i) {
    proto::Message m;
    if (!ch.recv(&m, &err)) break;
    exercise(m);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  passed_fd();
  const int before = open_fd_count();
  const uint8_t mode = data[0];
  if (mode & 1) {
    proto::Message m;
    std::string err;
    if (proto::decode_body(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1), &m,
                           &err))
      exercise(m);
  } else {
    channel_path(mode, data + 1, size - 1);
  }
  const int after = open_fd_count();
  if (after != before) {
    std::fprintf(stderr, "descriptor leak: %d open before the input, %d after\n", before, after);
    std::abort();
  }
  return 0;
}
