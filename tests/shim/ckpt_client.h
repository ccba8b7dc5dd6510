// The coordinator's side of the shim tests that speak the control protocol
// to a preloaded shim (ckpt_requests.cpp: shim.track.ckpt, direct_io.cpp:
// shim.track.direct): checks, byte patterns, one shim's control connection,
// refusals, what a process still holds of a file, and the tests' main().
// Header-only.
#pragma once

#include <dirent.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "proto/control.h"
#include "proto/shim_messages.h"
#include "proto/wire.h"

namespace ckpt_client {

namespace proto = cusnap::proto;
using cusnap::UniqueFd;

/// The test's runtime directory ($CUSNAP_RUNTIME_DIR), where the shims'
/// control sockets are; made by coordinator_main.
inline std::string g_dir;
inline constexpr auto kTimeout = std::chrono::seconds(10);

inline bool check(bool ok, const char* what, const char* file, int line) {
  if (!ok) fprintf(stderr, "[%d] %s:%d: failed: %s\n", (int)getpid(), file, line, what);
  return ok;
}

}  // namespace ckpt_client

/// In the coordinator: prints the failed condition and returns 1 (REQ) or
/// false (REQB).
#define REQ(cond)                                                                            \
  do {                                                                                       \
    if (!::ckpt_client::check(static_cast<bool>(cond), #cond, __FILE__, __LINE__)) return 1; \
  } while (0)
#define REQB(cond)                                                                               \
  do {                                                                                           \
    if (!::ckpt_client::check(static_cast<bool>(cond), #cond, __FILE__, __LINE__)) return false; \
  } while (0)

namespace ckpt_client {

/// A position-dependent pattern: 64-bit word w holds a mix of w and seed.
inline std::vector<uint8_t> pattern(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t w = 0; w < n / 8; ++w) {
    uint64_t x = (w + 1) * 0x9E3779B97F4A7C15ull ^ (seed * 0xBF58476D1CE4E5B9ull);
    memcpy(v.data() + w * 8, &x, 8);
  }
  return v;
}

/// One shim's control connection.
struct Shim {
  pid_t pid = -1;
  proto::Channel ch;

  bool connect(pid_t p) {
    pid = p;
    UniqueFd fd;
    std::string err;
    if (!proto::connect_unix(proto::shim_control_socket(g_dir, p), kTimeout, &fd, &err)) {
      fprintf(stderr, "connect to the shim of %d: %s\n", (int)p, err.c_str());
      return false;
    }
    ch = proto::Channel(std::move(fd), kTimeout);
    return true;
  }

  /// One request and its reply of type reply_type; false + *err otherwise.
  template <class T, class R>
  bool exchange(const char* type, const T& payload, int fd, const char* reply_type, R* out,
                std::string* err) {
    proto::Message m;
    if (!ch.send(type, payload, err, fd) || !ch.recv(&m, err)) return false;
    if (m.type != reply_type) {
      *err = "unexpected reply '" + m.type + "'";
      return false;
    }
    return m.get(out, err);
  }

  /// One request answered by `done`; a transport failure is a Done with
  /// ok=false and code -1.
  template <class T>
  proto::Done call(const char* type, const T& payload, int fd = -1) {
    proto::Done d;
    std::string err;
    if (!exchange(type, payload, fd, proto::kMsgDone, &d, &err)) {
      d = proto::Done{};
      d.code = -1;
      d.error = "transport: " + err;
    }
    if (!d.ok) fprintf(stderr, "  (shim of %d, '%s': %s)\n", (int)pid, type, d.error.c_str());
    return d;
  }

  /// The shim's records; false unless they are of this format and process.
  bool inspect(proto::ShimRecords* out) {
    std::string err;
    if (!exchange(proto::kMsgShimInspect, proto::Empty{}, -1, proto::kMsgShimRecords, out, &err)) {
      fprintf(stderr, "inspect %d: %s\n", (int)pid, err.c_str());
      return false;
    }
    return out->format == proto::kShimRecordsFormat && out->pid == pid;
  }

  proto::Done save(uint64_t id, int fd) {
    return call(proto::kMsgShimSave, proto::AllocationRequest{id}, fd);
  }
  proto::Done load(uint64_t id, int fd) {
    return call(proto::kMsgShimLoad, proto::AllocationRequest{id}, fd);
  }
  /// Save or load (type) of allocation id in parts, one descriptor per part;
  /// stops at the first part that fails.
  proto::Done parts(const char* type, uint64_t id, const std::vector<int>& fds) {
    proto::Done d;
    for (size_t k = 0; k < fds.size(); ++k) {
      proto::AllocationRequest r;
      r.allocation = id;
      r.part = static_cast<uint32_t>(k);
      r.parts = static_cast<uint32_t>(fds.size());
      d = call(type, r, fds[k]);
      if (!d.ok) return d;
    }
    return d;
  }
  proto::Done release(const char* origin) {
    proto::ReleaseRequest r;
    r.origin = origin;
    return call(proto::kMsgShimRelease, r);
  }
  proto::Done reimport() { return call(proto::kMsgShimReimport, proto::Empty{}); }
  proto::Done drain() { return call(proto::kMsgShimDrain, proto::Empty{}); }
  proto::Done drain(uint64_t timeout_ms) {
    return call(proto::kMsgShimDrain, proto::DrainRequest{timeout_ms});
  }
  proto::Done gate_close() { return call(proto::kMsgGateClose, proto::GateRequest{5000}); }
  proto::Done gate_open() { return call(proto::kMsgGateOpen, proto::Empty{}); }
};

/// d is a refusal by the shim (not a transport failure) naming `words`.
inline bool refused_with(const proto::Done& d, const char* words) {
  if (d.ok || d.code == -1 || d.error.find(words) == std::string::npos) {
    fprintf(stderr, "expected a refusal naming '%s'; got ok=%d code=%d error='%s'\n", words,
            (int)d.ok, d.code, d.error.c_str());
    return false;
  }
  return true;
}

/// Lines of /proc/PID/maps and targets of /proc/PID/fd/* that contain tag.
inline int proc_traces(pid_t pid, const std::string& tag) {
  int n = 0;
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find(tag) != std::string::npos) ++n;
  const std::string fds = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* dir = opendir(fds.c_str())) {
    while (dirent* e = readdir(dir)) {
      char target[256];
      ssize_t len = readlink((fds + "/" + e->d_name).c_str(), target, sizeof target - 1);
      if (len <= 0) continue;
      target[len] = 0;
      if (std::string(target).find(tag) != std::string::npos) ++n;
    }
    closedir(dir);
  }
  return n;
}

/// main() of such a test: a fresh runtime directory /tmp/cusnap-TAG.XXXXXX
/// (g_dir, $CUSNAP_RUNTIME_DIR), SIGPIPE ignored, 50 s for the whole run (a
/// hang ends it; the children then see their socket close); run(), then
/// after() (ending what run left behind), the directory removed, and
/// "NAME: passed" or "NAME: FAILED". Returns run()'s result, 2 without a
/// directory.
inline int coordinator_main(const char* name, const char* tag, const std::function<int()>& run,
                            const std::function<void()>& after = {}) {
  std::string tmpl = std::string("/tmp/cusnap-") + tag + ".XXXXXX";
  if (!mkdtemp(tmpl.data())) return 2;
  g_dir = tmpl;
  setenv("CUSNAP_RUNTIME_DIR", tmpl.c_str(), 1);
  signal(SIGPIPE, SIG_IGN);
  alarm(50);
  int rc = run();
  if (after) after();
  std::string cmd = "rm -rf '" + g_dir + "'";
  if (system(cmd.c_str()) != 0) {
  }
  fprintf(stderr, "%s: %s\n", name, rc == 0 ? "passed" : "FAILED");
  return rc;
}

}  // namespace ckpt_client
