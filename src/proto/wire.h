// The wire format shared by the CLI, the supervisor and the shims.
//
// A message is a u32 little-endian length followed by a MessagePack body: the
// array [version, type, payload], where version is kProtocolVersion, type a
// string naming the message and payload any MessagePack value (usually a map
// made with MSGPACK_DEFINE_MAP). Bodies are at most kMaxMessageBytes, and a
// server's requests at most kMaxRequestBytes (Channel::set_max_body); a body
// with trailing bytes, another version or another shape is rejected, and so is
// one nested deeper than kMaxNesting or whose array or map counts exceed what
// its bytes can hold (decoding allocates at most one 24-byte object per byte
// of the body, which is why servers take short requests only). At most
// one descriptor travels with a message, through SCM_RIGHTS attached to its
// first byte; it is received close-on-exec, and a message that carries more,
// other control data, or truncated control data is rejected with every
// descriptor it carried closed.
//
// Transport is a Unix stream socket, non-blocking, driven by poll: every send
// and receive of a whole message is bounded by the channel's timeout. Sends use
// MSG_NOSIGNAL. Errors follow the project convention: false + *err.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <msgpack.hpp>
#include <string>
#include <string_view>

#include "proto/unique_fd.h"

namespace cusnap::proto {

inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr size_t kMaxMessageBytes = 32u << 20;  ///< body limit: 32 MiB
inline constexpr std::chrono::milliseconds kDefaultTimeout{10000};
inline constexpr size_t kMaxNesting = 32;  ///< arrays and maps in a body nest at most this deep
/// The most a server (a shim's sockets, a supervisor's control socket) takes
/// in one request: the largest it serves, a checkpoint request with a
/// PATH_MAX directory and every setting, is under 6 KiB. A decoded body takes
/// up to 24 bytes of memory per byte (one object per nil), so a full-size
/// body sent to a shim would cost the workload's process some 768 MiB.
inline constexpr size_t kMaxRequestBytes = 64u << 10;

/// A received message. payload owns its memory; fd is the descriptor that came
/// with it, if any.
struct Message {
  std::string type;
  msgpack::object_handle payload;
  UniqueFd fd;

  /// Converts the payload into T; false + *err when its shape does not fit.
  template <class T>
  bool get(T* out, std::string* err) const {
    try {
      payload.get().convert(*out);
      return true;
    } catch (const std::exception& e) {
      *err = "malformed '" + type + "' message: " + e.what();
      return false;
    }
  }
};

/// The body of a message of the given protocol version: [version, type, payload].
template <class T>
std::string encode_body_of_version(uint32_t version, std::string_view type, const T& payload) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_array(3);
  pk.pack(version);
  pk.pack(std::string(type));
  pk.pack(payload);
  return std::string(buf.data(), buf.size());
}

/// The body of a message: [kProtocolVersion, type, payload].
template <class T>
std::string encode_body(std::string_view type, const T& payload) {
  return encode_body_of_version(kProtocolVersion, type, payload);
}

/// Parses and validates a body (size, one object, no trailing bytes, version,
/// shape). Leaves out->fd alone.
bool decode_body(std::string_view body, Message* out, std::string* err);

/// The frame of a body: u32 little-endian length, then the body.
std::string frame(std::string_view body);

/// One end of a connection. Owns the socket.
class Channel {
 public:
  Channel() = default;
  explicit Channel(UniqueFd fd, std::chrono::milliseconds timeout = kDefaultTimeout);

  /// Sends one framed body, with pass_fd attached when >= 0 (not closed here).
  bool send_body(std::string_view body, int pass_fd, std::string* err);
  template <class T>
  bool send(std::string_view type, const T& payload, std::string* err, int pass_fd = -1) {
    std::string body = encode_body(type, payload);
    return send_body(body, pass_fd, err);
  }
  /// Receives one framed body and the descriptor that came with it.
  bool recv_body(std::string* body, UniqueFd* fd, std::string* err);
  /// Receives and decodes one message. An orderly close before the first byte
  /// gives false with *err = "connection closed". When refused is given, it
  /// says whether a whole body arrived but was not a valid message (another
  /// version, another shape): a server answers that with an error, and the
  /// channel stays usable.
  bool recv(Message* out, std::string* err, bool* refused = nullptr);

  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }
  /// The longest body recv accepts (at most kMaxMessageBytes); a longer one
  /// is refused from its length, unread, and closes the channel.
  void set_max_body(size_t n) { max_body_ = n < kMaxMessageBytes ? n : kMaxMessageBytes; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  int fd() const { return fd_.get(); }
  bool valid() const { return static_cast<bool>(fd_); }
  /// Gives the descriptor up without closing it (the channel is closed
  /// after): for an owner that finds its number now names another's file.
  int release() { return fd_.release(); }

 private:
  UniqueFd fd_;
  std::chrono::milliseconds timeout_ = kDefaultTimeout;
  size_t max_body_ = kMaxMessageBytes;
};

/// Connects to a listening Unix socket within timeout. The socket is
/// close-on-exec and non-blocking. A socket that refuses (bound, not yet
/// listening; or its process gone) is tried again for 200 ms at most.
bool connect_unix(const std::string& path, std::chrono::milliseconds timeout, UniqueFd* out,
                  std::string* err);
/// Binds and listens on path (which must not exist) with the given mode. The
/// socket is close-on-exec and non-blocking.
bool listen_unix(const std::string& path, mode_t mode, UniqueFd* out, std::string* err);
/// Accepts one connection (close-on-exec, non-blocking). false with *err empty
/// when nothing is pending; with *err set when accept failed otherwise (out
/// of descriptors or memory among others: a caller's loop should wait before
/// trying again, the connection stays pending).
bool accept_unix(int listen_fd, UniqueFd* out, std::string* err);
/// A connected pair (close-on-exec, non-blocking), for tests and helpers.
bool socket_pair(UniqueFd* a, UniqueFd* b, std::string* err);

/// The peer's credentials as the kernel recorded them at connect time.
bool peer_credentials(int fd, struct ucred* out, std::string* err);
/// Whether a peer running as peer_uid may use a job owned by owner_uid: only
/// root and the owner may.
inline bool peer_uid_allowed(uid_t peer_uid, uid_t owner_uid) {
  return peer_uid == 0 || peer_uid == owner_uid;
}

/// The control timeout: CUSNAP_CONTROL_TIMEOUT (seconds, may be fractional)
/// when set and valid, else fallback.
std::chrono::milliseconds control_timeout_from_env(
    std::chrono::milliseconds fallback = kDefaultTimeout);

}  // namespace cusnap::proto
