#include "coord/control_server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <system_error>
#include <thread>

#include "coord/runtime_dir.h"
#include "proto/json_text.h"
#include "proto/wire.h"

namespace cusnap {
namespace {

constexpr int kMaxConnections = 16;

void wake(int fd) {
  if (fd < 0) return;
  uint64_t one = 1;
  while (::write(fd, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

nlohmann::json status_json(const proto::JobStatus& s) {
  return nlohmann::json::parse(job_status_to_json(s));
}

/// While an operation runs, an empty progress event every interval tells
/// the client the supervisor is at work (job_client.cpp skips them): the
/// client waits for the next message its own timeout long, while the driver
/// and CRIU steps get more than the request's timeout on a large job
/// (driver_deadline). send_mu is the connection's, shared with the engine's
/// progress; client_gone is set, under it, once a send fails.
class Heartbeat {
 public:
  Heartbeat(proto::Channel& ch, std::mutex& send_mu, bool& client_gone,
            std::chrono::milliseconds every)
      : thread_([this, &ch, &send_mu, &client_gone, every] {
          std::unique_lock lk(mu_);
          while (!cv_.wait_for(lk, every, [this] { return stop_; })) {
            std::lock_guard sl(send_mu);
            std::string e;
            if (client_gone) return;
            if (!ch.send(proto::kMsgProgress, proto::ProgressEvent{}, &e)) client_gone = true;
          }
        }) {}
  ~Heartbeat() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the rest is built
};

/// A quarter of the server's timeout, within 10 ms to 1 s.
std::chrono::milliseconds heartbeat_every(std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 4, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
}

/// The state an operation that did not complete leaves: what it was before,
/// unless the job exited meanwhile (the supervisor's loop said so).
std::string state_after(const std::string& now, const std::string& before, bool job_lost) {
  if (now == "exited") return now;
  return job_lost ? "suspended" : before;
}

proto::Result make_result(bool ok, int code, std::string message, std::string details = "") {
  proto::Result r;
  r.ok = ok;
  r.exit_code = code;
  r.message = std::move(message);
  r.details = std::move(details);
  return r;
}

std::string phases_json_text(const PhaseTimes& phases) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& [name, secs] : phases) a.push_back({{"name", name}, {"seconds", secs}});
  return json_text(a);
}

/// The cut a checkpoint or suspend held the collective ranks at, and how
/// often it waited for a stream capture, in its result's details.
void add_cut_details(const std::map<pid_t, uint64_t>& cut, int capture_retries,
                     nlohmann::json* d) {
  if (!cut.empty()) {
    nlohmann::json c = nlohmann::json::object();
    for (auto [pid, n] : cut) c[std::to_string(pid)] = n;
    (*d)["collective_cut"] = c;
  }
  if (capture_retries > 0) (*d)["capture_retries"] = capture_retries;
}

}  // namespace

bool JobContext::set_state_locked(const std::string& state, std::string* err) {
  status.state = state;
  std::string why;
  if (!rundir || rundir->write_status(status, &why)) return true;
  if (err) *err = why;
  return false;
}

DriverView driver_view(const std::vector<ProcessInfo>& procs) {
  DriverView v;
  for (const ProcessInfo& p : procs) {
    if (!p.uses_cuda) continue;
    ++v.cuda;
    if (p.cuda_state == "running") ++v.running;
    if (p.cuda_state == "locked" || p.cuda_state == "checkpointed") ++v.held;
  }
  return v;
}

bool suspend_record_refuses(bool suspend, const std::string& recorded_state) {
  return suspend == (recorded_state == "suspended");
}

std::string suspend_resume_refusal(bool suspend, const std::string& recorded_state,
                                   const DriverView& view, bool left_suspended,
                                   const std::string& job) {
  if (!suspend_record_refuses(suspend, recorded_state)) return "";
  // What helps: the other command.
  if (!suspend) {
    // Held by the driver though recorded running: resume restores what it holds.
    if (view.held > 0) return "";
    return "job " + job + " is not suspended: nothing to resume (cusnap suspend " + job +
           " suspends it)";
  }
  if (!left_suspended && view.cuda > 0 && view.running == view.cuda)
    return "job " + job +
           " is recorded suspended, but the driver runs every process of it (its GPU state was "
           "brought back outside cusnap resume): cusnap resume " +
           job + " records it running, and it can be suspended then";
  return "job " + job + " is already suspended: cusnap resume " + job + " brings it back";
}

std::string inspect_details_json(const proto::JobStatus& status,
                                 const std::vector<ProcessInfo>& procs,
                                 const std::string& left_suspended) {
  nlohmann::json p = nlohmann::json::array();
  for (const ProcessInfo& pi : procs)
    p.push_back({{"pid", pi.pid},
                 {"exe", pi.exe},
                 {"cmdline", pi.cmdline},
                 {"uses_cuda", pi.uses_cuda},
                 {"cuda_state", pi.cuda_state}});
  nlohmann::json d{{"job", status_json(status)}, {"processes", p}};
  if (!left_suspended.empty()) {
    nlohmann::json left = nlohmann::json::parse(left_suspended, nullptr, false);
    if (left.is_object()) d["left_suspended"] = left;
  }
  return json_text(d);
}

ControlServer::ControlServer(JobContext* ctx, CoordinatorOps ops, UniqueFd listen_fd,
                             std::chrono::milliseconds timeout)
    : ctx_(ctx), ops_(std::move(ops)), listen_fd_(std::move(listen_fd)), timeout_(timeout) {}

ControlServer::~ControlServer() {
  stop();
}

bool ControlServer::start(std::string* err) {
  stop_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!stop_fd_) {
    *err = std::string("eventfd: ") + std::strerror(errno);
    return false;
  }
  thread_ = std::thread([this] { accept_loop(); });
  return true;
}

void ControlServer::stop() {
  if (!thread_.joinable()) return;
  wake(stop_fd_.get());
  thread_.join();
  std::unique_lock lk(conns_mu_);
  for (const auto& [id, fd] : conns_) ::shutdown(fd.get(), SHUT_RDWR);
  conns_cv_.wait(lk, [this] { return active_ == 0; });
}

void ControlServer::accept_loop() {
  for (;;) {
    pollfd p[2] = {{listen_fd_.get(), POLLIN, 0}, {stop_fd_.get(), POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[1].revents) return;
    if (!(p[0].revents & POLLIN)) continue;
    UniqueFd conn;
    std::string err;
    if (!proto::accept_unix(listen_fd_.get(), &conn, &err)) {
      if (err.empty()) continue;  // nothing pending any more
      // Out of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM): the
      // connection stays pending and poll reports it again at once; wait
      // 100 ms (stop() still wakes the wait) rather than spin on a core
      // until descriptors are freed, then take it.
      pollfd s{stop_fd_.get(), POLLIN, 0};
      if (::poll(&s, 1, 100) > 0) return;
      continue;
    }
    std::lock_guard lk(conns_mu_);
    if (active_ >= kMaxConnections) continue;  // closes conn: the client sees the connection end
    UniqueFd watch(::fcntl(conn.get(), F_DUPFD_CLOEXEC, 0));
    if (!watch) continue;  // no descriptor to spare: closes conn
    const int id = watch.get();
    conns_.emplace(id, std::move(watch));
    ++active_;
    try {
      std::thread([this, id, c = std::move(conn)]() mutable {
        serve(std::move(c));
        std::lock_guard lk2(conns_mu_);
        conns_.erase(id);
        --active_;
        conns_cv_.notify_all();
      }).detach();
    } catch (const std::system_error&) {
      // No thread to be had (the job may have filled the cgroup's pids.max):
      // the connection is closed with the thread's arguments, so the client
      // sees it end; the job and its supervision go on.
      conns_.erase(id);
      --active_;
    }
  }
}

bool ControlServer::begin_engine(const std::string& op, const ucred& cred,
                                 std::shared_ptr<CancelToken> cancel, proto::Result* refusal) {
  std::lock_guard lk(ctx_->mu);
  if (!ctx_->engine_op.empty()) {
    *refusal = make_result(
        false, kExitRefused,
        "a " + ctx_->engine_op + " of job " + ctx_->status.name + " is already running");
    return false;
  }
  if (ctx_->status.state == "stopped" || ctx_->status.state == "exited") {
    *refusal = make_result(
        false, kExitRefused,
        "job " + ctx_->status.name + " is " + ctx_->status.state + ": nothing to " + op);
    return false;
  }
  // A checkpoint of a job suspended by cusnap suspend is refused here,
  // before its guardian hears of a checkpoint: were the supervisor to die
  // before the engine's refusal, the guardian would bring the job back from
  // the checkpoint's (empty) directory, opening its gates over the shared
  // memory the suspend released. With no operation running (above), the
  // state cannot change under this lock. (One left suspended by a failed
  // roll back is the engine's to refuse, saying why; its guardian recovers
  // from the marked place.)
  if (op == "checkpoint" && ctx_->status.state == "suspended" &&
      left_suspended_state(ctx_->info) == LeftSuspendedState::kNo) {
    *refusal = make_result(false, kExitRefused,
                           "job " + ctx_->status.name + " is suspended: cusnap resume " +
                               ctx_->status.name +
                               " brings it back, then it can be checkpointed; nothing was changed");
    return false;
  }
  ctx_->engine_op = op;
  ctx_->cancel = std::move(cancel);
  ctx_->engine_uid = cred.uid;
  ctx_->engine_pid = cred.pid;
  ++ctx_->replies_pending;
  return true;
}

void ControlServer::serve_cancel(proto::Channel& ch, const proto::Message& req, const ucred& cred,
                                 const JobInfo& info) {
  std::string err;
  proto::CancelRequest r;
  if (!req.get(&r, &err) || !proto::validate(r, &err)) {
    ch.send(proto::kMsgResult, make_result(false, kExitUsage, err), &err);
    return;
  }
  std::string op;
  std::shared_ptr<CancelToken> token;
  uid_t uid = 0;
  pid_t pid = 0;
  {
    std::lock_guard lk(ctx_->mu);
    op = ctx_->engine_op;
    token = ctx_->cancel;
    uid = ctx_->engine_uid;
    pid = ctx_->engine_pid;
  }
  std::string refusal;
  if (op != r.op || !token)
    refusal = "no " + r.op + " of job " + info.name + " is running: nothing to cancel";
  else if (cred.uid != uid)
    refusal = "permission denied: the " + op + " of job " + info.name + " was asked by uid " +
              std::to_string(uid) + "; only that uid may cancel it, not uid " +
              std::to_string(cred.uid);
  else if (r.own && cred.pid != pid)
    refusal = "the " + op + " of job " + info.name + " running was asked by another command (pid " +
              std::to_string(pid) + "): nothing of this command's to cancel";
  if (!refusal.empty()) {
    ch.send(proto::kMsgResult, make_result(false, kExitRefused, refusal), &err);
    return;
  }
  const bool taken = token->request();
  nlohmann::json d = {{"job", info.name},
                      {"operation", op},
                      {"cancel", taken ? proto::kCancelRequested : proto::kCancelTooLate}};
  ch.send(proto::kMsgResult, make_result(true, kExitOk, "", json_text(d)), &err);
}

/// What an operation that was asked to cancel and did not complete says:
/// result, when the cancel was taken and the job rolled back (the failure
/// codes that leave the job as it was), becomes a cancel, its details
/// {"job", "cancelled": true}.
static void mark_cancelled(const CancelToken& token, const std::string& job,
                           proto::Result* result) {
  if (result->ok || !token.requested()) return;
  if (result->exit_code != kExitFailure && result->exit_code != kExitRefused) return;
  nlohmann::json d = nlohmann::json::parse(result->details, nullptr, false);
  if (!d.is_object()) d = nlohmann::json::object();
  d["job"] = job;
  d["cancelled"] = true;
  result->details = json_text(d);
}

void ControlServer::end_engine(proto::Channel& ch, const proto::Result& result) {
  {
    std::lock_guard lk(ctx_->mu);
    ctx_->engine_op.clear();
    ctx_->cancel.reset();
  }
  std::string err;
  ch.send(proto::kMsgResult, result, &err);
  std::lock_guard lk(ctx_->mu);
  --ctx_->replies_pending;
  ctx_->cv.notify_all();
  wake(ctx_->wake_fd);
}

void ControlServer::serve(UniqueFd conn) {
  std::string err;
  ucred cred{};
  if (!proto::peer_credentials(conn.get(), &cred, &err)) return;
  proto::Channel ch(std::move(conn), timeout_);
  ch.set_max_body(proto::kMaxRequestBytes);
  JobInfo info;
  proto::JobStatus status;
  {
    std::lock_guard lk(ctx_->mu);
    info = ctx_->info;
    status = ctx_->status;
  }
  if (!proto::peer_uid_allowed(cred.uid, info.owner_uid)) {
    ch.send(
        proto::kMsgResult,
        make_result(false, kExitRefused,
                    "permission denied: uid " + std::to_string(cred.uid) + " may not control job " +
                        info.name + " (owner uid " + std::to_string(info.owner_uid) + ")"),
        &err);
    return;
  }
  proto::Message req;
  bool refused = false;
  if (!ch.recv(&req, &err, &refused)) {
    // A client of another version, or a broken one, is told why.
    if (refused)
      ch.send(proto::kMsgResult, make_result(false, kExitUsage, "request refused: " + err), &err);
    return;
  }

  if (req.type == proto::kMsgHello) {
    ch.send(proto::kMsgHello, status, &err);
    return;
  }
  if (req.type == proto::kMsgInspect) {
    std::vector<ProcessInfo> procs = ops_.list_processes(info.root_pid);
    ch.send(proto::kMsgResult,
            make_result(true, kExitOk, "",
                        inspect_details_json(status, procs, left_suspended_details(info))),
            &err);
    return;
  }
  if (req.type == proto::kMsgCheckpoint) {
    proto::CheckpointRequest r;
    if (!req.get(&r, &err) || !proto::validate(r, &err)) {
      ch.send(proto::kMsgResult, make_result(false, kExitUsage, err), &err);
      return;
    }
    proto::Result refusal;
    auto cancel = std::make_shared<CancelToken>();
    if (!begin_engine("checkpoint", cred, cancel, &refusal)) {
      ch.send(proto::kMsgResult, refusal, &err);
      return;
    }
    std::string before;
    {
      std::lock_guard lk(ctx_->mu);
      before = ctx_->status.state;
      ctx_->set_state_locked("checkpointing");
    }
    CheckpointOptions opts;
    opts.dir = r.dir;
    opts.leave_running = r.leave_running;
    opts.timeout = std::chrono::milliseconds(r.timeout_ms);
    opts.settings = r.settings;
    opts.cancel = cancel.get();
    std::mutex send_mu;  // the engine may report progress from several threads
    bool client_gone = false;
    ProgressSink sink = [&](const Progress& p) {
      std::lock_guard lk(send_mu);
      if (client_gone) return;
      std::string e;
      if (!ch.send(proto::kMsgProgress, proto::ProgressEvent{p.phase, p.bytes_done, p.bytes_total},
                   &e))
        client_gone = true;  // the checkpoint goes on; its result stays in job.json's state
    };
    CheckpointResult res;
    std::string cerr;
    bool ok;
    {
      Heartbeat beat(ch, send_mu, client_gone, heartbeat_every(timeout_));
      ok = ops_.checkpoint(info, opts, sink, &res, &cerr);
    }
    proto::Result result;
    std::string after;
    {
      std::lock_guard lk(ctx_->mu);
      if (ok && res.job_stopped) {
        ctx_->stopped_dir = res.dir.empty() ? r.dir : res.dir;
        ctx_->set_state_locked("stopped");
      } else {
        // A roll back that failed leaves the job suspended (engine.h).
        ctx_->set_state_locked(state_after(ctx_->status.state, before, res.code == kExitJobLost));
      }
      after = ctx_->status.state;
    }
    if (ok) {
      nlohmann::json d = {{"dir", res.dir.empty() ? r.dir : res.dir},
                          {"bytes", res.bytes},
                          {"phases", nlohmann::json::parse(phases_json_text(res.phases))},
                          {"job_stopped", res.job_stopped},
                          {"job", info.name}};
      add_cut_details(res.collective_cut, res.capture_retries, &d);
      result = make_result(true, kExitOk, "", json_text(d));
    } else {
      // The job's state after it, as a failed suspend's or resume's says.
      result = make_result(false, res.code == kExitOk ? kExitFailure : res.code, cerr,
                           json_text({{"job", info.name}, {"state", after}}));
      mark_cancelled(*cancel, info.name, &result);
    }
    std::lock_guard lk(send_mu);
    end_engine(ch, result);
    return;
  }
  if (req.type == proto::kMsgSuspend || req.type == proto::kMsgResume) {
    const bool suspend = req.type == proto::kMsgSuspend;
    proto::TimeoutRequest r;
    if (!req.get(&r, &err) || !proto::validate(r, &err)) {
      ch.send(proto::kMsgResult, make_result(false, kExitUsage, err), &err);
      return;
    }
    proto::Result refusal;
    auto cancel = suspend ? std::make_shared<CancelToken>() : nullptr;
    if (!begin_engine(req.type, cred, cancel, &refusal)) {
      ch.send(proto::kMsgResult, refusal, &err);
      return;
    }
    // The recorded state, read once: where it lets the request go ahead,
    // the job is marked at once; where it would refuse, the driver is asked
    // (read only) first, since the record may lag what the driver says
    // (suspend_resume_refusal).
    std::string before;
    bool ask_driver;
    {
      std::lock_guard lk(ctx_->mu);
      before = ctx_->status.state;
      ask_driver = suspend_record_refuses(suspend, before);
      if (!ask_driver) ctx_->set_state_locked(suspend ? "suspending" : "resuming");
    }
    if (ask_driver) {
      const DriverView view = driver_view(ops_.list_processes(info.root_pid));
      const bool left = !left_suspended_details(info).empty();
      std::string msg = suspend_resume_refusal(suspend, before, view, left, info.name);
      if (msg.empty()) {
        std::lock_guard lk(ctx_->mu);
        // Meanwhile only the job's end changes the state (engine calls run
        // one at a time): refused as begin_engine refuses an ended job.
        if (ctx_->status.state == before)
          ctx_->set_state_locked(suspend ? "suspending" : "resuming");
        else
          msg = "job " + info.name + " is " + ctx_->status.state + ": nothing to " + req.type;
      }
      if (!msg.empty()) {
        end_engine(ch, make_result(false, kExitRefused, msg));
        return;
      }
    }
    std::string serr;
    auto timeout = std::chrono::milliseconds(r.timeout_ms);
    SuspendResult sres;
    sres.code = kExitFailure;
    sres.cancel = cancel.get();
    std::mutex send_mu;
    bool client_gone = false;
    bool ok;
    {
      Heartbeat beat(ch, send_mu, client_gone, heartbeat_every(timeout_));
      ok = suspend ? ops_.suspend(info, timeout, r.settings, &sres, &serr)
                   : ops_.resume(info, timeout, r.settings, &sres.code, &serr);
    }
    const ExitCode code = !ok && sres.code == kExitOk ? kExitFailure : sres.code;
    std::string after;
    {
      std::lock_guard lk(ctx_->mu);
      after = ok ? (suspend ? "suspended" : "running")
                 : state_after(ctx_->status.state, before, code == kExitJobLost);
      ctx_->set_state_locked(after);
    }
    nlohmann::json d = {{"job", info.name}, {"state", after}};
    if (ok) add_cut_details(sres.collective_cut, sres.capture_retries, &d);
    // A success that did less than asked says why (resume_job_coded).
    if (ok && !serr.empty()) d["note"] = serr;
    proto::Result result = make_result(ok, ok ? kExitOk : code, serr, json_text(d));
    if (cancel) mark_cancelled(*cancel, info.name, &result);
    end_engine(ch, result);
    return;
  }
  if (req.type == proto::kMsgCancel) {
    serve_cancel(ch, req, cred, info);
    return;
  }
  ch.send(proto::kMsgResult, make_result(false, kExitUsage, "unknown request '" + req.type + "'"),
          &err);
}

}  // namespace cusnap
