// ShimClient (shim_client.h).
#include "coord/shim_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace cusnap {

bool ShimClient::connect(const std::string& path, pid_t pid, std::chrono::milliseconds timeout,
                         std::string* err) {
  pid_ = pid;
  timeout_ = timeout;
  UniqueFd fd;
  std::string why;
  if (!proto::connect_unix(path, timeout, &fd, &why)) {
    *err = "process " + std::to_string(pid) + ": cannot reach its shim at " + path + ": " + why;
    return false;
  }
  struct ucred cred {};
  if (!proto::peer_credentials(fd.get(), &cred, &why)) {
    *err = "process " + std::to_string(pid) + ": " + why;
    return false;
  }
  if (cred.pid != pid) {
    *err = "process " + std::to_string(pid) + ": the shim socket " + path +
           " is served by process " + std::to_string(cred.pid) + ", not by it";
    return false;
  }
  ch_ = proto::Channel(std::move(fd), timeout);
  return true;
}

template <class T, class R>
bool ShimClient::exchange(const char* type, const T& payload, int fd,
                          std::chrono::milliseconds timeout, const char* reply_type, R* out,
                          std::string* err) {
  const std::string who = "process " + std::to_string(pid_) + ", shim request '" + type + "': ";
  if (!ch_.valid()) {
    *err = who + "not connected";
    return false;
  }
  ch_.set_timeout(timeout);
  std::string why;
  proto::Message msg;
  bool ok = ch_.send(type, payload, &why, fd) && ch_.recv(&msg, &why);
  ch_.set_timeout(timeout_);
  if (!ok) {
    *err = who + why;
    ch_ = proto::Channel();  // a late answer must never be taken for the next one
    return false;
  }
  if (msg.type == proto::kMsgDone && msg.type != reply_type) {
    // An older shim answers an unknown request with done ok=false.
    proto::Done d;
    *err = who + (msg.get(&d, &why) && !d.error.empty() ? d.error : "unexpected reply 'done'");
    return false;
  }
  if (msg.type != reply_type || !msg.get(out, &why)) {
    *err = who + (why.empty() ? "unexpected reply '" + msg.type + "'" : why);
    ch_ = proto::Channel();
    return false;
  }
  if (!out->ok) {
    *err = who + (out->error.empty() ? std::string("failed") : out->error);
    return false;
  }
  return true;
}

template <class T>
bool ShimClient::call(const char* type, const T& payload, int fd, std::chrono::milliseconds timeout,
                      proto::Done* out, std::string* err) {
  if (exchange(type, payload, fd, timeout, proto::kMsgDone, out, err)) return true;
  if (!out->ok && out->error.empty() && out->code != 0)
    *err += " (code " + std::to_string(out->code) + ")";
  return false;
}

bool ShimClient::cut(const std::string& op, uint64_t target, proto::CutState* out, std::string* err,
                     uint64_t hold_ms) {
  proto::CutRequest req;
  req.op = op;
  req.target = target;
  req.hold_ms = hold_ms;
  return exchange(proto::kMsgShimCut, req, -1, timeout_, proto::kMsgShimCutState, out, err);
}

bool ShimClient::inspect(proto::ShimRecords* out, std::string* err) {
  const std::string who = "process " + std::to_string(pid_) + ", shim inspection: ";
  std::string why;
  proto::Message msg;
  const bool connected = ch_.valid();  // a failed recv may close the channel
  if (!connected || !ch_.send(proto::kMsgShimInspect, proto::Empty{}, &why) ||
      !ch_.recv(&msg, &why)) {
    *err = who + (connected ? why : "not connected");
    ch_ = proto::Channel();
    return false;
  }
  if (msg.type != proto::kMsgShimRecords || !msg.get(out, &why)) {
    *err = who + (why.empty() ? "unexpected reply '" + msg.type + "'" : why);
    ch_ = proto::Channel();
    return false;
  }
  if (out->format != proto::kShimRecordsFormat || out->pid != pid_) {
    *err = who + "records of format " + std::to_string(out->format) + " for process " +
           std::to_string(out->pid) + " (expected format " +
           std::to_string(proto::kShimRecordsFormat) + "): the shim and cusnap differ";
    return false;
  }
  if (!proto::records_valid(*out, &why)) {
    *err = who + "its records are malformed (" + why + ")";
    ch_ = proto::Channel();
    return false;
  }
  return true;
}

bool ShimClient::gate_close(uint64_t wait_ms, std::string* err) {
  proto::GateRequest g;
  g.timeout_ms = wait_ms;
  proto::Done d;
  if (call(proto::kMsgGateClose, g, -1, timeout_ + std::chrono::milliseconds(wait_ms), &d, err))
    return true;
  if (d.code == ETIMEDOUT)
    *err = "process " + std::to_string(pid_) +
           ", quiesce phase: a driver call did not return within " + std::to_string(wait_ms) +
           " ms" + (d.error.empty() ? "" : " (" + d.error + ")") + ", so the gate was opened again";
  return false;
}

bool ShimClient::gate_open(std::string* err, bool keep_cut) {
  proto::Done d;
  proto::GateOpen req;
  req.keep_cut = keep_cut;
  return call(proto::kMsgGateOpen, req, -1, timeout_, &d, err);
}

bool ShimClient::drain(std::chrono::milliseconds timeout, std::string* err, bool* busy) {
  proto::Done d;
  // The shim answers ETIMEDOUT a little before this side stops waiting, so
  // that the connection stays in step and the gate can be opened on it.
  proto::DrainRequest req;
  const auto margin = std::min<std::chrono::milliseconds>(timeout / 4, std::chrono::seconds(1));
  req.timeout_ms = uint64_t(std::max<int64_t>(1, (timeout - margin).count()));
  const bool ok = call(proto::kMsgShimDrain, req, -1, timeout, &d, err);
  if (busy) *busy = !ok && d.code == EBUSY;
  return ok;
}

bool ShimClient::parts(const char* type, uint64_t allocation, const std::vector<int>& fds,
                       std::chrono::milliseconds timeout, proto::Done* out, std::string* err) {
  proto::AllocationRequest req;
  req.allocation = allocation;
  req.parts = static_cast<uint32_t>(fds.size());
  for (size_t k = 0; k < fds.size(); ++k) {
    req.part = static_cast<uint32_t>(k);
    if (!call(type, req, fds[k], k + 1 == fds.size() ? timeout : timeout_, out, err)) return false;
  }
  return true;
}

bool ShimClient::save(uint64_t allocation, const std::vector<int>& fds,
                      std::chrono::milliseconds timeout, uint64_t* bytes, std::string* err) {
  proto::Done d;
  if (!parts(proto::kMsgShimSave, allocation, fds, timeout, &d, err)) return false;
  *bytes = d.bytes;
  return true;
}

bool ShimClient::load(uint64_t allocation, const std::vector<int>& fds,
                      std::chrono::milliseconds timeout, std::string* err) {
  proto::Done d;
  return parts(proto::kMsgShimLoad, allocation, fds, timeout, &d, err);
}

bool ShimClient::release(const std::string& origin, std::chrono::milliseconds timeout,
                         std::string* err) {
  proto::Done d;
  proto::ReleaseRequest r;
  r.origin = origin;
  return call(proto::kMsgShimRelease, r, -1, timeout, &d, err);
}

bool ShimClient::reimport(std::chrono::milliseconds timeout, std::string* err) {
  proto::Done d;
  return call(proto::kMsgShimReimport, proto::Empty{}, -1, timeout, &d, err);
}

void ShimClient::disconnect() {
  if (!ch_.valid()) return;
  ::shutdown(ch_.fd(), SHUT_WR);
  // The shim closes its end when it reads the end of the stream.
  auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    struct pollfd p {
      ch_.fd(), POLLIN, 0
    };
    int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    char buf[256];
    ssize_t r = ::recv(ch_.fd(), buf, sizeof buf, MSG_DONTWAIT);
    if (r == 0) break;
    if (r < 0 && errno != EAGAIN && errno != EINTR) break;
  }
  ch_ = proto::Channel();
}

}  // namespace cusnap
