// The shim's two listeners and the importer's side of the peer exchange.
//
// Peer listener: answers "fetch" from the export cache alone (State::cache_mu);
// it never calls the driver and never takes the main lock, so a creator busy
// in a long driver call still serves its importers. Control listener: answers
// "inspect" (takes the main lock briefly) and drives the gate. Both run with
// every signal blocked, check the peer's uid (root or the shim's own), and
// bound every exchange by the control timeout ($CUSNAP_CONTROL_TIMEOUT). Each
// keeps several connections and takes a request only once it is there whole,
// so a client that sends nothing or half a request holds up no other (serve).
// The control listener's requests: track_control.cpp.
// A child the application forks closes the descriptors the listeners hold
// (connections, parts of a save or load, an export being sent), an
// importer's connection to the creator and the export it fetched while they
// are open, as it does the listening sockets: they are in the fork table
// (fork_table.h), whose handler closes them. The application may
// close any of them and reuse the number: a listener checks each one's
// identity before it polls, reads, writes, uses or closes it, and lets go of
// one that no longer names its file without closing the number.
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "proto/control.h"
#include "proto/env_settings.h"
#include "proto/wire.h"
#include "shim/cusnap_shim.h"
#include "shim/fork_table.h"
#include "shim/gate.h"
#include "shim/held_fd.h"
#include "shim/thread_start.h"
#include "shim/track_listener.h"
#include "shim/track_state.h"

namespace cusnap::shim::track {

namespace {

/// Connections a listener keeps open at once (descriptors in the
/// application's process). One more pending closes the one idle the longest,
/// once it has been idle kEvictIdle; until then the new one waits its turn.
constexpr size_t kMaxConnections = kMaxListenerConnections;
constexpr auto kEvictIdle = std::chrono::seconds(1);

bool allowed(int fd, uid_t owner) {
  struct ucred cred {};
  std::string err;
  return proto::peer_credentials(fd, &cred, &err) && proto::peer_uid_allowed(cred.uid, owner);
}

/// Accepts a pending connection into c, entered in the fork table in the same
/// step as a fork sees it. false as accept_unix (*err empty: nothing
/// pending); with *err set also when the table is full (never while each
/// listener keeps at most kMaxConnections), the connection then closed.
bool accept_into(int listen_fd, Conn* c, std::string* err) {
  std::lock_guard<std::mutex> l(fork_table_mutex());
  UniqueFd fd;
  if (!proto::accept_unix(listen_fd, &fd, err)) return false;
  const std::ptrdiff_t slot = fork_table_enter_locked(fd.get());
  if (slot < 0) {
    *err = "no room for another connection, or its fstat failed";
    return false;
  }
  c->slot = slot;
  c->id = fork_table_entry_locked(slot);
  c->ch = proto::Channel(std::move(fd), exchange_timeout());
  return true;
}

/// Connects c to the Unix socket at path (an importer's connection to a
/// creator's peer socket), bounded by the control timeout. The socket is
/// made and entered in the fork table in one step as a fork sees it, and
/// connected holding no lock (a connect may wait for room in the backlog),
/// so a child the application forks during the exchange closes its copy.
/// With no room in the table the connection is held outside it and goes on.
bool connect_listed(const std::string& path, Conn* c, std::string* err) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof sa.sun_path) {
    *err = "socket path too long: " + path;
    return false;
  }
  std::memcpy(sa.sun_path, path.data(), path.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  {
    std::lock_guard<std::mutex> l(fork_table_mutex());
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) {
      *err = std::string("socket: ") + std::strerror(errno);
      return false;
    }
    c->slot = fork_table_enter_locked(fd.get());
    c->id = c->slot >= 0 ? fork_table_entry_locked(c->slot) : HeldFd::of(fd.get());
    c->ch = proto::Channel(std::move(fd), exchange_timeout());
  }
  const auto deadline = Clock::now() + exchange_timeout();
  for (;;) {
    if (::connect(c->ch.fd(), reinterpret_cast<sockaddr*>(&sa), len) == 0 || errno == EISCONN)
      return true;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EINPROGRESS) {
      *err = "connecting to " + path + ": " + std::strerror(errno);
      return false;
    }
    // The backlog is full: wait a little, then try again. Not a poll: an
    // AF_UNIX socket that is not connected reports POLLOUT|POLLHUP at once,
    // so the loop would spin on a core of the application's, inside its
    // import call, until the deadline (as proto::connect_unix, a sleep).
    const auto now = Clock::now();
    if (now >= deadline) {
      *err = "connecting to " + path + ": timed out";
      return false;
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
    struct timespec ts {
      0, std::clamp<int64_t>(left, 1, 10) * 1000 * 1000
    };
    ::nanosleep(&ts, nullptr);  // interrupted: the next attempt comes sooner
  }
}

/// Serves one "fetch" (the peer socket's one request per connection).
void serve_peer(State& s, Conn& c) {
  proto::Message msg;
  ListedFd brought;  // none is expected: closed with the request
  std::string err;
  bool refused = false;
  if (!recv_request(c, &msg, &brought, &err, &refused)) {
    if (refused) {  // a peer of another version, or a broken one, is told why
      proto::FetchReply r;
      r.error = "request refused: " + err;
      reply(c, proto::kMsgFetched, r);
    }
    return;
  }
  proto::FetchReply r;
  proto::FetchRequest req;
  if (msg.type != proto::kMsgFetch || !msg.get(&req, &err)) {
    r.error = msg.type != proto::kMsgFetch ? "unknown request '" + msg.type + "'" : err;
    reply(c, proto::kMsgFetched, r);
    return;
  }
  // The duplicate sent: in the table from the dup on (under both locks, as a
  // fork sees it), since a copy in a child would keep the allocation alive.
  ListedFd dup;
  int dup_errno = 0;
  if (req.creator_start != s.start_time) {
    r.error = "ticket names another process";
  } else {
    std::lock_guard<std::mutex> l(s.cache_mu);
    auto it = s.cache.find(req.allocation);
    if (it == s.cache.end()) {
      r.error = "allocation " + std::to_string(req.allocation) + " is not exported";
    } else if (!it->second.ours()) {
      r.error = "the process closed the shim's descriptor of allocation " +
                std::to_string(req.allocation);
    } else {
      std::lock_guard<std::mutex> t(fork_table_mutex());
      UniqueFd fd(::fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0));
      dup_errno = errno;
      if (fd && !dup.take_locked(fd)) r.error = "no room to hold the descriptor";
    }
    if (dup) {
      auto m = s.cache_meta.find(req.allocation);
      if (m != s.cache_meta.end()) {
        r.generation = m->second.generation;
        r.size = m->second.size;
      }
    }
  }
  if (dup && !dup.ours()) {  // closed in the process since: never send its file
    dup.reset();
    r.error = "the process closed the descriptor of allocation " + std::to_string(req.allocation);
  }
  r.ok = static_cast<bool>(dup);
  if (!r.ok && r.error.empty()) r.error = std::strerror(dup_errno);
  reply(c, proto::kMsgFetched, r, dup.get());
}

struct ListenerArg {
  State* s;
  int fd;
  bool peer;
};

/// Listeners that have started running. start_servers waits for both, so a
/// fork that follows never copies a thread still in its start-up (where the
/// C library or a sanitizer runtime may hold a lock the child would inherit).
std::atomic<int> g_running{0};

/// After an accept that failed for want of resources (EMFILE or ENFILE: the
/// application holds every descriptor it may; ENOBUFS, ENOMEM): the
/// connection stays pending, so poll reports it again at once, and the
/// listener would spin on a core of the application's until descriptors are
/// freed. Waits 100 ms instead; the connection is taken once accept works.
void back_off() {
  struct timespec ts {
    0, 100 * 1000 * 1000
  };
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

enum class Queued { kNothing, kPart, kWhole };

/// What a connection has queued, read without taking it: nothing, part of a
/// request, or a whole one (also a length recv refuses at once, and the end
/// of the stream, which recv reports).
Queued queued(int fd) {
  unsigned char hdr[4];
  const ssize_t r = ::recv(fd, hdr, sizeof hdr, MSG_PEEK | MSG_DONTWAIT);
  if (r < 0)
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? Queued::kNothing
                                                                     : Queued::kWhole;
  if (r == 0) return Queued::kWhole;
  int avail = 0;
  if (::ioctl(fd, FIONREAD, &avail) != 0) return Queued::kWhole;  // recv says what is wrong
  if (r < static_cast<ssize_t>(sizeof hdr)) return avail >= 4 ? Queued::kWhole : Queued::kPart;
  const uint64_t n =
      uint64_t(hdr[0]) | uint64_t(hdr[1]) << 8 | uint64_t(hdr[2]) << 16 | uint64_t(hdr[3]) << 24;
  if (n == 0 || n > proto::kMaxRequestBytes) return Queued::kWhole;
  return static_cast<uint64_t>(avail) >= 4 + n ? Queued::kWhole : Queued::kPart;
}

/// Out-of-band data (an AF_UNIX stream takes one byte with MSG_OOB): poll
/// then reports POLLIN for good while a peek skips the byte and finds
/// nothing, so a loop that waits for input would spin. No client of the
/// shim, and no shim, sends any: a connection that has some is dropped.
constexpr short kOutOfBand = POLLPRI;

/// Waits, holding no lock, until a whole message (or the end of the stream,
/// or an error: recv reports which) is queued on fd, until deadline; false
/// and *err when none came by then, or out-of-band data came. Polls while
/// nothing is queued, looks again every 5 ms while part of one is (poll
/// would report it at once).
bool await_whole(int fd, Clock::time_point deadline, std::string* err) {
  for (;;) {
    const Queued q = queued(fd);
    if (q == Queued::kWhole) return true;
    const auto now = Clock::now();
    if (now >= deadline) {
      *err = "timed out waiting for a message";
      return false;
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
    const int ms = static_cast<int>(std::clamp<int64_t>(left, 1, q == Queued::kPart ? 5 : 1 << 30));
    if (q == Queued::kPart) {
      struct timespec ts {
        0, ms * 1000 * 1000L
      };
      ::nanosleep(&ts, nullptr);
    } else {
      struct pollfd p {
        fd, POLLIN | POLLRDHUP | kOutOfBand, 0
      };
      if (::poll(&p, 1, ms) > 0 && (p.revents & kOutOfBand)) {
        *err = "out-of-band data on the connection";
        return false;
      }
    }
  }
}

/// A listener's loop. It keeps up to kMaxConnections connections and takes a
/// request from one only once it has arrived whole, one request per
/// connection in turn, so a client that sends nothing, or half a request,
/// keeps no other waiting: the others are answered meanwhile, and it is
/// closed at its deadline. With kMaxConnections open and another pending,
/// the one idle the longest is closed once idle kEvictIdle. Requests are
/// handled one at a time, on this thread, as before.
void serve(ListenerArg arg) {
  State& s = *arg.s;
  std::vector<std::unique_ptr<Conn>> conns;
  GateHold hold;
  hold.contact = Clock::now();
  ControlEnd end(hold, !arg.peer);
  std::vector<struct pollfd> pfds;
  for (;;) {
    // A connection whose number the application closed (and may have reused
    // for a file of its own) is dropped, the number left alone (~Conn): it
    // is neither polled, read, written nor closed.
    conns.erase(std::remove_if(conns.begin(), conns.end(), [](auto& c) { return !c->ours(); }),
                conns.end());
    Clock::time_point now = Clock::now();
    if (!arg.peer) open_unattended_gate(hold, !conns.empty(), now);
    // Wake for a connection's deadline, for the hold, and every 5 ms while a
    // request is partly there (its connection is not polled for input, which
    // would report it again at once).
    Clock::time_point wake = Clock::time_point::max();
    bool part = false;
    // Full: the connection idle the longest makes room once idle kEvictIdle.
    auto oldest = std::min_element(conns.begin(), conns.end(),
                                   [](auto& a, auto& b) { return a->last < b->last; });
    const bool full = conns.size() >= kMaxConnections;
    const bool room = !full || now - (*oldest)->last >= kEvictIdle;
    if (!room) wake = (*oldest)->last + kEvictIdle;
    pfds.assign(1, pollfd{arg.fd, static_cast<short>(room ? POLLIN : 0), 0});
    for (auto& c : conns) {
      const bool p = queued(c->ch.fd()) == Queued::kPart;
      part = part || p;
      const short ev = p ? POLLRDHUP | kOutOfBand : POLLIN | POLLRDHUP | kOutOfBand;
      pfds.push_back(pollfd{c->ch.fd(), ev, 0});
      wake = std::min(wake, c->deadline);
    }
    if (!arg.peer && hold.pending() && conns.empty()) wake = std::min(wake, hold.expiry());
    if (part) wake = std::min(wake, now + std::chrono::milliseconds(5));
    int ms = -1;
    if (wake != Clock::time_point::max()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(wake - now).count();
      ms = static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
    }
    const int n = ::poll(pfds.data(), pfds.size(), ms);
    if (n < 0 && errno != EINTR) {
      end.why = "poll failed";
      return;
    }
    now = Clock::now();
    if (!conns.empty()) hold.contact = now;  // they were open until now
    // The application closed the socket (POLLNVAL), or closed it and its
    // number now names a file of its own: never accept the application's
    // connections. The coordinator finds the socket gone.
    if ((pfds[0].revents & POLLNVAL) ||
        !listener_is_ours(arg.fd, arg.peer ? s.peer_path : s.ctl_path)) {
      end.why = "the application closed its socket";
      return;
    }
    // One request per connection whose request is whole; the rest wait for
    // theirs until their deadline.
    for (size_t i = 0; i < conns.size();) {
      Conn& c = *conns[i];
      const short ev = i + 1 < pfds.size() && pfds[i + 1].fd == c.ch.fd() ? pfds[i + 1].revents : 0;
      bool keep = true;
      if (!c.ours()) {
        keep = false;  // the application's number since the poll: let go
      } else if (ev & kOutOfBand) {
        keep = false;  // dropped unanswered: poll would report it again at once, for good
      } else if (queued(c.ch.fd()) == Queued::kWhole) {
        c.last = now;
        try {
          if (arg.peer)
            serve_peer(s, c);  // one request per connection
          else
            keep = serve_control(s, c, hold);
        } catch (...) {
          keep = false;
        }
        if (arg.peer) keep = false;
        now = Clock::now();
        c.deadline = now + exchange_timeout();
      } else {
        keep = now < c.deadline && !(ev & (POLLHUP | POLLERR | POLLNVAL | POLLRDHUP));
      }
      if (keep) {
        ++i;
      } else {
        conns.erase(conns.begin() + static_cast<std::ptrdiff_t>(i));
        pfds.erase(pfds.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      }
    }
    if (!(pfds[0].revents & POLLIN)) continue;
    if (conns.size() >= kMaxConnections) {
      oldest = std::min_element(conns.begin(), conns.end(),
                                [](auto& a, auto& b) { return a->last < b->last; });
      if (now - (*oldest)->last < kEvictIdle) continue;
      conns.erase(oldest);
    }
    auto c = std::make_unique<Conn>();
    std::string err;
    if (!accept_into(arg.fd, c.get(), &err)) {
      if (!err.empty()) back_off();  // empty: nothing pending any more
      continue;
    }
    if (!allowed(c->ch.fd(), s.uid)) continue;  // closed unanswered
    c->ch.set_max_body(proto::kMaxRequestBytes);
    c->last = now;
    c->deadline = now + exchange_timeout();
    conns.push_back(std::move(c));
  }
}

/// Takes a listening socket down if fd is still the shim's (listening, bound
/// to path): shut down (a listener polling it wakes), its path unlinked,
/// closed. Under the fork table's lock, as every close of a descriptor the
/// listeners hold, so a listener that ends by itself and start_servers never
/// both close the number: the second finds it no longer the shim's (and a
/// number the application reused since is left alone).
void take_down(int fd, const std::string& path) noexcept {
  std::lock_guard<std::mutex> l(fork_table_mutex());
  if (!listener_is_ours(fd, path)) return;
  ::shutdown(fd, SHUT_RDWR);
  ::unlink(path.c_str());
  ::close(fd);
}

void* listener_main(void* p) {
  ListenerArg arg = *static_cast<ListenerArg*>(p);
  delete static_cast<ListenerArg*>(p);
  // Not the application's to cancel: unwinding into the catch below would
  // abort the process.
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, nullptr);
  g_running.fetch_add(1, std::memory_order_release);
  // Out of memory in the loop's own bookkeeping: the listener ends (its
  // connections close), the process goes on; the coordinator finds no answer.
  try {
    serve(arg);
  } catch (...) {
  }
  // Ended by itself (poll failed, out of memory): a socket left bound and
  // listening with no one to accept would take every client into its
  // backlog, to wait out its whole timeout (an importer inside the
  // application's import call). Gone, a client finds no shim here at once.
  // A socket the application closed is not the shim's any more: left alone.
  State& s = *arg.s;
  take_down(arg.fd, arg.peer ? s.peer_path : s.ctl_path);
  return nullptr;
}

bool spawn(State& s, int fd, bool peer) {
  auto* arg = new ListenerArg{&s, fd, peer};
  if (start_detached(listener_main, arg) == 0) return true;
  delete arg;
  return false;
}

}  // namespace

bool recv_request(Conn& c, proto::Message* msg, ListedFd* fd, std::string* err, bool* refused) {
  *refused = false;
  if (!c.ours()) {
    *err = "the connection's descriptor was closed in the process";
    return false;
  }
  std::lock_guard<std::mutex> l(fork_table_mutex());
  c.ch.set_timeout(kRecvUnderLock);
  const bool got = c.ch.recv(msg, err, refused);
  c.ch.set_timeout(exchange_timeout());
  if (!got || !msg->fd) return got;
  if (!fd->take_locked(msg->fd)) {
    msg->fd.reset();  // closed under the table's lock: a fork never copies it
    *err = "no room for the descriptor that came with the request";
    *refused = true;
    return false;
  }
  return true;
}

bool listener_is_ours(int fd, const std::string& path) noexcept {
  int listening = 0;
  socklen_t len = sizeof listening;
  if (fd < 0 || ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening)
    return false;
  sockaddr_un a{};
  socklen_t alen = sizeof a;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &alen) != 0 || a.sun_family != AF_UNIX ||
      alen <= offsetof(sockaddr_un, sun_path))
    return false;
  const size_t n = ::strnlen(a.sun_path, alen - offsetof(sockaddr_un, sun_path));
  return n == path.size() && std::memcmp(a.sun_path, path.data(), n) == 0;
}

void close_listener(int* fd, const std::string& path) noexcept {
  if (listener_is_ours(*fd, path)) ::close(*fd);
  *fd = -1;
}

bool start_servers(State& s) noexcept {
  try {
    s.peer_path = proto::shim_peer_socket(s.runtime_dir, s.pid);
    s.ctl_path = proto::shim_control_socket(s.runtime_dir, s.pid);
    UniqueFd peer, ctl;
    std::string err;
    // A socket of an earlier process with this pid (e.g. before a restore) is stale.
    ::unlink(s.peer_path.c_str());
    ::unlink(s.ctl_path.c_str());
    if (!proto::listen_unix(s.peer_path, 0600, &peer, &err) ||
        !proto::listen_unix(s.ctl_path, 0600, &ctl, &err)) {
      ::unlink(s.peer_path.c_str());
      return false;
    }
    s.peer_listen = peer.release();
    s.ctl_listen = ctl.release();
    g_running.store(0, std::memory_order_relaxed);
    const int spawned = !spawn(s, s.peer_listen, true) ? 0 : !spawn(s, s.ctl_listen, false) ? 1 : 2;
    for (int i = 0; i < 2000 && g_running.load(std::memory_order_acquire) < spawned; ++i) {
      struct timespec ts {
        0, 500000
      };
      ::nanosleep(&ts, nullptr);
    }
    if (spawned == 2) return true;
    // No thread for a listener (pthread_create failed): no socket may stay
    // bound with nothing to accept on it, where a coordinator would wait out
    // its timeout; gone, it finds no shim here and says so. A peer listener
    // already running wakes at the shutdown, finds its socket closed and
    // ends.
    take_down(s.peer_listen, s.peer_path);
    take_down(s.ctl_listen, s.ctl_path);
    ::unlink(s.peer_path.c_str());
    ::unlink(s.ctl_path.c_str());
    s.peer_listen = s.ctl_listen = -1;
    return false;
  } catch (...) {
    return false;
  }
}

bool fetch_descriptor(const proto::Ticket& t, std::string* err, uint64_t* generation,
                      const std::function<void(int fd)>& use) noexcept {
  // Called from an import hook: connect, poll and recvmsg are cancellation
  // points, and a cancellation unwinding into the catch below (which does not
  // rethrow) makes the C library abort the process (gate.h, NoCancel).
  const NoCancel no_cancel;
  // The export, from its receipt to its close: in the fork table (listed), or
  // outside it when the table has no room (unlisted; the import goes on).
  ListedFd listed;
  UniqueFd unlisted;
  try {
    // The connection: in the fork table from its socket to its close (Conn).
    Conn conn;
    if (!connect_listed(t.socket, &conn, err)) return false;
    struct ucred cred {};
    if (!proto::peer_credentials(conn.ch.fd(), &cred, err)) return false;
    if (!proto::peer_uid_allowed(cred.uid, state().uid) || cred.pid != t.creator_pid) {
      *err = "the peer socket is not the creator's";
      return false;
    }
    proto::Channel& ch = conn.ch;
    ch.set_max_body(proto::kMaxRequestBytes);  // a fetched reply is as small
    proto::FetchRequest req{t.creator_start, t.allocation};
    if (!ch.send(proto::kMsgFetch, req, err)) return false;
    // The reply is awaited holding nothing and received only once all of it
    // is queued, under the fork table's lock with its descriptor's entry (bounded as a
    // listener's receipt is): a fork in another application thread then
    // never waits on the creator, and a child it makes closes the copy.
    if (!await_whole(ch.fd(), Clock::now() + exchange_timeout(), err)) return false;
    proto::Message msg;
    bool got;
    {
      std::lock_guard<std::mutex> l(fork_table_mutex());
      ch.set_timeout(kRecvUnderLock);
      got = ch.recv(&msg, err);
      if (msg.fd && !listed.take_locked(msg.fd)) unlisted = std::move(msg.fd);
    }
    if (!got) return false;
    proto::FetchReply reply;
    if (msg.type != proto::kMsgFetched || !msg.get(&reply, err)) {
      if (err->empty()) *err = "unexpected reply '" + msg.type + "'";
      return false;
    }
    if (!reply.ok || (!listed && !unlisted)) {
      *err = reply.error.empty() ? "no descriptor in the reply" : reply.error;
      return false;
    }
    // The importer records the ticket's size (a handle's bytes, which the
    // application can forge): the creator's must agree. 0: a creator's shim
    // that does not say.
    if (reply.size != 0 && reply.size != t.bytes) {
      *err = "allocation " + std::to_string(t.allocation) + " of process " +
             std::to_string(t.creator_pid) + " has " + std::to_string(reply.size) +
             " bytes, the ticket says " + std::to_string(t.bytes);
      return false;
    }
    if (generation) *generation = reply.generation;
  } catch (...) {
    *err = "out of memory";
    return false;
  }
  use(listed ? listed.get() : unlisted.get());
  return true;  // closed out of the table (ListedFd), the number left alone if reused
}

}  // namespace cusnap::shim::track
