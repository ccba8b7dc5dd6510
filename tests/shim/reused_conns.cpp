// A connection's descriptor number that the application closes and reuses,
// under the preloaded shim against the simulated driver: ctest
// shim.track.reused_conns.
//
// A workload process (forked before any CUDA activity, its control timeout
// 2 s) acts on the test's commands; the test's own process is the
// coordinator. For each listener, control and peer: the test connects (the
// control connection makes one exchange), then the workload puts a socket of
// its own at the number of the listener's connection (dup2 onto it: a
// close-every-descriptor loop followed by an open, in one step), with a whole
// request of the shim's protocol queued on it, and the test's client sends a
// request. After the control timeout:
//   - the workload's socket is still open at that number, nothing of what was
//     queued on it was read, and nothing was written to it (before the fix
//     the listener went on with the number: it read the queued request,
//     answered it into the application's socket, and closed the number at
//     the connection's end, the peer listener at once)
//   - a new client of the same listener is served
// And for the parts of a save, which the control listener holds while they
// arrive: the test closes the gate and sends the first of two parts of a
// save of the workload's allocation; the workload puts a file of its own at
// that part's number; the second part is refused, naming the closed
// descriptor, and the workload's file is neither written, truncated nor
// closed (before the fix the save wrote the allocation's bytes into it).
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>

#include "tests/fakecuda/fakecuda_test_util.h"
#include "tests/shim/ckpt_client.h"
#include "tests/shim/workload_cmds.h"

using namespace fctest;
using namespace ckpt_client;
using cmds::command;

namespace {

constexpr long kControlTimeoutMs = 2000;  // $CUSNAP_CONTROL_TIMEOUT of the workload

enum Cmd : uint64_t {
  kInit = 1,  // context (the shim's listeners start)
  kMark,      // notes the workload's sockets
  kSteal,  // the one socket new since kMark replaced by one of the workload's; replies its number
  kCheck,  // replies what befell that socket (Harm bits, 0: nothing), and closes it
  kAlloc,  // a VMM allocation (the shim tracks it)
  kStealPart,  // a file of the workload's at the number of the part file kPartTag
  kCheckFile,  // replies what befell that file (Harm bits), and closes it
};

constexpr const char* kPartTag = "part-0-of-a-save";
constexpr const char* kOwnText = "the application's own file";

/// What the listener did to the application's socket.
enum Harm : uint64_t { kClosed = 1, kRead = 2, kWritten = 4 };

/// The workload's socket at the connection's number: keep is another
/// descriptor of the same socket (it stays open whatever befalls the number),
/// other the far end.
struct Own {
  int number = -1, keep = -1, other = -1;
  dev_t dev = 0;
  ino_t ino = 0;
  size_t queued = 0;
};

std::set<std::string> g_marked;
Own g_own;
VmmBuffer g_buf;

int act(uint64_t cmd, uint64_t* value) {
  switch (cmd) {
    case kInit:
      FC_REQ(init_primary() == CUDA_SUCCESS);
      return 0;
    case kMark:
      g_marked.clear();
      for (auto& [ino, fd] : cmds::sockets_of(getpid())) g_marked.insert(ino);
      return 0;
    case kSteal: {
      int number = -1, found = 0;
      for (auto& [ino, fd] : cmds::sockets_of(getpid()))
        if (!g_marked.count(ino)) {
          number = fd;
          ++found;
        }
      FC_REQ(found == 1);
      int sv[2];
      FC_REQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
      // A whole request queued: a listener that reads the number answers it.
      const std::string f =
          proto::frame(proto::encode_body(proto::kMsgShimInspect, proto::Empty{}));
      FC_REQ(write(sv[1], f.data(), f.size()) == static_cast<ssize_t>(f.size()));
      FC_REQ(dup2(sv[0], number) == number);
      struct stat st;
      FC_REQ(fstat(number, &st) == 0);
      g_own = Own{number, sv[0], sv[1], st.st_dev, st.st_ino, f.size()};
      *value = static_cast<uint64_t>(number);
      return 0;
    }
    case kCheck: {
      struct stat st;
      if (fstat(g_own.number, &st) != 0 || st.st_dev != g_own.dev || st.st_ino != g_own.ino)
        *value |= kClosed;
      int unread = -1, answered = -1;
      FC_REQ(ioctl(g_own.keep, FIONREAD, &unread) == 0);
      FC_REQ(ioctl(g_own.other, FIONREAD, &answered) == 0);
      if (unread != static_cast<int>(g_own.queued)) *value |= kRead;
      if (answered != 0) *value |= kWritten;
      if (!(*value & kClosed)) close(g_own.number);
      close(g_own.keep);
      close(g_own.other);
      g_own = Own{};
      return 0;
    }
    case kAlloc:
      FC_REQ(vmm_create(2ull << 20, &g_buf) == CUDA_SUCCESS);
      return 0;
    case kStealPart: {
      int number = -1, found = 0;
      for (auto& [fd, target] : cmds::descriptors_of(getpid()))
        if (target.find(kPartTag) != std::string::npos) {
          number = fd;
          ++found;
        }
      FC_REQ(found == 1);
      const std::string path = std::string(getenv("CUSNAP_RUNTIME_DIR")) + "/own-file";
      const int own = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      FC_REQ(own >= 0);
      FC_REQ(write(own, kOwnText, strlen(kOwnText)) == static_cast<ssize_t>(strlen(kOwnText)));
      FC_REQ(dup2(own, number) == number);
      struct stat st;
      FC_REQ(fstat(number, &st) == 0);
      g_own = Own{number, own, -1, st.st_dev, st.st_ino, strlen(kOwnText)};
      *value = static_cast<uint64_t>(number);
      return 0;
    }
    case kCheckFile: {
      struct stat st;
      if (fstat(g_own.number, &st) != 0 || st.st_dev != g_own.dev || st.st_ino != g_own.ino)
        *value |= kClosed;
      char text[64] = {};
      FC_REQ(fstat(g_own.keep, &st) == 0);
      const ssize_t n = pread(g_own.keep, text, sizeof text, 0);
      if (st.st_size != static_cast<off_t>(g_own.queued) ||
          n != static_cast<ssize_t>(g_own.queued) || memcmp(text, kOwnText, g_own.queued) != 0)
        *value |= kWritten;
      if (!(*value & kClosed)) close(g_own.number);
      close(g_own.keep);
      g_own = Own{};
      return 0;
    }
    default:
      return 1;
  }
}

Child g_workload;
std::string g_only;  // argv[1]: control, peer or parts runs that part alone

/// The workload's account of its socket after the control timeout; 0 when
/// the listener left it alone.
int check_left_alone(const char* which) {
  usleep((kControlTimeoutMs + 1000) * 1000);  // past the connection's deadline
  uint64_t harm = ~0ull;
  REQ(command(g_workload, kCheck, &harm));
  fprintf(stderr, "%s: the application's socket was %s%s%s%s\n", which,
          harm == 0 ? "left alone" : "", harm & kRead ? "read " : "",
          harm & kWritten ? "written " : "", harm & kClosed ? "closed" : "");
  REQ(harm == 0);
  return 0;
}

/// A listener whose connection's number the application takes; its client's
/// requests are the listener's kind.
struct Listener {
  const char* name;
  std::string (*socket)(const std::string& runtime_dir, int64_t pid);
  /// One request on ch; true when answered as the listener answers it.
  bool (*request)(proto::Channel& ch);
  /// Whether the connection makes an exchange before its number is taken
  /// (the peer listener serves one request per connection: its client stays
  /// silent).
  bool exchange_first;
};

/// An inspect on the control socket; true when answered with the workload's
/// records.
bool inspect(proto::Channel& ch) {
  proto::Message m;
  proto::ShimRecords r;
  std::string err;
  return ch.send(proto::kMsgShimInspect, proto::Empty{}, &err) && ch.recv(&m, &err) &&
         m.type == proto::kMsgShimRecords && m.get(&r, &err) &&
         r.format == proto::kShimRecordsFormat && r.pid == g_workload.pid;
}

/// A fetch on the peer socket; true when answered with a fetched reply.
bool fetch(proto::Channel& ch) {
  proto::Message m;
  std::string err;
  return ch.send(proto::kMsgFetch, proto::FetchRequest{}, &err) && ch.recv(&m, &err) &&
         m.type == proto::kMsgFetched;
}

const Listener kListeners[] = {
    {"control", proto::shim_control_socket, inspect, true},
    {"peer", proto::shim_peer_socket, fetch, false},
};

/// A client of l's socket (its exchanges bounded by 3 s); false when the
/// connect failed.
bool connect_to(const Listener& l, proto::Channel* ch) {
  UniqueFd fd;
  std::string err;
  if (!proto::connect_unix(l.socket(g_dir, g_workload.pid), kTimeout, &fd, &err)) {
    fprintf(stderr, "%s: connect: %s\n", l.name, err.c_str());
    return false;
  }
  *ch = proto::Channel(std::move(fd), std::chrono::seconds(3));
  return true;
}

/// The application takes the number of l's connection; the client's request
/// then wakes the listener, which must leave the number alone and serve the
/// next client.
int reused_connection(const Listener& l) {
  REQ(command(g_workload, kMark));
  const auto marked = cmds::sockets_of(g_workload.pid);
  proto::Channel ch;
  REQ(connect_to(l, &ch));
  if (l.exchange_first) {
    REQ(l.request(ch));  // accepted and served
  } else {
    // Accepted: the workload holds a socket it had not (up to 5 s).
    const auto accepted = [&] {
      for (auto& [ino, fd] : cmds::sockets_of(g_workload.pid))
        if (!marked.count(ino)) return true;
      return false;
    };
    for (int i = 0; i < 500 && !accepted(); ++i) usleep(10000);
  }
  uint64_t number = 0;
  REQ(command(g_workload, kSteal, &number));
  fprintf(stderr, "%s: the application's socket is at the connection's number %llu\n", l.name,
          (unsigned long long)number);
  const bool answered = l.request(ch);  // wakes the listener; its socket is gone
  fprintf(stderr, "%s: the client's request %s\n", l.name, answered ? "was answered" : "was not");
  REQ(check_left_alone(l.name) == 0);
  proto::Channel next;
  REQ(connect_to(l, &next));
  REQ(l.request(next));
  return 0;
}

int save_parts() {
  REQ(command(g_workload, kAlloc));
  Shim c;
  REQ(c.connect(g_workload.pid));
  proto::ShimRecords r;
  REQ(c.inspect(&r));
  uint64_t id = 0;
  for (auto& a : r.allocations)
    if (a.origin == "created") id = a.id;
  REQ(id != 0);
  REQ(c.gate_close().ok);
  UniqueFd part0(open((g_dir + "/" + kPartTag).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  UniqueFd part1(open((g_dir + "/part-1").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  REQ(part0 && part1);
  proto::AllocationRequest req;
  req.allocation = id;
  req.parts = 2;
  REQ(c.call(proto::kMsgShimSave, req, part0.get()).ok);
  part0 = UniqueFd();  // the workload holds the one copy
  uint64_t number = 0;
  REQ(command(g_workload, kStealPart, &number));
  fprintf(stderr, "parts: the application's file is at part 0's number %llu\n",
          (unsigned long long)number);
  req.part = 1;
  const proto::Done d = c.call(proto::kMsgShimSave, req, part1.get());
  uint64_t harm = ~0ull;
  REQ(command(g_workload, kCheckFile, &harm));
  fprintf(stderr, "parts: the application's file was %s%s%s\n", harm == 0 ? "left alone" : "",
          harm & kWritten ? "written " : "", harm & kClosed ? "closed" : "");
  REQ(c.gate_open().ok);
  REQ(harm == 0);
  REQ(refused_with(d, "closed in the process"));
  return 0;
}

int run() {
  setenv("CUSNAP_CONTROL_TIMEOUT", std::to_string(kControlTimeoutMs / 1000).c_str(), 1);
  g_workload = spawn([](int sock) { return cmds::serve(sock, act); });
  REQ(g_workload.pid > 0);
  REQ(command(g_workload, kInit));
  auto part = [](const char* name) { return g_only.empty() || g_only == name; };
  for (const Listener& l : kListeners) REQ(!part(l.name) || reused_connection(l) == 0);
  REQ(!part("parts") || save_parts() == 0);
  REQ(cmds::finish(g_workload));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) g_only = argv[1];
  return coordinator_main("shim.track.reused_conns", "reusedconns", run, [] { g_workload.kill(); });
}
