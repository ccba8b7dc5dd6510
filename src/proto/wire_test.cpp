#include "proto/wire.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <doctest/doctest.h>
#include <atomic>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "proto/control.h"
#include "proto/shim_messages.h"

using namespace cusnap;
using namespace cusnap::proto;

namespace {

int open_fd_count() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/// Sends a raw frame with any number of descriptors attached.
void send_raw(int sock, const std::string& data, const std::vector<int>& fds) {
  iovec iov{const_cast<char*>(data.data()), data.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * (fds.empty() ? 1 : fds.size())));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  REQUIRE(sendmsg(sock, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(data.size()));
}

struct Pair {
  Channel a, b;
  Pair(std::chrono::milliseconds t = std::chrono::milliseconds(2000)) {
    UniqueFd x, y;
    std::string err;
    REQUIRE(socket_pair(&x, &y, &err));
    a = Channel(std::move(x), t);
    b = Channel(std::move(y), t);
  }
};

}  // namespace

TEST_CASE("wire: a message round-trips with its type and payload") {
  Pair p;
  std::string err;
  CheckpointRequest req{"/tmp/x", true, 1234, {{"CUSNAP_HASH_THREADS", "3"}}};
  REQUIRE(p.a.send(kMsgCheckpoint, req, &err));
  Message m;
  REQUIRE(p.b.recv(&m, &err));
  CHECK(m.type == "checkpoint");
  CheckpointRequest got;
  REQUIRE(m.get(&got, &err));
  CHECK(got.dir == "/tmp/x");
  CHECK(got.leave_running);
  CHECK(got.timeout_ms == 1234);
  CHECK(got.settings == req.settings);
  CHECK(!m.fd);
}

TEST_CASE("wire: a large message crosses in pieces within the timeout") {
  Pair p;
  std::string big(8u << 20, 'x');
  std::string err, err2;
  std::thread t([&] { CHECK(p.a.send("blob", big, &err2)); });
  Message m;
  REQUIRE(p.b.recv(&m, &err));
  t.join();
  std::string got;
  REQUIRE(m.get(&got, &err));
  CHECK(got == big);
}

TEST_CASE("wire: bodies with trailing bytes, other versions or other shapes are rejected") {
  Message m;
  std::string err;
  std::string good = encode_body("hello", Empty{});
  REQUIRE(decode_body(good, &m, &err));
  CHECK(!decode_body(good + "x", &m, &err));
  CHECK(err.find("trailing") != std::string::npos);

  const std::string other = encode_body_of_version(kProtocolVersion + 1, "hello", Empty{});
  CHECK(!decode_body(other, &m, &err));
  CHECK(err.find("version") != std::string::npos);

  msgpack::sbuffer b2;
  msgpack::pack(b2, std::string("just a string"));
  CHECK(!decode_body(std::string_view(b2.data(), b2.size()), &m, &err));
  CHECK(!decode_body("", &m, &err));
  CHECK(!decode_body(std::string_view("\xc1", 1), &m, &err));      // never-used byte
  CHECK(!decode_body(good.substr(0, good.size() - 1), &m, &err));  // truncated
}

namespace {
struct OldTimeoutRequest {  // TimeoutRequest before it carried settings
  int64_t timeout_ms = 0;
  MSGPACK_DEFINE_MAP(timeout_ms);
};
}  // namespace

TEST_CASE("wire: recv says which failures were a refused body, leaving the channel usable") {
  Pair p;
  std::string err;
  const std::string other = encode_body_of_version(kProtocolVersion + 1, "hello", Empty{});
  REQUIRE(p.a.send_body(other, -1, &err));
  Message m;
  bool refused = false;
  CHECK(!p.b.recv(&m, &err, &refused));
  CHECK(refused);
  CHECK(err.find("unsupported protocol version 2") != std::string::npos);
  // The next message on the same channel arrives whole.
  REQUIRE(p.a.send("t", Empty{}, &err));
  REQUIRE(p.b.recv(&m, &err, &refused));
  CHECK(!refused);
  CHECK(m.type == "t");
  // A transport failure is not a refusal.
  p.a = Channel();
  CHECK(!p.b.recv(&m, &err, &refused));
  CHECK(err == "connection closed");
  CHECK(!refused);
}

TEST_CASE("wire: a request without settings, as an older client sends it, decodes") {
  Pair p;
  std::string err;
  REQUIRE(p.a.send(kMsgSuspend, OldTimeoutRequest{2500}, &err));
  Message m;
  REQUIRE(p.b.recv(&m, &err));
  TimeoutRequest fresh;
  REQUIRE(m.get(&fresh, &err));
  CHECK(fresh.timeout_ms == 2500);
  CHECK(fresh.settings.empty());
  // With settings, they round-trip.
  REQUIRE(
      p.a.send(kMsgSuspend, TimeoutRequest{3000, {{"CUSNAP_ALLOW_RANKS_SHARING_GPU", "1"}}}, &err));
  REQUIRE(p.b.recv(&m, &err));
  REQUIRE(m.get(&fresh, &err));
  CHECK(fresh.timeout_ms == 3000);
  CHECK(fresh.settings.at("CUSNAP_ALLOW_RANKS_SHARING_GPU") == "1");
}

TEST_CASE("wire: gate-open without fields, as an older coordinator sends it, lets the cut go") {
  Pair p;
  std::string err;
  REQUIRE(p.a.send(kMsgGateOpen, Empty{}, &err));
  Message m;
  REQUIRE(p.b.recv(&m, &err));
  GateOpen g;  // decoded into a fresh request, as the shim does
  REQUIRE(m.get(&g, &err));
  CHECK_FALSE(g.keep_cut);
  GateOpen keep;
  keep.keep_cut = true;
  REQUIRE(p.a.send(kMsgGateOpen, keep, &err));
  REQUIRE(p.b.recv(&m, &err));
  REQUIRE(m.get(&g, &err));
  CHECK(g.keep_cut);
}

TEST_CASE("wire: a payload of the wrong shape fails conversion, not the process") {
  Pair p;
  std::string err;
  REQUIRE(p.a.send(kMsgCheckpoint, std::string("not a map"), &err));
  Message m;
  REQUIRE(p.b.recv(&m, &err));
  CheckpointRequest r;
  CHECK(!m.get(&r, &err));
  CHECK(err.find("malformed") != std::string::npos);
}

TEST_CASE("wire: a length over the limit is rejected before reading the body") {
  Pair p;
  std::string hdr(4, '\0');
  uint32_t n = kMaxMessageBytes + 1;
  std::memcpy(hdr.data(), &n, 4);  // little-endian host
  send_raw(p.a.fd(), hdr, {});
  Message m;
  std::string err;
  CHECK(!p.b.recv(&m, &err));
  CHECK(err.find("out of range") != std::string::npos);
  std::string body(kMaxMessageBytes + 1, 'x');
  CHECK(!p.a.send_body(body, -1, &err));
}

TEST_CASE("wire: a channel's own limit refuses a longer body unread and closes") {
  Pair p;
  p.b.set_max_body(64);
  std::string err;
  const std::string fits = encode_body("t", std::string(50, 'x'));
  REQUIRE(fits.size() <= 64);
  REQUIRE(p.a.send_body(fits, -1, &err));
  Message m;
  REQUIRE(p.b.recv(&m, &err));
  CHECK(m.type == "t");
  // One byte over: refused from the length, before the body is read.
  REQUIRE(p.a.send_body(std::string(65, '\x90'), -1, &err));
  CHECK(!p.b.recv(&m, &err));
  CHECK(err == "message length 65 is out of range (1 to 64 bytes)");
  CHECK(!p.b.valid());
  // The limit never exceeds the protocol's.
  Pair q;
  q.b.set_max_body(kMaxMessageBytes * 2);
  std::string hdr(4, '\0');
  uint32_t n = kMaxMessageBytes + 1;
  std::memcpy(hdr.data(), &n, 4);  // little-endian host
  send_raw(q.a.fd(), hdr, {});
  CHECK(!q.b.recv(&m, &err));
  CHECK(err.find("out of range (1 to " + std::to_string(kMaxMessageBytes) + " bytes)") !=
        std::string::npos);
}

TEST_CASE("wire: the largest request a server takes fits its limit with room") {
  // A checkpoint request with a PATH_MAX directory and every client setting
  // at its longest: well under kMaxRequestBytes.
  CheckpointRequest r;
  r.dir = "/" + std::string(4095, 'd');  // the longest validate accepts
  r.leave_running = true;
  r.timeout_ms = int64_t(7) * 24 * 3600 * 1000;
  for (const char* k : kClientSettings) r.settings[k] = std::string(kMaxSettingBytes, '9');
  const std::string body = encode_body(kMsgCheckpoint, r);
  CHECK(body.size() < 6 * 1024);
  CHECK(body.size() * 8 < kMaxRequestBytes);
  std::string err;
  CHECK(validate(r, &err));
}

TEST_CASE("wire: one descriptor passes, close-on-exec") {
  Pair p;
  int pfd[2];
  REQUIRE(pipe2(pfd, O_CLOEXEC) == 0);
  UniqueFd r(pfd[0]), w(pfd[1]);
  std::string err;
  REQUIRE(p.a.send("pipe", Empty{}, &err, w.get()));
  Message m;
  REQUIRE(p.b.recv(&m, &err));
  REQUIRE(m.fd);
  CHECK(m.fd.get() != w.get());
  CHECK((fcntl(m.fd.get(), F_GETFD) & FD_CLOEXEC) != 0);
  REQUIRE(write(m.fd.get(), "k", 1) == 1);
  char c = 0;
  REQUIRE(read(r.get(), &c, 1) == 1);
  CHECK(c == 'k');
}

TEST_CASE("wire: two descriptors in one message are rejected and both closed") {
  Pair p;
  int pfd[2];
  REQUIRE(pipe2(pfd, O_CLOEXEC) == 0);
  UniqueFd r(pfd[0]), w(pfd[1]);
  int before = open_fd_count();
  send_raw(p.a.fd(), frame(encode_body("x", Empty{})), {r.get(), w.get()});
  Message m;
  std::string err;
  CHECK(!p.b.recv(&m, &err));
  CHECK(err.find("at most one") != std::string::npos);
  CHECK(open_fd_count() == before);
}

TEST_CASE("wire: truncated control data is rejected without leaking a descriptor") {
  Pair p;
  int pfd[2];
  REQUIRE(pipe2(pfd, O_CLOEXEC) == 0);
  UniqueFd r(pfd[0]), w(pfd[1]);
  std::vector<int> many(40, r.get());  // more than the receiver's control buffer holds
  int before = open_fd_count();
  send_raw(p.a.fd(), frame(encode_body("x", Empty{})), many);
  Message m;
  std::string err;
  CHECK(!p.b.recv(&m, &err));
  CHECK(err.find("truncated") != std::string::npos);
  // The refused bytes were read: the stream is out of step, and the
  // channel closed (its own descriptor, too, is gone).
  CHECK(p.b.fd() < 0);
  CHECK(open_fd_count() == before - 1);
}

TEST_CASE("wire: a length read in part closes the channel; a wait with nothing read does not") {
  Pair p(std::chrono::milliseconds(100));
  Message m;
  std::string err;
  CHECK(!p.b.recv(&m, &err));
  CHECK(err == "timed out waiting for a message");
  REQUIRE(p.b.fd() >= 0);  // nothing was read: a later recv may wait again
  const std::string f = frame(encode_body("x", Empty{}));
  send_raw(p.a.fd(), f.substr(0, 2), {});
  CHECK(!p.b.recv(&m, &err));
  CHECK(err == "timed out in the middle of a message");
  // Half a length was taken: what follows is not a message's start.
  CHECK(p.b.fd() < 0);
  CHECK(!p.b.recv(&m, &err));
  CHECK(err == "channel is closed");
}

TEST_CASE("wire: counts that add up past the body's size are refused before decoding") {
  Message m;
  std::string err;
  // [1, "t", [[[ ... ]]]]: 31 nested array32 headers, each claiming 60000
  // elements. Each count alone is within the body's size; together they
  // would have the decoder allocate some 45 MiB for a 64 KiB body.
  std::string body("\x93\x01\xa1t", 4);
  for (int i = 0; i < 31; ++i) body += std::string("\xdd\x00\x00\xea\x60", 5);
  body.resize(64u << 10, '\xc0');  // nils: the bytes the counts are checked against
  CHECK(!decode_body(body, &m, &err));
  CHECK(err == "message declares more array and map elements than its 65536 bytes can hold");

  // Deeper than kMaxNesting: refused by name.
  std::string deep("\x93\x01\xa1t", 4);
  for (size_t i = 0; i < kMaxNesting + 1; ++i) deep += '\x91';
  deep += '\xc0';
  CHECK(!decode_body(deep, &m, &err));
  CHECK(err.find("deeper than 32 levels") != std::string::npos);

  // A body whose counts are true, as deep as allowed, decodes.
  std::string ok("\x93\x01\xa1t", 4);
  for (size_t i = 0; i < kMaxNesting - 1; ++i) ok += '\x92';
  ok += std::string(kMaxNesting, '\xc0');
  REQUIRE(decode_body(ok, &m, &err));
  CHECK(m.type == "t");
}

TEST_CASE("wire: a descriptor with a malformed body is closed") {
  Pair p;
  int pfd[2];
  REQUIRE(pipe2(pfd, O_CLOEXEC) == 0);
  UniqueFd r(pfd[0]), w(pfd[1]);
  int before = open_fd_count();
  send_raw(p.a.fd(), frame(encode_body("x", Empty{}) + "junk"), {r.get()});
  Message m;
  std::string err;
  CHECK(!p.b.recv(&m, &err));
  CHECK(!m.fd);
  CHECK(open_fd_count() == before);
}

TEST_CASE("wire: receiving times out, also in the middle of a message") {
  Pair p(std::chrono::milliseconds(100));
  Message m;
  std::string err;
  auto t0 = std::chrono::steady_clock::now();
  CHECK(!p.b.recv(&m, &err));
  CHECK(err.find("timed out") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
  std::string f = frame(encode_body("x", Empty{}));
  send_raw(p.a.fd(), f.substr(0, f.size() - 1), {});
  CHECK(!p.b.recv(&m, &err));
  CHECK(err.find("middle") != std::string::npos);
}

TEST_CASE("wire: a closed peer is reported, and sending to it does not raise SIGPIPE") {
  Pair p;
  Channel gone = std::move(p.a);
  gone = Channel();
  Message m;
  std::string err;
  CHECK(!p.b.recv(&m, &err));
  CHECK(err == "connection closed");
  CHECK(!p.b.send("x", Empty{}, &err));  // EPIPE, not a signal
}

TEST_CASE("wire: release gives the descriptor up unclosed and leaves the channel closed") {
  Pair p;
  const int fd = p.a.fd();
  CHECK(p.a.release() == fd);
  CHECK(!p.a.valid());
  CHECK(::fcntl(fd, F_GETFD) >= 0);  // still open: not the channel's any more
  std::string err;
  CHECK(!p.a.send("x", Empty{}, &err));
  CHECK(err == "channel is closed");
  p.a = Channel();  // closes nothing
  CHECK(::fcntl(fd, F_GETFD) >= 0);
  ::close(fd);
}

TEST_CASE("wire: peer credentials name this process") {
  Pair p;
  ucred c{};
  std::string err;
  REQUIRE(peer_credentials(p.b.fd(), &c, &err));
  CHECK(c.pid == getpid());
  CHECK(c.uid == getuid());
  CHECK(peer_uid_allowed(0, 1000));
  CHECK(peer_uid_allowed(1000, 1000));
  CHECK(!peer_uid_allowed(1001, 1000));
}

TEST_CASE("wire: a socket bound and not yet listening is tried again for a moment") {
  char tmpl[] = "/tmp/cusnap-wire-XXXXXX";
  REQUIRE(mkdtemp(tmpl));
  const std::string path = std::string(tmpl) + "/s.sock";
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strncpy(sa.sun_path, path.c_str(), sizeof sa.sun_path - 1);
  UniqueFd l(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(l);
  REQUIRE(::bind(l.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  // A server between its bind and its listen (descheduled there): found,
  // refused, then listening 50 ms later.
  std::thread server([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ::listen(l.get(), 4);
  });
  UniqueFd c;
  std::string err;
  const bool connected = connect_unix(path, std::chrono::seconds(5), &c, &err);
  server.join();
  CHECK_MESSAGE(connected, err);
  // One that never listens (its process gone): refused after the grace,
  // not after the whole timeout.
  UniqueFd stale(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const std::string dead = std::string(tmpl) + "/dead.sock";
  std::strncpy(sa.sun_path, dead.c_str(), sizeof sa.sun_path - 1);
  REQUIRE(::bind(stale.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  UniqueFd none;
  CHECK_FALSE(connect_unix(dead, std::chrono::seconds(30), &none, &err));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
  CHECK(err.find("Connection refused") != std::string::npos);
  unlink(path.c_str());
  unlink(dead.c_str());
  rmdir(tmpl);
}

TEST_CASE("wire: listen with a mode, connect, accept") {
  char tmpl[] = "/tmp/cusnap-wire-XXXXXX";
  REQUIRE(mkdtemp(tmpl));
  std::string path = std::string(tmpl) + "/s.sock";
  UniqueFd l;
  std::string err;
  REQUIRE(listen_unix(path, 0600, &l, &err));
  struct stat st;
  REQUIRE(stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  UniqueFd c, s;
  REQUIRE(connect_unix(path, std::chrono::milliseconds(500), &c, &err));
  REQUIRE(accept_unix(l.get(), &s, &err));
  CHECK((fcntl(s.get(), F_GETFD) & FD_CLOEXEC) != 0);
  UniqueFd none;
  CHECK(!connect_unix(std::string(tmpl) + "/missing.sock", std::chrono::milliseconds(200), &none,
                      &err));
  unlink(path.c_str());
  // The mode holds with any umask, and the process's umask is never touched
  // (the shim binds inside an application, whose threads create files): a
  // thread reading it all the while sees only the application's.
  const mode_t app_umask = 0002;
  const mode_t before = umask(app_umask);
  std::atomic<bool> done{false};
  std::set<std::string> seen;
  std::thread watch([&] {
    while (!done) {
      std::ifstream f("/proc/self/status");
      for (std::string line; std::getline(f, line);)
        if (line.rfind("Umask:", 0) == 0) seen.insert(line.substr(6));
    }
  });
  bool modes_ok = true;
  for (int i = 0; i < 300; ++i) {
    UniqueFd m;
    if (!listen_unix(path, 0600, &m, &err) || stat(path.c_str(), &st) != 0 ||
        (st.st_mode & 0777) != 0600)
      modes_ok = false;
    unlink(path.c_str());
  }
  done = true;
  watch.join();
  umask(before);
  CHECK(modes_ok);
  CHECK(seen.size() == 1);
  CHECK(seen.count("\t0002") == 1);
  rmdir(tmpl);
}

TEST_CASE("wire: the control timeout comes from the environment when valid") {
  setenv("CUSNAP_CONTROL_TIMEOUT", "2.5", 1);
  CHECK(control_timeout_from_env().count() == 2500);
  setenv("CUSNAP_CONTROL_TIMEOUT", "nope", 1);
  CHECK(control_timeout_from_env() == kDefaultTimeout);
  setenv("CUSNAP_CONTROL_TIMEOUT", "-1", 1);
  CHECK(control_timeout_from_env() == kDefaultTimeout);
  unsetenv("CUSNAP_CONTROL_TIMEOUT");
  CHECK(control_timeout_from_env() == kDefaultTimeout);
}

TEST_CASE("control: requests are validated beyond their types") {
  std::string err;
  CHECK(validate(CheckpointRequest{"/a", false, 1000, {}}, &err));
  CHECK(!validate(CheckpointRequest{"relative", false, 1000, {}}, &err));
  CHECK(!validate(CheckpointRequest{"/a", false, 0, {}}, &err));
  CHECK(!validate(TimeoutRequest{-5, {}}, &err));
  CHECK(validate(TimeoutRequest{1000, {{"CUSNAP_ALLOW_RANKS_SHARING_GPU", "1"}}}, &err));
  CHECK(!validate(TimeoutRequest{1000, {{"PATH", "/x"}}}, &err));
  CHECK(err.find("unknown setting 'PATH'") != std::string::npos);
  // Settings: the known names only, short values.
  CHECK(validate(CheckpointRequest{"/a", false, 1000, {{"CUSNAP_CRIU_GHOST_LIMIT", "4G"}}}, &err));
  CHECK(!validate(CheckpointRequest{"/a", false, 1000, {{"LD_PRELOAD", "/x.so"}}}, &err));
  CHECK(err.find("unknown setting 'LD_PRELOAD'") != std::string::npos);
  CHECK(!validate(
      CheckpointRequest{"/a", false, 1000, {{"CUSNAP_CRIU_GHOST_LIMIT", std::string(65, '1')}}},
      &err));
  CHECK(!validate(
      CheckpointRequest{"/a", false, 1000, {{"CUSNAP_HASH_THREADS", std::string("1\0", 2)}}},
      &err));
}
