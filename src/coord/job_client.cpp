#include "coord/job_client.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace cusnap {

bool connect_job(const JobEntry& job, std::chrono::milliseconds timeout, proto::Channel* out,
                 std::string* err) {
  UniqueFd fd;
  const std::string path = job.dir + "/control.sock";
  if (!proto::connect_unix(path, timeout, &fd, err)) {
    *err = "cannot reach the supervisor of job " + job.status.name + ": " + *err;
    return false;
  }
  ucred cred{};
  if (!proto::peer_credentials(fd.get(), &cred, err)) return false;
  // The other way round from the supervisor's check: we talk only to a
  // supervisor running as root or as ourselves (root talks to anyone's).
  if (!(::geteuid() == 0 || cred.uid == 0 || cred.uid == ::geteuid())) {
    *err = "refusing to talk to " + path + ": its supervisor runs as uid " +
           std::to_string(cred.uid) + ", neither root nor this user: run cusnap as uid " +
           std::to_string(cred.uid) + " or as root";
    return false;
  }
  *out = proto::Channel(std::move(fd), timeout);
  return true;
}

namespace {

/// "N s" (to a tenth below 10 s) for messages.
std::string seconds_text(std::chrono::milliseconds d) {
  char buf[32];
  if (d < std::chrono::milliseconds(100))  // not "0.0 s" for a tiny timeout
    std::snprintf(buf, sizeof buf, "%lld ms", static_cast<long long>(d.count()));
  else if (d < std::chrono::seconds(10))
    std::snprintf(buf, sizeof buf, "%.1f s", double(d.count()) / 1000);
  else
    std::snprintf(buf, sizeof buf, "%lld s", static_cast<long long>(d.count() / 1000));
  return buf;
}

/// A reply the supervisor sent that this side cannot read: said as such.
void unreadable_reply(std::string* err) {
  *err = "the job's supervisor answered in a form this cusnap cannot read (" + *err +
         "): it was likely started by another version of cusnap; use that version to control it";
}

}  // namespace

bool job_hello(const JobEntry& job, std::chrono::milliseconds timeout, proto::JobStatus* out,
               std::string* err) {
  proto::Channel ch;
  if (!connect_job(job, timeout, &ch, err) || !ch.send(proto::kMsgHello, proto::Empty{}, err))
    return false;
  proto::Message m;
  bool refused = false;
  if (!ch.recv(&m, err, &refused)) {
    if (refused) unreadable_reply(err);
    return false;
  }
  if (m.type == proto::kMsgResult) {
    proto::Result r;
    if (m.get(&r, err)) *err = r.message;
    return false;
  }
  if (m.type != proto::kMsgHello) {
    *err = "unexpected '" + m.type + "' message from the supervisor";
    return false;
  }
  return m.get(out, err);
}

bool await_result(proto::Channel& ch, std::chrono::milliseconds wait,
                  const ProgressHandler& on_progress, proto::Result* out, std::string* err,
                  const InterruptHook& hook) {
  using Clock = std::chrono::steady_clock;
  ch.set_timeout(wait);
  bool interrupted = false;
  Clock::time_point until{};  // the bound after the interrupt
  for (;;) {
    // Wait for the next message, or the interrupt, here: the channel's
    // receive waits for a whole message, deaf to anything else.
    if (interrupted && Clock::now() >= until) {
      *err =
          "no result from the supervisor within the cancel's bound\nwhat became of the request "
          "is not known: cusnap ps shows the job's state";
      return false;
    }
    if (hook.fd >= 0) {
      const bool watch = !interrupted;
      pollfd p[2] = {{ch.fd(), POLLIN, 0}, {watch ? hook.fd : -1, POLLIN, 0}};
      auto left = wait;
      if (interrupted)
        left = std::min(left, std::chrono::ceil<std::chrono::milliseconds>(
                                  std::max(until - Clock::now(), Clock::duration::zero())));
      // Whether a silence till poll's end is the cancel's bound (the loop's
      // top says so), else one message's wait.
      const bool cancel_bound = interrupted && left < wait;
      const int n = ::poll(p, 2, int(std::min<int64_t>(left.count(), 1 << 30)));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        *err = std::string("poll: ") + std::strerror(errno) +
               "\nwhat became of the request is not known: cusnap ps shows the job's state";
        return false;
      }
      if (watch && (p[1].revents & (POLLIN | POLLHUP))) {
        interrupted = true;
        const auto bound = hook.on_interrupt ? hook.on_interrupt() : wait;
        until = Clock::now() + bound;
        if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      }
      if (n == 0) {
        if (cancel_bound) continue;  // said at the loop's top
        *err = "no answer from the supervisor: timed out waiting " + seconds_text(wait) +
               " for a message\nwhat became of the request is not known: cusnap ps shows the "
               "job's state";
        return false;
      }
    }
    proto::Message m;
    bool refused = false;
    if (!ch.recv(&m, err, &refused)) {
      if (refused) {
        unreadable_reply(err);
        *err += "\nwhat became of the request is not known: cusnap ps shows the job's state";
        return false;
      }
      if (*err == "timed out waiting for a message")
        *err = "timed out waiting " + seconds_text(wait) + " for a message";
      *err = "no answer from the supervisor: " + *err +
             "\nwhat became of the request is not known: cusnap ps shows the job's state";
      return false;
    }
    if (m.type == proto::kMsgProgress) {
      proto::ProgressEvent ev;
      if (!m.get(&ev, err)) return false;
      // An empty event is the supervisor's heartbeat: it only keeps the wait going.
      if (on_progress && !ev.phase.empty()) on_progress(ev);
      continue;
    }
    if (m.type != proto::kMsgResult) {
      *err = "unexpected '" + m.type + "' message from the supervisor";
      return false;
    }
    return m.get(out, err);
  }
}

bool job_cancel(const JobEntry& job, std::chrono::milliseconds timeout, const std::string& op,
                proto::Result* out, std::string* err) {
  proto::Channel ch;
  proto::CancelRequest req;
  req.op = op;
  req.own = true;
  if (!connect_job(job, timeout, &ch, err) || !ch.send(proto::kMsgCancel, req, err)) return false;
  proto::Message m;
  bool refused = false;
  if (!ch.recv(&m, err, &refused)) {
    if (refused) unreadable_reply(err);
    return false;
  }
  if (m.type != proto::kMsgResult) {
    *err = "unexpected '" + m.type + "' message from the supervisor";
    return false;
  }
  return m.get(out, err);
}

}  // namespace cusnap
