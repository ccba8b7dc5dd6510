#include "proto/wire.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "proto/env_settings.h"

namespace cusnap::proto {
namespace {

using Clock = std::chrono::steady_clock;

/// How long connect_unix tries again a socket that refuses: between its
/// server's bind and listen, which take microseconds unless the server is
/// descheduled between them; a dead process's socket is said that much later.
constexpr std::chrono::milliseconds kListenGrace{200};

std::string errno_text(const char* what) {
  return errno_message(what, errno);
}

/// Waits until fd is ready for events or the deadline passes.
bool wait_ready(int fd, short events, Clock::time_point deadline, std::string* err) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      *err = "timed out";
      return false;
    }
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
    if (r < 0) {
      if (errno == EINTR) continue;
      *err = errno_text("poll");
      return false;
    }
    if (r == 0) continue;  // re-check the deadline
    if (p.revents & POLLNVAL) {
      *err = "poll: invalid descriptor";
      return false;
    }
    return true;  // readable, writable, or hung up: the next call says which
  }
}

bool fill_sockaddr(const std::string& path, sockaddr_un* sa, socklen_t* len, std::string* err) {
  std::memset(sa, 0, sizeof(*sa));
  sa->sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(sa->sun_path)) {
    *err = "socket path '" + path + "' is empty or longer than " +
           std::to_string(sizeof(sa->sun_path) - 1) + " bytes";
    return false;
  }
  std::memcpy(sa->sun_path, path.data(), path.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  return true;
}

/// Receives exactly n bytes into buf, collecting every descriptor that arrives
/// in *fds. Any control data other than SCM_RIGHTS, or truncated control data,
/// is an error (the descriptors received so far stay in *fds to be closed).
/// *got: the bytes received, also when it fails.
bool recv_exact(int fd, char* buf, size_t n, Clock::time_point deadline, std::vector<UniqueFd>* fds,
                size_t* got_out, std::string* err) {
  size_t& got = *got_out;
  got = 0;
  constexpr size_t kFdsPerReceipt = 8;  // what the control buffer holds
  while (got < n) {
    iovec iov{buf + got, n - got};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kFdsPerReceipt)];
    // Room for every descriptor one receipt can bring, made before it: once
    // received, a descriptor is stored without allocating, so none is left
    // open unowned by a failed allocation (this may throw; nothing is
    // received then).
    fds->reserve(fds->size() + kFdsPerReceipt);
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t r = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!wait_ready(fd, POLLIN, deadline, err)) return false;
        continue;
      }
      *err = errno_text("recvmsg");
      return false;
    }
    const size_t before = got;
    got += static_cast<size_t>(r);
    bool bad_control = false;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
          int rfd;
          std::memcpy(&rfd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
          UniqueFd held(rfd);  // closed here unless stored
          if (fds->size() < fds->capacity())
            fds->push_back(std::move(held));  // within the reserved room: no allocation
          else
            bad_control = true;  // more than the buffer holds: never
        }
      } else {
        bad_control = true;
      }
    }
    if (msg.msg_flags & MSG_CTRUNC) {
      *err = "message carried truncated control data";
      return false;
    }
    if (bad_control) {
      *err = "message carried unexpected control data";
      return false;
    }
    if (r == 0) {
      *err = before == 0 ? "connection closed" : "connection closed in the middle of a message";
      return false;
    }
  }
  return true;
}

/// Reads a body's array and map headers before the decoder does. The decoder
/// allocates a container's elements (24 bytes each) as it reads its count,
/// so counts each within the body's size still add up, nested 32 deep, to
/// 32 times 24 bytes per byte of the body. Every element at every depth takes
/// at least one byte of its own (a map's pair two), so the counts of a body
/// that is what it claims add up to less than its size: a larger sum is
/// refused before anything is allocated.
struct DeclaredElements : msgpack::null_visitor {
  explicit DeclaredElements(size_t bytes) : left(bytes) {}
  size_t left;
  size_t depth = 0;
  bool too_many = false;
  bool too_deep = false;

  bool take(uint64_t elements) {
    if (++depth > kMaxNesting) {
      too_deep = true;
      return false;
    }
    if (elements > left) {
      too_many = true;
      return false;
    }
    left -= size_t(elements);
    return true;
  }
  bool start_array(uint32_t n) { return take(n); }
  bool end_array() {
    --depth;
    return true;
  }
  bool start_map(uint32_t n) { return take(uint64_t(n) * 2); }
  bool end_map() {
    --depth;
    return true;
  }
};

}  // namespace

bool decode_body(std::string_view body, Message* out, std::string* err) {
  if (body.size() > kMaxMessageBytes) {
    *err = "message of " + std::to_string(body.size()) + " bytes exceeds the limit";
    return false;
  }
  if (body.empty()) {
    *err = "empty message";
    return false;
  }
  try {
    DeclaredElements declared(body.size());
    std::size_t scanned = 0;
    // A body this fails otherwise (truncated, a never-used byte) the
    // decoder below refuses with its own words.
    if (!msgpack::parse(body.data(), body.size(), scanned, declared) &&
        (declared.too_many || declared.too_deep)) {
      *err = declared.too_deep ? "message nests arrays and maps deeper than " +
                                     std::to_string(kMaxNesting) + " levels"
                               : "message declares more array and map elements than its " +
                                     std::to_string(body.size()) + " bytes can hold";
      return false;
    }
    std::size_t off = 0;
    // Each count on its own is bounded too (each element takes at least
    // one byte), as a second guard.
    const std::size_t n = body.size();
    const msgpack::unpack_limit limit(n, n / 2, n, n, n, kMaxNesting);
    msgpack::object_handle oh =
        msgpack::unpack(body.data(), body.size(), off, nullptr, nullptr, limit);
    if (off != body.size()) {
      *err = "message has " + std::to_string(body.size() - off) + " trailing bytes";
      return false;
    }
    const msgpack::object& o = oh.get();
    if (o.type != msgpack::type::ARRAY || o.via.array.size != 3) {
      *err = "message is not [version, type, payload]";
      return false;
    }
    const msgpack::object& v = o.via.array.ptr[0];
    if (v.type != msgpack::type::POSITIVE_INTEGER) {
      *err = "message version is not an unsigned integer";
      return false;
    }
    if (v.via.u64 != kProtocolVersion) {
      *err = "unsupported protocol version " + std::to_string(v.via.u64) + " (this side speaks " +
             std::to_string(kProtocolVersion) + ")";
      return false;
    }
    const msgpack::object& t = o.via.array.ptr[1];
    if (t.type != msgpack::type::STR || t.via.str.size == 0 || t.via.str.size > 64) {
      *err = "message type is not a short string";
      return false;
    }
    out->type.assign(t.via.str.ptr, t.via.str.size);
    // Keep the payload with its zone: re-point the handle at the third element.
    msgpack::object payload = o.via.array.ptr[2];
    out->payload = msgpack::object_handle(payload, std::move(oh.zone()));
    return true;
  } catch (const std::exception& e) {
    *err = std::string("malformed message: ") + e.what();
    return false;
  }
}

std::string frame(std::string_view body) {
  std::string f(4, '\0');
  uint32_t n = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) f[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  f.append(body);
  return f;
}

Channel::Channel(UniqueFd fd, std::chrono::milliseconds timeout)
    : fd_(std::move(fd)), timeout_(timeout) {}

bool Channel::send_body(std::string_view body, int pass_fd, std::string* err) {
  if (!fd_) {
    *err = "channel is closed";
    return false;
  }
  if (body.size() > kMaxMessageBytes) {
    *err = "message of " + std::to_string(body.size()) + " bytes exceeds the limit";
    return false;
  }
  const std::string data = frame(body);
  const auto deadline = Clock::now() + timeout_;
  size_t sent = 0;
  bool fd_sent = pass_fd < 0;
  while (sent < data.size()) {
    iovec iov{const_cast<char*>(data.data()) + sent, data.size() - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    if (!fd_sent) {
      std::memset(control, 0, sizeof(control));
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    }
    ssize_t r = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!wait_ready(fd_.get(), POLLOUT, deadline, err)) {
          *err = "sending: " + *err;
          return false;
        }
        continue;
      }
      *err = errno_text("sendmsg");
      return false;
    }
    fd_sent = true;
    sent += static_cast<size_t>(r);
  }
  return true;
}

bool Channel::recv_body(std::string* body, UniqueFd* fd, std::string* err) {
  if (!fd_) {
    *err = "channel is closed";
    return false;
  }
  const auto deadline = Clock::now() + timeout_;
  std::vector<UniqueFd> fds;  // closes everything on any error path
  unsigned char hdr[4];
  size_t got = 0;
  if (!recv_exact(fd_.get(), reinterpret_cast<char*>(hdr), 4, deadline, &fds, &got, err)) {
    // Nothing read yet (a timeout, a closed peer): the stream is in step,
    // and a later recv may wait again. Part of a length read, or a message
    // whose control data was refused: the next bytes are no message's start.
    if (got > 0) fd_.reset();
    if (*err == "timed out")
      *err = got > 0 ? "timed out in the middle of a message" : "timed out waiting for a message";
    return false;
  }
  uint32_t n =
      uint32_t(hdr[0]) | uint32_t(hdr[1]) << 8 | uint32_t(hdr[2]) << 16 | uint32_t(hdr[3]) << 24;
  if (n == 0 || n > max_body_) {
    *err = "message length " + std::to_string(n) + " is out of range (1 to " +
           std::to_string(max_body_) + " bytes)";
    fd_.reset();  // the stream cannot be resynchronised
    return false;
  }
  body->resize(n);
  if (!recv_exact(fd_.get(), body->data(), n, deadline, &fds, &got, err)) {
    if (*err == "timed out") *err = "timed out in the middle of a message";
    fd_.reset();
    return false;
  }
  if (fds.size() > 1) {
    *err = "message carried " + std::to_string(fds.size()) + " descriptors (at most one allowed)";
    return false;
  }
  if (fds.size() == 1) *fd = std::move(fds[0]);
  return true;
}

bool Channel::recv(Message* out, std::string* err, bool* refused) {
  std::string body;
  UniqueFd fd;
  if (refused) *refused = false;
  if (!recv_body(&body, &fd, err)) return false;
  if (!decode_body(body, out, err)) {
    if (refused) *refused = true;
    return false;
  }
  out->fd = std::move(fd);
  return true;
}

bool connect_unix(const std::string& path, std::chrono::milliseconds timeout, UniqueFd* out,
                  std::string* err) {
  sockaddr_un sa;
  socklen_t len;
  if (!fill_sockaddr(path, &sa, &len, err)) return false;
  UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s) {
    *err = errno_text("socket");
    return false;
  }
  const auto deadline = Clock::now() + timeout;
  // A socket bound and not yet listening refuses as one whose process is
  // gone: tried again for a moment (listen_unix binds, then listens).
  const auto refused_until = std::min(deadline, Clock::now() + kListenGrace);
  for (;;) {
    if (::connect(s.get(), reinterpret_cast<sockaddr*>(&sa), len) == 0) break;
    if (errno == EINTR) continue;
    if (errno == ECONNREFUSED && Clock::now() < refused_until) {
      struct timespec ts {
        0, 5 * 1000 * 1000
      };
      nanosleep(&ts, nullptr);
      continue;
    }
    if (errno == EAGAIN || errno == EINPROGRESS) {
      // A Unix socket whose backlog is full: wait for room, then retry.
      if (!wait_ready(s.get(), POLLOUT, deadline, err)) {
        *err = "connecting to " + path + ": " + *err;
        return false;
      }
      if (Clock::now() >= deadline) {
        *err = "connecting to " + path + ": timed out";
        return false;
      }
      struct timespec ts {
        0, 10 * 1000 * 1000
      };
      nanosleep(&ts, nullptr);
      continue;
    }
    if (errno == EISCONN) break;
    *err = "connecting to " + path + ": " + std::strerror(errno);
    return false;
  }
  *out = std::move(s);
  return true;
}

bool listen_unix(const std::string& path, mode_t mode, UniqueFd* out, std::string* err) {
  sockaddr_un sa;
  socklen_t len;
  if (!fill_sockaddr(path, &sa, &len, err)) return false;
  UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s) {
    *err = errno_text("socket");
    return false;
  }
  // Linux gives the socket's file the mode of the socket's own inode less
  // the umask: set first, it holds from bind on, with no window in which
  // others may connect. Not the umask, which is the whole process's: the
  // shim binds inside the application, whose threads may be creating files
  // (or setting the umask) meanwhile.
  if (::fchmod(s.get(), mode) != 0) {
    *err = errno_text("fchmod of the socket");
    return false;
  }
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0) {
    *err = "binding " + path + ": " + std::strerror(errno);
    return false;
  }
  if (::chmod(path.c_str(), mode) != 0) {
    *err = "chmod " + path + ": " + std::strerror(errno);
    ::unlink(path.c_str());
    return false;
  }
  if (::listen(s.get(), 16) != 0) {
    *err = errno_text("listen");
    ::unlink(path.c_str());
    return false;
  }
  *out = std::move(s);
  return true;
}

bool accept_unix(int listen_fd, UniqueFd* out, std::string* err) {
  err->clear();
  for (;;) {
    int c = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c >= 0) {
      out->reset(c);
      return true;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED) return false;
    *err = errno_text("accept");
    return false;
  }
}

bool socket_pair(UniqueFd* a, UniqueFd* b, std::string* err) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) != 0) {
    *err = errno_text("socketpair");
    return false;
  }
  a->reset(sv[0]);
  b->reset(sv[1]);
  return true;
}

bool peer_credentials(int fd, struct ucred* out, std::string* err) {
  socklen_t len = sizeof(*out);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, out, &len) != 0 || len != sizeof(*out)) {
    *err = errno_text("getsockopt(SO_PEERCRED)");
    return false;
  }
  return true;
}

std::chrono::milliseconds control_timeout_from_env(std::chrono::milliseconds fallback) {
  int64_t ms = 0;
  return parse_timeout_seconds(std::getenv("CUSNAP_CONTROL_TIMEOUT"), &ms)
             ? std::chrono::milliseconds(ms)
             : fallback;
}

}  // namespace cusnap::proto
