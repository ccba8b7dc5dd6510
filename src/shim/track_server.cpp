// The shim's two listeners and the importer's side of the peer exchange.
//
// Peer listener: answers "fetch" from the export cache alone (State::cache_mu);
// it never calls the driver and never takes the main lock, so a creator busy
// in a long driver call still serves its importers. Control listener: answers
// "inspect" (takes the main lock briefly) and drives the gate. Both run with
// every signal blocked, check the peer's uid (root or the shim's own), and
// bound every exchange by the control timeout ($CUSNAP_CONTROL_TIMEOUT).
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <map>

#include "proto/wire.h"
#include "shim/cut.h"
#include "shim/gate.h"
#include "shim/entries.h"
#include "shim/cut_control.h"
#include "shim/cusnap_shim.h"
#include "shim/track_state.h"

namespace cusnap::shim::track {

namespace {

std::chrono::milliseconds timeout() {
  static const auto t = proto::control_timeout_from_env();
  return t;
}

bool allowed(int fd, uid_t owner) {
  struct ucred cred {};
  std::string err;
  return proto::peer_credentials(fd, &cred, &err) && proto::peer_uid_allowed(cred.uid, owner);
}

void serve_peer(State& s, UniqueFd conn) {
  if (!allowed(conn.get(), s.uid)) return;
  proto::Channel ch(std::move(conn), timeout());
  ch.set_max_body(proto::kMaxRequestBytes);
  proto::Message msg;
  std::string err;
  bool refused = false;
  if (!ch.recv(&msg, &err, &refused)) {
    if (refused) {  // a peer of another version, or a broken one, is told why
      proto::FetchReply reply;
      reply.error = "request refused: " + err;
      ch.send(proto::kMsgFetched, reply, &err);
    }
    return;
  }
  proto::FetchReply reply;
  proto::FetchRequest req;
  if (msg.type != proto::kMsgFetch || !msg.get(&req, &err)) {
    reply.error = msg.type != proto::kMsgFetch ? "unknown request '" + msg.type + "'" : err;
    ch.send(proto::kMsgFetched, reply, &err);
    return;
  }
  int fd = -1;
  if (req.creator_start != s.start_time) {
    reply.error = "ticket names another process";
  } else {
    std::lock_guard<std::mutex> c(s.cache_mu);
    auto it = s.cache.find(req.allocation);
    if (it == s.cache.end())
      reply.error = "allocation " + std::to_string(req.allocation) + " is not exported";
    else if (!it->second.ours())
      reply.error = "the process closed the shim's descriptor of allocation " +
                    std::to_string(req.allocation);
    else
      fd = ::fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
    if (fd >= 0) {
      auto g = s.cache_gen.find(req.allocation);
      reply.generation = g == s.cache_gen.end() ? 0 : g->second;
    }
  }
  UniqueFd owned(fd);
  reply.ok = fd >= 0;
  if (!reply.ok && reply.error.empty()) reply.error = std::strerror(errno);
  ch.send(proto::kMsgFetched, reply, &err, fd);
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

void serve_control(State& s, UniqueFd conn) {
  if (!allowed(conn.get(), s.uid)) return;
  proto::Channel ch(std::move(conn), timeout());
  ch.set_max_body(proto::kMaxRequestBytes);
  std::vector<UniqueFd> parts;  // of a save or load still arriving
  uint64_t parts_of = 0;
  std::string parts_type;
  for (;;) {
    proto::Message msg;
    std::string err;
    bool refused = false;
    if (!ch.recv(&msg, &err, &refused)) {
      if (!refused) return;
      // A client of another version, or a broken one, is told why; the
      // connection stays open, as for an unknown request.
      proto::Done d;
      d.error = "request refused: " + err;
      if (!ch.send(proto::kMsgDone, d, &err)) return;
      continue;
    }
    bool sent;
    if (msg.type == proto::kMsgShimInspect) {
      sent = ch.send(proto::kMsgShimRecords, snapshot(s), &err);
    } else if (msg.type == proto::kMsgGateClose) {
      proto::GateRequest g;
      proto::Done d;
      if (!msg.get(&g, &err)) {
        d.error = err;
      } else {
        d.code = cusnap_shim_build_info.control->gate_close(g.timeout_ms);
        d.ok = d.code == 0;
        if (d.code == ETIMEDOUT) d.error = calls_in_flight();
      }
      sent = ch.send(proto::kMsgDone, d, &err);
    } else if (msg.type == proto::kMsgGateOpen) {
      proto::Done d;
      proto::GateOpen req;
      std::string why;
      const bool keep_cut = msg.get(&req, &why) && req.keep_cut;
      d.code = cusnap_shim_build_info.control->gate_open();
      if (!keep_cut) cut::release();  // held collective launches go on once the gate is open
      d.ok = d.code == 0 || d.code == EALREADY;
      sent = ch.send(proto::kMsgDone, d, &err);
    } else if (msg.type == proto::kMsgShimDrain) {
      sent = ch.send(proto::kMsgDone, drain(s), &err);
    } else if (msg.type == proto::kMsgShimSave || msg.type == proto::kMsgShimLoad) {
      // One descriptor per message: parts 0..parts-2 are held, the last runs it.
      proto::AllocationRequest req;
      proto::Done d;
      if (!msg.get(&req, &err)) {
        d.error = err;
      } else if (!msg.fd) {
        d.error = "no file descriptor came with the request";
      } else if (!gate_closed()) {
        d.error = "the gate is open: close it first";
      } else if (req.parts == 0 || req.parts > proto::kMaxParts || req.part >= req.parts ||
                 req.part != parts.size() ||
                 (!parts.empty() && (parts_of != req.allocation || parts_type != msg.type))) {
        d.error = "part " + std::to_string(req.part) + " of " + std::to_string(req.parts) +
                  " out of order";
      } else {
        parts_of = req.allocation;
        parts_type = msg.type;
        parts.push_back(std::move(msg.fd));
        if (parts.size() < req.parts) {
          d.ok = true;
        } else {
          std::vector<int> fds;
          for (auto& f : parts) fds.push_back(f.get());
          d = msg.type == proto::kMsgShimSave ? save_allocation(s, req.allocation, fds)
                                              : load_allocation(s, req.allocation, fds);
          parts.clear();
        }
      }
      if (!d.ok) parts.clear();
      sent = ch.send(proto::kMsgDone, d, &err);
    } else if (msg.type == proto::kMsgShimRelease) {
      proto::ReleaseRequest req;
      proto::Done d;
      if (!msg.get(&req, &err))
        d.error = err;
      else if (!gate_closed())
        d.error = "the gate is open: close it first";
      else
        d = release_shared(s, req.origin);
      sent = ch.send(proto::kMsgDone, d, &err);
    } else if (msg.type == proto::kMsgShimCut) {
      proto::CutRequest req;
      proto::CutState st;
      if (!msg.get(&req, &err))
        st.error = err;
      else
        st = cut::handle(req);
      sent = ch.send(proto::kMsgShimCutState, st, &err);
    } else if (msg.type == proto::kMsgShimReimport) {
      proto::Done d = gate_closed() ? reimport_shared(s) : proto::Done{};
      if (!d.ok && d.error.empty()) d.error = "the gate is open: close it first";
      sent = ch.send(proto::kMsgDone, d, &err);
    } else {
      proto::Done d;
      d.error = "unknown request '" + msg.type + "'";
      sent = ch.send(proto::kMsgDone, d, &err);
    }
    if (!sent) return;
  }
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

void* listener_main(void* p) {
  ListenerArg arg = *static_cast<ListenerArg*>(p);
  delete static_cast<ListenerArg*>(p);
  (void)timeout();  // initialise the static before any fork can copy it half-done
  // Not the application's to cancel: unwinding into the catch below would
  // abort the process.
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, nullptr);
  g_running.fetch_add(1, std::memory_order_release);
  for (;;) {
    struct pollfd pfd {
      arg.fd, POLLIN, 0
    };
    int n = ::poll(&pfd, 1, -1);
    if (n < 0 && errno != EINTR) return nullptr;
    if (n <= 0) continue;
    // The application closed the socket (POLLNVAL), or closed it and its
    // number now names a file of its own: never accept the application's
    // connections. The coordinator finds the socket gone.
    if ((pfd.revents & POLLNVAL) ||
        !listener_is_ours(arg.fd, arg.peer ? arg.s->peer_path : arg.s->ctl_path))
      return nullptr;
    UniqueFd conn;
    std::string err;
    if (!proto::accept_unix(arg.fd, &conn, &err)) {
      if (!err.empty()) back_off();  // empty: nothing pending any more
      continue;
    }
    try {
      if (arg.peer)
        serve_peer(*arg.s, std::move(conn));
      else
        serve_control(*arg.s, std::move(conn));
    } catch (...) {
    }
  }
}

bool spawn(State& s, int fd, bool peer) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t t;
  auto* arg = new ListenerArg{&s, fd, peer};
  int rc = pthread_create(&t, nullptr, listener_main, arg);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (rc != 0) {
    delete arg;
    return false;
  }
  pthread_detach(t);
  return true;
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
    if (!spawn(s, s.peer_listen, true) || !spawn(s, s.ctl_listen, false)) return false;
    for (int i = 0; i < 2000 && g_running.load(std::memory_order_acquire) < 2; ++i) {
      struct timespec ts {
        0, 500000
      };
      ::nanosleep(&ts, nullptr);
    }
    return true;
  } catch (...) {
    return false;
  }
}

int fetch_descriptor(const proto::Ticket& t, std::string* err, uint64_t* generation) noexcept {
  // Called from an import hook: connect, poll and recvmsg are cancellation
  // points, and a cancellation unwinding into the catch below (which does not
  // rethrow) makes the C library abort the process (gate.h, NoCancel).
  const NoCancel no_cancel;
  try {
    UniqueFd fd;
    if (!proto::connect_unix(t.socket, timeout(), &fd, err)) return -1;
    struct ucred cred {};
    if (!proto::peer_credentials(fd.get(), &cred, err)) return -1;
    if (!proto::peer_uid_allowed(cred.uid, state().uid) || cred.pid != t.creator_pid) {
      *err = "the peer socket is not the creator's";
      return -1;
    }
    proto::Channel ch(std::move(fd), timeout());
    ch.set_max_body(proto::kMaxRequestBytes);  // a fetched reply is as small
    proto::FetchRequest req{t.creator_start, t.allocation};
    if (!ch.send(proto::kMsgFetch, req, err)) return -1;
    proto::Message msg;
    if (!ch.recv(&msg, err)) return -1;
    proto::FetchReply reply;
    if (msg.type != proto::kMsgFetched || !msg.get(&reply, err)) {
      if (err->empty()) *err = "unexpected reply '" + msg.type + "'";
      return -1;
    }
    if (!reply.ok || !msg.fd) {
      *err = reply.error.empty() ? "no descriptor in the reply" : reply.error;
      return -1;
    }
    if (generation) *generation = reply.generation;
    return msg.fd.release();
  } catch (...) {
    *err = "out of memory";
    return -1;
  }
}

}  // namespace cusnap::shim::track
