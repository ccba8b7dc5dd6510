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
// A child the application forks closes the descriptors the listeners hold
// (connections, parts of a save or load, an export being sent), an
// importer's connection to the creator and the export it fetched while they
// are open, and the rest of the fork table (fork_table.h), in its fork
// handler (g_conn_fds), as it does the listening sockets. The application may
// close any of them and reuse the number: a listener checks each one's
// identity before it polls, reads, writes, uses or closes it, and lets go of
// one that no longer names its file without closing the number.
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
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
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

#include "proto/control.h"
#include "proto/env_settings.h"
#include "proto/wire.h"
#include "shim/cusnap_shim.h"
#include "shim/cut.h"
#include "shim/cut_control.h"
#include "shim/entries.h"
#include "shim/fork_table.h"
#include "shim/gate.h"
#include "shim/held_fd.h"
#include "shim/stderr_line.h"
#include "shim/thread_start.h"
#include "shim/track_state.h"

namespace cusnap::shim::track {

namespace {

using Clock = std::chrono::steady_clock;

/// Connections a listener keeps open at once (descriptors in the
/// application's process). One more pending closes the one idle the longest,
/// once it has been idle kEvictIdle; until then the new one waits its turn.
constexpr size_t kMaxConnections = 8;
constexpr auto kEvictIdle = std::chrono::seconds(1);
/// The longest a gate-close waits for the calls in flight, whatever it asks:
/// the coordinator asks for its phase, the timeout of the checkpoint or
/// suspend, which is at most proto::kMaxTimeoutMs (a week). A larger value,
/// sent by hand, would keep this listener (every other client, the
/// coordinator included) in the close that much longer.
constexpr uint64_t kMaxGateCloseMs = proto::kMaxTimeoutMs;

std::chrono::milliseconds timeout() {
  static const auto t = proto::control_timeout_from_env();
  return t;
}

bool allowed(int fd, uid_t owner) {
  struct ucred cred {};
  std::string err;
  return proto::peer_credentials(fd, &cred, &err) && proto::peer_uid_allowed(cred.uid, owner);
}

/// Fetched exports g_conn_fds keeps room for: application threads importing
/// at once (and the control listener's reimport). One fetched beyond that is
/// held outside the table: the import goes on, a child forked meanwhile
/// keeps a copy.
constexpr size_t kFetchedFds = 32;
/// Importers' connections to creators g_conn_fds keeps room for (as many);
/// one beyond that is held outside the table.
constexpr size_t kImportConns = kFetchedFds;
/// The direct path's part files reopened (one save or load at a time).
constexpr size_t kReopenedParts = proto::kMaxParts;
/// Entries g_conn_fds has room for: both listeners' connections; the parts
/// of a save or load a control connection holds while they arrive (at most
/// proto::kMaxParts, the one a request just brought included); on the peer
/// listener, a descriptor a request brought and the export being sent; the
/// exports importers fetched and their connections to the creators; the
/// part files the direct path reopened.
constexpr size_t kHeldFds = 2 * kMaxConnections + kMaxConnections * proto::kMaxParts + 2 +
                            kFetchedFds + kImportConns + kReopenedParts;

/// The fork table (fork_table.h): the descriptors both listeners hold, the
/// exports importers fetched and their connections to the creators
/// (fetch_descriptor, in application threads), and the part files the direct
/// path reopened (open_listed), with the identity of the file
/// each names, for a child the application forks to close (the fork handlers
/// below): descriptors the child did not make. A copy there would keep a
/// connection the listener closed open, so its client would not see the end;
/// keep a part file of a checkpoint open, or a memory file's pages, in a
/// process that never saw it; or keep the creator's device memory alive
/// through a copy of its export. g_conn_mu is held only around what makes a
/// descriptor (an accept, a socket, the receipt of a request or a fetch's
/// reply whose bytes have all arrived, a dup, an open that cannot wait) and
/// its entry, and around the direct path's mmap with its MADV_DONTFORK, and around an entry's
/// removal and the close (a regular file's close, which may write back its
/// pages, holds no lock and comes before its entry's removal:
/// ListedFd::reset), never across a wait nor a driver call, and by the
/// fork's prepare handler: at a fork every descriptor a listener or an import
/// holds is in the table, and none in it was closed by the shim but such a
/// file whose close is under way. Lock order:
/// State::cache_mu, then g_conn_mu (an importer and the bulk copies take
/// g_conn_mu alone). One a
/// channel closed itself (a request the stream cannot recover from) stays in
/// the table until the listener drops it; the child checks the identity
/// first, so a number the application reused meanwhile is left alone.
std::mutex g_conn_mu;
HeldFd g_conn_fds[kHeldFds];

/// Enters fd in g_conn_fds (g_conn_mu held): its slot, or -1 when the table
/// is full (never while the listeners keep to their limits) or fstat fails.
std::ptrdiff_t enter_locked(int fd) {
  auto* free = std::find_if(std::begin(g_conn_fds), std::end(g_conn_fds),
                            [](const HeldFd& h) { return h.fd < 0; });
  if (free == std::end(g_conn_fds)) return -1;
  *free = HeldFd::of(fd);
  return free->fd < 0 ? -1 : free - std::begin(g_conn_fds);
}

}  // namespace

ListedFd::ListedFd(ListedFd&& o) noexcept
    : fd_(std::move(o.fd_)), id_(o.id_), slot_(std::exchange(o.slot_, -1)) {}

ListedFd& ListedFd::operator=(ListedFd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = std::move(o.fd_);
    id_ = o.id_;
    slot_ = std::exchange(o.slot_, -1);
  }
  return *this;
}

bool ListedFd::take_locked(UniqueFd& fd) {
  const std::ptrdiff_t slot = enter_locked(fd.get());
  if (slot < 0) return false;
  reset_locked();
  fd_ = std::move(fd);
  id_ = g_conn_fds[slot];
  slot_ = slot;
  return true;
}

void ListedFd::hold_unlisted_locked(UniqueFd& fd) {
  reset_locked();
  id_ = HeldFd::of(fd.get());
  fd_ = std::move(fd);
}

int ListedFd::release() {
  std::lock_guard<std::mutex> l(g_conn_mu);
  if (slot_ >= 0) g_conn_fds[slot_] = HeldFd{};
  slot_ = -1;
  return fd_.release();
}

void list_new(int fd, ListedFd* out) noexcept {
  out->reset();
  if (fd < 0) return;
  std::lock_guard<std::mutex> l(g_conn_mu);
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  UniqueFd u(high_number(fd));
  if (!out->take_locked(u)) out->hold_unlisted_locked(u);  // no room: held outside it
}

ListedFd list_held(const HeldFd& h) noexcept {
  ListedFd out;
  if (!h.ours()) return out;
  std::lock_guard<std::mutex> l(g_conn_mu);
  UniqueFd u(h.fd);
  if (!out.take_locked(u)) out.hold_unlisted_locked(u);  // no room: held outside it
  return out;
}

void ListedFd::reset() {
  if (!fd_ && slot_ < 0) return;
  // A regular file's close may write its dirty pages back (NFS, FUSE: a part
  // file the direct path wrote through its mapping), for as long as that
  // takes; under g_conn_mu it would hold up every fork of the application
  // (the prepare handler takes it), every import and both listeners. So it
  // is closed holding no lock, its entry removed only after the close: a
  // fork before the close copies it and the child closes its copy (the
  // entry is there); after it, the child has no copy, and a number reused
  // meanwhile names another file, which the child's identity check leaves
  // alone (only the shim itself could have opened the same file there, and
  // then its own entry asks the child to close it too). Taking the entry
  // out first instead would let a fork in between copy the file into a
  // child that never closes it. Other descriptors (sockets, the driver's
  // device files, whose numbers the driver reopens with the same identity)
  // are closed under the lock, as before.
  struct stat st {};
  if (fd_ && ::fstat(fd_.get(), &st) == 0 && S_ISREG(st.st_mode) && st.st_dev == id_.dev &&
      st.st_ino == id_.ino) {
    fd_.reset();
    if (slot_ < 0) return;  // held outside the table (it had no room)
    std::lock_guard<std::mutex> l(g_conn_mu);
    g_conn_fds[slot_] = HeldFd{};
    slot_ = -1;
    return;
  }
  std::lock_guard<std::mutex> l(g_conn_mu);
  reset_locked();
}

void ListedFd::reset_locked() {
  if (slot_ >= 0) g_conn_fds[slot_] = HeldFd{};
  slot_ = -1;
  if (!ours()) fd_.release();  // the application's number now: left alone
  fd_.reset();
}

bool open_listed(const char* path, int flags, bool no_wait, ListedFd* out) noexcept {
  out->reset();
  std::unique_lock<std::mutex> l(g_conn_mu, std::defer_lock);
  if (no_wait) l.lock();
  UniqueFd fd(::open(path, flags | O_CLOEXEC));
  if (!fd) return false;
  if (!no_wait) l.lock();
  if (!out->take_locked(fd)) out->hold_unlisted_locked(fd);  // no room: the open goes on
  return true;
}

void* map_unforked(size_t len, int prot, int fd, off_t off, bool no_wait) noexcept {
  std::unique_lock<std::mutex> l(g_conn_mu, std::defer_lock);
  if (no_wait) l.lock();
  void* p = ::mmap(nullptr, len, prot, MAP_SHARED, fd, off);
  if (p == MAP_FAILED) return p;
  if (!no_wait) l.lock();
  if (::madvise(p, len, MADV_DONTFORK) != 0) {
    const int saved = errno;
    ::munmap(p, len);
    errno = saved;
    return MAP_FAILED;
  }
  return p;
}

namespace {

/// One connection of a listener, or an importer's to a creator's peer socket
/// (connect_listed). A listener reads its requests only once whole (it never
/// waits on one client while others are pending), and handles them one at a
/// time on its thread.
struct Conn {
  Conn() = default;
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;
  /// Out of the table, then closed, in one step as a fork sees it; a number
  /// that no longer names the socket is let go, not closed.
  ~Conn() {
    std::lock_guard<std::mutex> l(g_conn_mu);
    if (slot >= 0) g_conn_fds[slot] = HeldFd{};
    if (!ours()) ch.release();
    ch = proto::Channel();
  }
  /// Whether the channel's number still names the socket accepted (false
  /// also once the channel closed itself).
  bool ours() const { return ch.valid() && id.ours(); }

  proto::Channel ch;
  /// The accepted socket's identity.
  HeldFd id;
  /// The next request must have arrived whole by then (the control timeout
  /// from the accept, or from the last reply): an idle client, or one that
  /// stopped mid-message, is closed there.
  Clock::time_point deadline;
  /// Of the accept or the last request: the connection idle the longest is
  /// closed first when the listener has kMaxConnections and more come.
  Clock::time_point last;
  /// A save or load whose parts are still arriving (control).
  std::vector<ListedFd> parts;
  uint64_t parts_of = 0;
  std::string parts_type;
  /// Its entry in g_conn_fds; -1 before the accept.
  std::ptrdiff_t slot = -1;
};

/// Accepts a pending connection into c, entered in g_conn_fds in the same
/// step as a fork sees it. false as accept_unix (*err empty: nothing
/// pending); with *err set also when the table is full (never while each
/// listener keeps at most kMaxConnections), the connection then closed.
bool accept_into(int listen_fd, Conn* c, std::string* err) {
  std::lock_guard<std::mutex> l(g_conn_mu);
  UniqueFd fd;
  if (!proto::accept_unix(listen_fd, &fd, err)) return false;
  const std::ptrdiff_t slot = enter_locked(fd.get());
  if (slot < 0) {
    *err = "no room for another connection, or its fstat failed";
    return false;
  }
  c->slot = slot;
  c->id = g_conn_fds[slot];
  c->ch = proto::Channel(std::move(fd), timeout());
  return true;
}

/// Connects c to the Unix socket at path (an importer's connection to a
/// creator's peer socket), bounded by the control timeout. The socket is
/// made and entered in g_conn_fds in one step as a fork sees it, and
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
    std::lock_guard<std::mutex> l(g_conn_mu);
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) {
      *err = std::string("socket: ") + std::strerror(errno);
      return false;
    }
    c->slot = enter_locked(fd.get());
    c->id = c->slot >= 0 ? g_conn_fds[c->slot] : HeldFd::of(fd.get());
    c->ch = proto::Channel(std::move(fd), timeout());
  }
  const auto deadline = Clock::now() + timeout();
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

/// The longest the receipt of a request may wait under g_conn_mu: none
/// should (serve takes a request only once queued says it is all there), but
/// a fork in the application must never wait on a client.
constexpr auto kRecvUnderLock = std::chrono::milliseconds(20);

/// Receives the request queued whole on c (Channel::recv), the descriptor
/// that came with it into *fd, in one step with its entry as a fork sees it.
/// false as recv (the connection then dropped unless *refused); also, with
/// *refused, when the table has no room for the descriptor.
bool recv_request(Conn& c, proto::Message* msg, ListedFd* fd, std::string* err, bool* refused) {
  *refused = false;
  if (!c.ours()) {
    *err = "the connection's descriptor was closed in the process";
    return false;
  }
  std::lock_guard<std::mutex> l(g_conn_mu);
  c.ch.set_timeout(kRecvUnderLock);
  const bool got = c.ch.recv(msg, err, refused);
  c.ch.set_timeout(timeout());
  if (!got || !msg->fd) return got;
  if (!fd->take_locked(msg->fd)) {
    msg->fd.reset();  // closed under g_conn_mu: a fork never copies it
    *err = "no room for the descriptor that came with the request";
    *refused = true;
    return false;
  }
  return true;
}

/// Sends a reply on c while its number still names its socket; false
/// otherwise (drop the connection, its number left alone) and when the send
/// fails.
template <class T>
bool reply(Conn& c, std::string_view type, const T& payload, int pass_fd = -1) {
  std::string err;
  return c.ours() && c.ch.send(type, payload, &err, pass_fd);
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
      std::lock_guard<std::mutex> t(g_conn_mu);
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

/// "still in the driver: cuStreamSynchronize (2 threads), ..." for a close
/// that timed out (the calls that kept it from draining are usually still
/// in flight right after it).
std::string calls_in_flight() {
  uint32_t what[64];
  const size_t n = gate().in_flight_calls(what, 64);
  std::map<std::string, int> names;
  for (size_t i = 0; i < n; ++i) {
    const char* name = what[i] > 0 ? entry_name(what[i] - 1) : nullptr;
    ++names[name ? name : "a driver call"];
  }
  std::string out;
  for (auto& [name, k] : names)
    out += (out.empty() ? "" : ", ") + name + (k > 1 ? " (" + std::to_string(k) + " threads)" : "");
  return out.empty() ? out : "still in the driver: " + out;
}

bool gate_closed() {
  int closed = 0;
  if (auto f = cusnap_shim_build_info.control->gate_state) f(&closed, nullptr, nullptr);
  return closed != 0;
}

/// A gate closed by a client of the control socket, kept by the listener's
/// thread alone. Such a gate that no client looks after any more (no control
/// connection open) opens again by itself after the hold (the cut's:
/// $CUSNAP_CUT_HOLD_MS, or the longer hold_ms of the last "arm"), unless a
/// "release" took shared memory away since it closed: that memory is then
/// gone, and only the coordinator's rebuild (or its guardian's) may let
/// threads on. A rebuild that brought back everything released (loads, a
/// reimport) leaves the gate to its hold again.
struct GateHold {
  bool closed_by_client = false;
  bool released = false;
  uint64_t armed_hold_ms = 0;
  /// The last moment a control connection was open (or the close).
  Clock::time_point contact;

  uint64_t hold_ms() const {
    static const uint64_t own = proto::env_number(proto::kCutHoldMs);
    return armed_hold_ms > own ? armed_hold_ms : own;
  }
  bool pending() const { return closed_by_client && !released; }
  Clock::time_point expiry() const { return contact + std::chrono::milliseconds(hold_ms()); }
};

/// Serves the control request queued whole on c. false: close the connection.
bool serve_control(State& s, Conn& c, GateHold& hold) {
  proto::Message msg;
  ListedFd brought;  // the descriptor that came with it
  std::string err;
  bool refused = false;
  if (!recv_request(c, &msg, &brought, &err, &refused)) {
    if (!refused) return false;
    // A client of another version, or a broken one, is told why; the
    // connection stays open, as for an unknown request.
    proto::Done d;
    d.error = "request refused: " + err;
    return reply(c, proto::kMsgDone, d);
  }
  bool sent;
  if (msg.type == proto::kMsgShimInspect) {
    sent = reply(c, proto::kMsgShimRecords, snapshot(s));
  } else if (msg.type == proto::kMsgGateClose) {
    proto::GateRequest g;
    proto::Done d;
    if (!msg.get(&g, &err)) {
      d.error = err;
    } else {
      d.code = cusnap_shim_build_info.control->gate_close(std::min(g.timeout_ms, kMaxGateCloseMs));
      d.ok = d.code == 0;
      if (d.code == ETIMEDOUT) d.error = calls_in_flight();
      if (d.ok) {
        hold.closed_by_client = true;
        hold.released = false;
      }
    }
    sent = reply(c, proto::kMsgDone, d);
  } else if (msg.type == proto::kMsgGateOpen) {
    proto::Done d;
    proto::GateOpen req;
    std::string why;
    const bool keep_cut = msg.get(&req, &why) && req.keep_cut;
    d.code = cusnap_shim_build_info.control->gate_open();
    if (!keep_cut) cut::release();  // held collective launches go on once the gate is open
    d.ok = d.code == 0 || d.code == EALREADY;
    hold.closed_by_client = hold.released = false;
    sent = reply(c, proto::kMsgDone, d);
  } else if (msg.type == proto::kMsgShimDrain) {
    // Only once the gate holds the application's threads: meanwhile they
    // begin stream captures and destroy contexts under the drain. On a
    // thread of its own, bounded: this listener must stay free to open the
    // gate (drain_thread.cpp). A request that names no time (0: an older
    // client's, "until it has finished") is bounded by the gate's hold: no
    // longer than the shim lets a gate stay closed with nobody to open it,
    // which is what the listener stuck in the drain would make it.
    proto::DrainRequest req;
    proto::Done d;
    if (!msg.get(&req, &err))
      d.error = err;
    else if (!gate_closed())
      d.error = "the gate is open: close it first";
    else
      d = drain_within(s, req.timeout_ms != 0 ? req.timeout_ms : hold.hold_ms());
    sent = reply(c, proto::kMsgDone, d);
  } else if (msg.type == proto::kMsgShimSave || msg.type == proto::kMsgShimLoad) {
    // One descriptor per message: parts 0..parts-2 are held, the last runs it.
    proto::AllocationRequest req;
    proto::Done d;
    if (!msg.get(&req, &err)) {
      d.error = err;
    } else if (!brought) {
      d.error = "no file descriptor came with the request";
    } else if (!gate_closed()) {
      d.error = "the gate is open: close it first";
    } else if (req.parts == 0 || req.parts > proto::kMaxParts || req.part >= req.parts ||
               req.part != c.parts.size() ||
               (!c.parts.empty() && (c.parts_of != req.allocation || c.parts_type != msg.type))) {
      d.error =
          "part " + std::to_string(req.part) + " of " + std::to_string(req.parts) + " out of order";
    } else {
      c.parts_of = req.allocation;
      c.parts_type = msg.type;
      c.parts.push_back(std::move(brought));
      if (c.parts.size() < req.parts) {
        d.ok = true;
      } else {
        // Each part's number must still name the file that came: the
        // application may have closed and reused one while they arrived.
        std::vector<int> fds;
        for (auto& f : c.parts)
          if (f.ours()) fds.push_back(f.get());
        if (fds.size() < c.parts.size())
          d.error = "the descriptor of a part was closed in the process";
        else
          d = msg.type == proto::kMsgShimSave ? save_allocation(s, req.allocation, fds)
                                              : load_allocation(s, req.allocation, fds);
        c.parts.clear();
        // The last released allocation loaded again: as after a reimport.
        if (d.ok && hold.released && !shared_released(s)) hold.released = false;
      }
    }
    if (!d.ok) c.parts.clear();
    sent = reply(c, proto::kMsgDone, d);
  } else if (msg.type == proto::kMsgShimRelease) {
    proto::ReleaseRequest req;
    proto::Done d;
    if (!msg.get(&req, &err)) {
      d.error = err;
    } else if (!gate_closed()) {
      d.error = "the gate is open: close it first";
    } else {
      d = release_shared(s, req.origin);
      // From here on only a gate-open lets the threads on, if memory is
      // gone (or marked to go: release_shared marks before it releases): a
      // release that found nothing of this process shared leaves the gate
      // to its hold.
      if (shared_released(s)) hold.released = true;
    }
    sent = reply(c, proto::kMsgDone, d);
  } else if (msg.type == proto::kMsgShimCut) {
    proto::CutRequest req;
    proto::CutState st;
    if (!msg.get(&req, &err)) {
      st.error = err;
    } else {
      st = cut::handle(req);
      if (req.op == "arm" && st.ok)
        hold.armed_hold_ms =
            req.hold_ms < proto::kMaxCutHoldMs ? req.hold_ms : proto::kMaxCutHoldMs;
    }
    sent = reply(c, proto::kMsgShimCutState, st);
  } else if (msg.type == proto::kMsgShimReimport) {
    proto::Done d = gate_closed() ? reimport_shared(s) : proto::Done{};
    if (!d.ok && d.error.empty()) d.error = "the gate is open: close it first";
    // Memory brought back: nothing guards the gate any more but its hold.
    if (d.ok && hold.released && !shared_released(s)) hold.released = false;
    sent = reply(c, proto::kMsgDone, d);
  } else {
    proto::Done d;
    d.error = "unknown request '" + msg.type + "'";
    sent = reply(c, proto::kMsgDone, d);
  }
  return sent;
}

/// Opens a gate that a client closed and no client looks after any more, once
/// its hold ran out (GateHold).
void open_unattended_gate(GateHold& hold, bool connections, Clock::time_point now) {
  if (connections) hold.contact = now;
  if (!hold.pending() || connections || now < hold.expiry()) return;
  hold.closed_by_client = false;
  if (!gate_closed()) return;  // opened in the process meanwhile
  cusnap_shim_build_info.control->gate_open();
  cut::release();
  say("the gate stayed closed %llu ms after its client went away; it is opened and the "
      "application goes on",
      static_cast<unsigned long long>(hold.hold_ms()));
}

/// The end of the control listener, however serve() ends (a poll error, its
/// socket closed or no longer its own, an exception): no client can reach the
/// gate or the cut any more. The cut is let go, and a gate a client closed is
/// opened at once, the shim saying so, unless a release came since the close
/// (GateHold): the memory it guards is then gone and only a rebuild could let
/// the threads on; the shim says that the gate stays closed.
void control_listener_ended(const GateHold& hold, const char* why) noexcept {
  cut::release();
  if (!hold.closed_by_client || !gate_closed()) return;
  if (hold.released) {
    say("the control socket's listener ended (%s) with the gate closed after a release of "
        "shared memory; no coordinator can rebuild it now, so the gate stays closed",
        why);
    return;
  }
  cusnap_shim_build_info.control->gate_open();
  say("the control socket's listener ended (%s) with the gate closed by a client; it is opened "
      "and the application goes on",
      why);
}

/// Runs control_listener_ended when the control listener's serve() returns or
/// an exception leaves it.
struct ControlEnd {
  ControlEnd(const GateHold& h, bool control) : hold(h), on(control) {}
  ControlEnd(const ControlEnd&) = delete;
  ControlEnd& operator=(const ControlEnd&) = delete;
  ~ControlEnd() {
    if (on) control_listener_ended(hold, why);
  }
  const GateHold& hold;
  const bool on;
  const char* why = "out of memory";  // an exception
};

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
        c.deadline = now + timeout();
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
    c->deadline = now + timeout();
    conns.push_back(std::move(c));
  }
}

void* listener_main(void* p) {
  ListenerArg arg = *static_cast<ListenerArg*>(p);
  delete static_cast<ListenerArg*>(p);
  (void)timeout();  // initialise the static before any fork can copy it half-done
  (void)GateHold{}.hold_ms();
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
  return nullptr;
}

bool spawn(State& s, int fd, bool peer) {
  auto* arg = new ListenerArg{&s, fd, peer};
  if (start_detached(listener_main, arg) == 0) return true;
  delete arg;
  return false;
}

}  // namespace

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

void conns_atfork_prepare() noexcept {
  g_conn_mu.lock();
}
void conns_atfork_parent() noexcept {
  g_conn_mu.unlock();
}
void conns_atfork_child() noexcept {
  for (auto& h : g_conn_fds) h.close_if_ours();  // fstat and close only
  g_conn_mu.unlock();
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
    // already running wakes at the shutdown, finds its socket no longer its
    // own and ends.
    if (listener_is_ours(s.peer_listen, s.peer_path)) ::shutdown(s.peer_listen, SHUT_RDWR);
    ::unlink(s.peer_path.c_str());
    ::unlink(s.ctl_path.c_str());
    close_listener(&s.peer_listen, s.peer_path);
    close_listener(&s.ctl_listen, s.ctl_path);
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
  // The export, from its receipt to its close: in g_conn_fds (listed), or
  // outside it when the table has no room (unlisted; the import goes on).
  ListedFd listed;
  UniqueFd unlisted;
  try {
    // The connection: in g_conn_fds from its socket to its close (Conn).
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
    // is queued, under g_conn_mu with its descriptor's entry (bounded as a
    // listener's receipt is): a fork in another application thread then
    // never waits on the creator, and a child it makes closes the copy.
    if (!await_whole(ch.fd(), Clock::now() + timeout(), err)) return false;
    proto::Message msg;
    bool got;
    {
      std::lock_guard<std::mutex> l(g_conn_mu);
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
