// What the shim's two listeners share: a connection (Conn), the receipt of
// a request and the reply (track_server.cpp: the listeners' loop, the peer
// listener and the importer's side of the exchange), and the control
// listener's requests and its gate hold (track_control.cpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "proto/env_settings.h"
#include "proto/wire.h"
#include "shim/cut.h"
#include "shim/fork_table.h"
#include "shim/held_fd.h"
#include "shim/once.h"
#include "shim/track_state.h"

namespace cusnap::shim::track {

using Clock = std::chrono::steady_clock;

/// The bound of every exchange of the listeners and of an importer
/// ($CUSNAP_CONTROL_TIMEOUT), read once.
inline std::chrono::milliseconds exchange_timeout() {
  static OnceNumber ms;
  return std::chrono::milliseconds(
      ms.get([] { return uint64_t(proto::control_timeout_from_env().count()); }));
}

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
    std::lock_guard<std::mutex> l(fork_table_mutex());
    fork_table_clear_locked(slot);
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
  /// closed first when the listener has kMaxListenerConnections and more
  /// come.
  Clock::time_point last;
  /// A save or load whose parts are still arriving (control).
  std::vector<ListedFd> parts;
  uint64_t parts_of = 0;
  std::string parts_type;
  /// Its entry in the fork table; -1 before the accept.
  std::ptrdiff_t slot = -1;
};

/// The longest the receipt of a request may wait under the fork table's
/// lock: none should (serve takes a request only once queued says it is all
/// there), but a fork in the application must never wait on a client.
constexpr auto kRecvUnderLock = std::chrono::milliseconds(20);

/// Receives the request queued whole on c (Channel::recv), the descriptor
/// that came with it into *fd, in one step with its entry as a fork sees it.
/// false as recv (the connection then dropped unless *refused); also, with
/// *refused, when the table has no room for the descriptor.
bool recv_request(Conn& c, proto::Message* msg, ListedFd* fd, std::string* err, bool* refused);

/// Sends a reply on c while its number still names its socket; false
/// otherwise (drop the connection, its number left alone) and when the send
/// fails.
template <class T>
bool reply(Conn& c, std::string_view type, const T& payload, int pass_fd = -1) {
  std::string err;
  return c.ours() && c.ch.send(type, payload, &err, pass_fd);
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
    const uint64_t own = cut::own_hold_ms();
    return armed_hold_ms > own ? armed_hold_ms : own;
  }
  bool pending() const { return closed_by_client && !released; }
  Clock::time_point expiry() const { return contact + std::chrono::milliseconds(hold_ms()); }
};

/// Serves the control request queued whole on c. false: close the connection.
bool serve_control(State& s, Conn& c, GateHold& hold);

/// Opens a gate that a client closed and no client looks after any more, once
/// its hold ran out (GateHold).
void open_unattended_gate(GateHold& hold, bool connections, Clock::time_point now);

/// The end of the control listener, however serve() ends (a poll error, its
/// socket closed or no longer its own, an exception): no client can reach the
/// gate or the cut any more. The cut is let go, and a gate a client closed is
/// opened at once, the shim saying so, unless a release came since the close
/// (GateHold): the memory it guards is then gone and only a rebuild could let
/// the threads on; the shim says that the gate stays closed.
void control_listener_ended(const GateHold& hold, const char* why) noexcept;

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

}  // namespace cusnap::shim::track
