#include "coord/control_server.h"

#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <doctest/doctest.h>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "coord/job_client.h"
#include "proto/wire.h"

using namespace cusnap;
using namespace std::chrono_literals;

namespace {

/// A control server over a fake engine in a temporary directory.
struct Fixture {
  std::string dir;
  JobContext ctx;
  std::unique_ptr<ControlServer> server;
  std::promise<void> release;  ///< the fake checkpoint waits for this
  std::shared_future<void> released{release.get_future().share()};
  std::atomic<int> checkpoints{0};
  bool commit_early = false;         ///< the fake checkpoint passes its point of no return at once
  std::atomic<bool> committed{false};  ///< it has (commit_early)
  proto::Settings suspend_settings;  ///< what the fake suspend was given
  std::chrono::milliseconds suspend_takes{0};  ///< how long the fake suspend works
  bool suspend_job_exits = false;              ///< the job exits while the fake suspend fails
  /// The cuda_state list_processes shows for the job's one process ("":
  /// it does not use CUDA).
  std::string cuda_state;
  std::string resume_note;  ///< what the fake resume puts in *err on success
  std::atomic<int> resumes{0};
  JobEntry entry;

  explicit Fixture(mode_t sock_mode = 0600) {
    char t[] = "/tmp/cusnap-cs-XXXXXX";
    REQUIRE(mkdtemp(t));
    dir = t;
    ctx.info.name = "fake";
    ctx.info.root_pid = getpid();
    ctx.info.owner_uid = geteuid();
    ctx.info.runtime_dir = dir;
    ctx.status.name = "fake";
    ctx.status.state = "running";
    CoordinatorOps ops;
    ops.checkpoint = [this](const JobInfo&, const CheckpointOptions& o, const ProgressSink& p,
                            CheckpointResult* r, std::string* err) {
      ++checkpoints;
      p(Progress{"dump", 10, 100});
      if (commit_early && o.cancel) {
        o.cancel->commit();
        committed = true;
      }
      released.wait();
      if (o.cancel && !o.cancel->commit()) {
        r->code = kExitFailure;
        *err = std::string(kCancelledReason) + "; the job runs on unchanged";
        return false;
      }
      p(Progress{"dump", 100, 100});
      r->dir = o.dir;
      r->bytes = 100;
      r->phases = {{"dump", 0.5}};
      r->job_stopped = !o.leave_running;
      return true;
    };
    ops.suspend = [this](const JobInfo&, std::chrono::milliseconds, const proto::Settings& s,
                         SuspendResult* res, std::string* err) {
      suspend_settings = s;
      std::this_thread::sleep_for(suspend_takes);
      if (suspend_job_exits) {
        std::lock_guard lk(ctx.mu);
        ctx.set_state_locked("exited");
        *err = "the job exited";
        return false;
      }
      res->collective_cut = {{41, 8}, {42, 8}};
      res->capture_retries = 3;
      return true;
    };
    ops.resume = [this](const JobInfo&, std::chrono::milliseconds, const proto::Settings&,
                        ExitCode*, std::string* err) {
      ++resumes;
      *err = resume_note;
      return true;
    };
    ops.list_processes = [this](pid_t root) {
      ProcessInfo p;
      p.pid = root;
      p.exe = "/bin/fake";
      p.uses_cuda = !cuda_state.empty();
      p.cuda_state = cuda_state;
      return std::vector<ProcessInfo>{p};
    };
    UniqueFd l;
    std::string err;
    REQUIRE(proto::listen_unix(dir + "/control.sock", sock_mode, &l, &err));
    server = std::make_unique<ControlServer>(&ctx, ops, std::move(l), 2000ms);
    REQUIRE(server->start(&err));
    entry.dir = dir;
    entry.status.name = "fake";
  }
  ~Fixture() {
    server->stop();
    (void)!system(("rm -rf " + dir).c_str());
  }
};

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

/// Takes every descriptor the process may open (RLIMIT_NOFILE lowered to a
/// little above the highest open one, the rest filled with duplicates);
/// gives them back on destruction.
struct NoDescriptorsLeft {
  rlimit old{};
  std::vector<int> fds;
  NoDescriptorsLeft() {
    getrlimit(RLIMIT_NOFILE, &old);
    int high = 0;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd"))
      high = std::max(high, std::atoi(e.path().filename().c_str()));
    rlimit low = old;
    low.rlim_cur = std::min<rlim_t>(old.rlim_cur, static_cast<rlim_t>(high) + 64);
    setrlimit(RLIMIT_NOFILE, &low);
    for (;;) {
      int fd = ::fcntl(0, F_DUPFD_CLOEXEC, 0);
      if (fd < 0) break;
      fds.push_back(fd);
    }
  }
  ~NoDescriptorsLeft() {
    for (int fd : fds) ::close(fd);
    setrlimit(RLIMIT_NOFILE, &old);
  }
};

}  // namespace

TEST_CASE("control server: hello and inspect") {
  Fixture f;
  std::string err;
  proto::JobStatus s;
  REQUIRE(job_hello(f.entry, 1000ms, &s, &err));
  CHECK(s.name == "fake");
  CHECK(s.state == "running");
  proto::Result r;
  REQUIRE(
      job_request(f.entry, 1000ms, 1000ms, proto::kMsgInspect, proto::Empty{}, nullptr, &r, &err));
  CHECK(r.ok);
  auto j = nlohmann::json::parse(r.details);
  CHECK(j["processes"][0]["exe"] == "/bin/fake");
  CHECK_FALSE(j.contains("left_suspended"));
  // A job a failed roll back left suspended: its marker is in the details.
  {
    std::ofstream(f.dir + "/left-suspended")
        << R"({"operation":"suspend","since":"2026-12-02T09:00:00Z","reason":"driver restore phase: x"})";
  }
  REQUIRE(
      job_request(f.entry, 1000ms, 1000ms, proto::kMsgInspect, proto::Empty{}, nullptr, &r, &err));
  j = nlohmann::json::parse(r.details);
  REQUIRE(j.contains("left_suspended"));
  CHECK(j["left_suspended"]["operation"] == "suspend");
  CHECK(j["left_suspended"]["since"] == "2026-12-02T09:00:00Z");
  CHECK(j["left_suspended"]["reason"] == "driver restore phase: x");
  CHECK(j["left_suspended"]["restore_refused"] == false);
  f.release.set_value();
}

TEST_CASE("control server: a checkpoint streams progress; a second one is refused meanwhile") {
  Fixture f;
  std::string err;
  std::vector<proto::ProgressEvent> seen;
  auto first = std::async(std::launch::async, [&] {
    proto::Result r;
    std::string e;
    bool ok = job_request(
        f.entry, 1000ms, 5000ms, proto::kMsgCheckpoint,
        proto::CheckpointRequest{"/tmp/ckpt", false, 1000, {}},
        [&](const proto::ProgressEvent& ev) { seen.push_back(ev); }, &r, &e);
    return std::make_pair(ok, r);
  });
  while (f.checkpoints == 0) std::this_thread::sleep_for(5ms);

  proto::Result r2;
  REQUIRE(job_request(f.entry, 1000ms, 1000ms, proto::kMsgCheckpoint,
                      proto::CheckpointRequest{"/tmp/other", false, 1000, {}}, nullptr, &r2, &err));
  CHECK(!r2.ok);
  CHECK(r2.exit_code == kExitRefused);
  CHECK(r2.message == "a checkpoint of job fake is already running");
  proto::JobStatus s;
  REQUIRE(job_hello(f.entry, 1000ms, &s, &err));  // still answers
  CHECK(s.state == "checkpointing");

  f.release.set_value();
  auto [ok, r] = first.get();
  REQUIRE(ok);
  CHECK(r.ok);
  CHECK(r.exit_code == kExitOk);
  CHECK(nlohmann::json::parse(r.details)["dir"] == "/tmp/ckpt");
  REQUIRE(seen.size() == 2);
  CHECK(seen[1].bytes_done == 100);
  std::lock_guard lk(f.ctx.mu);
  CHECK(f.ctx.stopped_dir == "/tmp/ckpt");
  CHECK(f.ctx.status.state == "stopped");
  CHECK(f.ctx.engine_op.empty());  // cleared before the result was sent
}

TEST_CASE("control server: malformed and unknown requests get a usage result") {
  Fixture f;
  f.release.set_value();
  std::string err;
  proto::Result r;
  REQUIRE(job_request(f.entry, 1000ms, 1000ms, proto::kMsgCheckpoint,
                      proto::CheckpointRequest{"relative/dir", false, 1000, {}}, nullptr, &r,
                      &err));
  CHECK(r.exit_code == kExitUsage);
  REQUIRE(job_request(f.entry, 1000ms, 1000ms, proto::kMsgCheckpoint, std::string("junk"), nullptr,
                      &r, &err));
  CHECK(r.exit_code == kExitUsage);
  REQUIRE(
      job_request(f.entry, 1000ms, 1000ms, "launch-missiles", proto::Empty{}, nullptr, &r, &err));
  CHECK(r.exit_code == kExitUsage);
  REQUIRE(job_request(f.entry, 1000ms, 1000ms, proto::kMsgSuspend,
                      proto::TimeoutRequest{1000, {{"LD_PRELOAD", "/x.so"}}}, nullptr, &r, &err));
  CHECK(r.exit_code == kExitUsage);
  CHECK(r.message.find("unknown setting 'LD_PRELOAD'") != std::string::npos);
  CHECK(f.ctx.status.state == "running");
  CHECK(f.checkpoints == 0);
}

TEST_CASE("control server: suspend and resume move the state") {
  Fixture f;
  f.release.set_value();
  std::string err;
  proto::Result r;
  REQUIRE(job_request(f.entry, 1000ms, 1000ms, proto::kMsgResume, proto::TimeoutRequest{1000, {}},
                      nullptr, &r, &err));
  CHECK(r.exit_code == kExitRefused);  // not suspended
  // The message names the command that helps.
  CHECK(r.message.find("is not suspended") != std::string::npos);
  CHECK(r.message.find("cusnap suspend " + f.ctx.status.name) != std::string::npos);
  const proto::Settings sent{{"CUSNAP_ALLOW_RANKS_SHARING_GPU", "1"}};
  REQUIRE(job_request(f.entry, 1000ms, 1000ms, proto::kMsgSuspend,
                      proto::TimeoutRequest{1000, sent}, nullptr, &r, &err));
  CHECK(r.ok);
  CHECK(f.ctx.status.state == "suspended");
  CHECK(f.suspend_settings == sent);
  // The cut and the capture retries travel in the details, as a checkpoint's.
  const auto d = nlohmann::json::parse(r.details);
  CHECK(d.at("state") == "suspended");
  CHECK(d.at("collective_cut") == nlohmann::json{{"41", 8}, {"42", 8}});
  CHECK(d.at("capture_retries") == 3);
  REQUIRE(job_request(f.entry, 1000ms, 1000ms, proto::kMsgSuspend, proto::TimeoutRequest{1000, {}},
                      nullptr, &r, &err));
  CHECK(r.exit_code == kExitRefused);  // already suspended, and what helps
  CHECK(r.message == "job fake is already suspended: cusnap resume fake brings it back");
  CHECK(f.ctx.status.state == "suspended");
  // A checkpoint of the suspended job is refused before the engine (and the
  // guardian) hear of it.
  REQUIRE(job_request(f.entry, 1000ms, 1000ms, proto::kMsgCheckpoint,
                      proto::CheckpointRequest{f.dir + "/ck", false, 1000, {}}, nullptr, &r, &err));
  CHECK(r.exit_code == kExitRefused);
  CHECK(r.message ==
        "job fake is suspended: cusnap resume fake brings it back, then it can be checkpointed; "
        "nothing was changed");
  CHECK(f.checkpoints == 0);
  CHECK(f.ctx.status.state == "suspended");
  REQUIRE(job_request(f.entry, 1000ms, 1000ms, proto::kMsgResume, proto::TimeoutRequest{1000, {}},
                      nullptr, &r, &err));
  CHECK(r.ok);
  CHECK(f.ctx.status.state == "running");
  CHECK_FALSE(nlohmann::json::parse(r.details).contains("collective_cut"));  // resume: none
}

TEST_CASE("control server: the recorded suspend state follows what the driver says") {
  Fixture f;
  f.release.set_value();
  std::string err;
  proto::Result r;
  // Recorded suspended, the driver runs the job (brought back outside cusnap):
  // suspend is refused saying so and what helps; resume records it running
  // and passes the engine's note on.
  f.ctx.status.state = "suspended";
  f.cuda_state = "running";
  REQUIRE(job_request(f.entry, 1000ms, 1000ms, proto::kMsgSuspend, proto::TimeoutRequest{1000, {}},
                      nullptr, &r, &err));
  CHECK(r.exit_code == kExitRefused);
  CHECK(r.message.find("recorded suspended, but the driver runs every process") !=
        std::string::npos);
  CHECK(r.message.find("cusnap resume fake records it running") != std::string::npos);
  CHECK(f.ctx.status.state == "suspended");
  f.resume_note = "job fake was recorded suspended, but the driver already runs it";
  REQUIRE(job_request(f.entry, 1000ms, 1000ms, proto::kMsgResume, proto::TimeoutRequest{1000, {}},
                      nullptr, &r, &err));
  CHECK(r.ok);
  CHECK(f.ctx.status.state == "running");
  CHECK(nlohmann::json::parse(r.details).at("note") == f.resume_note);
  CHECK(nlohmann::json::parse(r.details).at("state") == "running");
  // Now it can be suspended again.
  REQUIRE(job_request(f.entry, 1000ms, 1000ms, proto::kMsgSuspend, proto::TimeoutRequest{1000, {}},
                      nullptr, &r, &err));
  CHECK(r.ok);
  CHECK(f.ctx.status.state == "suspended");

  // Recorded running, the driver holds it checkpointed (suspended outside
  // cusnap): resume goes ahead and records it running.
  f.ctx.status.state = "running";
  f.cuda_state = "checkpointed";
  f.resume_note.clear();
  const int before = f.resumes;
  REQUIRE(job_request(f.entry, 1000ms, 1000ms, proto::kMsgResume, proto::TimeoutRequest{1000, {}},
                      nullptr, &r, &err));
  CHECK(r.ok);
  CHECK(f.resumes == before + 1);
  CHECK(f.ctx.status.state == "running");
  CHECK_FALSE(nlohmann::json::parse(r.details).contains("note"));
  // Recorded running, the driver runs it: resume is refused without asking the engine.
  f.cuda_state = "running";
  REQUIRE(job_request(f.entry, 1000ms, 1000ms, proto::kMsgResume, proto::TimeoutRequest{1000, {}},
                      nullptr, &r, &err));
  CHECK(r.exit_code == kExitRefused);
  CHECK(r.message.find("is not suspended") != std::string::npos);
  CHECK(f.resumes == before + 1);
  // Recorded suspended, the driver holds it: the usual refusal of suspend.
  f.ctx.status.state = "suspended";
  f.cuda_state = "checkpointed";
  REQUIRE(job_request(f.entry, 1000ms, 1000ms, proto::kMsgSuspend, proto::TimeoutRequest{1000, {}},
                      nullptr, &r, &err));
  CHECK(r.message == "job fake is already suspended: cusnap resume fake brings it back");
}

TEST_CASE("control server: the refusal of a suspend or resume, by record, driver and marker") {
  const std::string kNotSuspended =
      "job j is not suspended: nothing to resume (cusnap suspend j suspends it)";
  const std::string kAlready = "job j is already suspended: cusnap resume j brings it back";
  const std::string kDriverRuns =
      "job j is recorded suspended, but the driver runs every process of it (its GPU state was "
      "brought back outside cusnap resume): cusnap resume j records it running, and it can be "
      "suspended then";
  struct Row {
    bool suspend;
    const char* recorded;
    DriverView view;  // cuda, running, held
    bool left;
    const std::string& refusal;  // empty: goes ahead
  };
  const std::string go;
  const Row rows[] = {
      // The record lets it go ahead: the driver is not looked at.
      {true, "running", {1, 0, 1}, false, go},
      {true, "running", {1, 1, 0}, true, go},
      {false, "suspended", {1, 1, 0}, false, go},
      {false, "suspended", {0, 0, 0}, true, go},
      // Resume of a job recorded running: ahead only where the driver holds a process.
      {false, "running", {1, 1, 0}, false, kNotSuspended},
      {false, "running", {0, 0, 0}, false, kNotSuspended},
      {false, "running", {2, 1, 0}, true, kNotSuspended},
      {false, "running", {1, 0, 1}, false, go},
      {false, "running", {2, 1, 1}, true, go},
      // Suspend of a job recorded suspended: always refused, saying why.
      {true, "suspended", {1, 1, 0}, false, kDriverRuns},
      {true, "suspended", {2, 2, 0}, false, kDriverRuns},
      {true, "suspended", {2, 2, 0}, true, kAlready},  // left suspended: resume first
      {true, "suspended", {2, 1, 1}, false, kAlready},
      {true, "suspended", {1, 0, 1}, false, kAlready},
      {true, "suspended", {0, 0, 0}, false, kAlready},  // no CUDA process
  };
  CHECK_FALSE(suspend_record_refuses(true, "running"));
  CHECK(suspend_record_refuses(true, "suspended"));
  CHECK(suspend_record_refuses(false, "running"));
  CHECK_FALSE(suspend_record_refuses(false, "suspended"));
  for (const Row& row : rows) {
    CAPTURE(row.suspend);
    CAPTURE(row.recorded);
    CAPTURE(row.view.cuda);
    CAPTURE(row.view.running);
    CAPTURE(row.view.held);
    CAPTURE(row.left);
    CHECK(suspend_resume_refusal(row.suspend, row.recorded, row.view, row.left, "j") ==
          row.refusal);
  }
}

// A released fixture's control socket, connected, with a 4 s channel timeout.
static proto::Channel connect_released(Fixture& f) {
  f.release.set_value();
  UniqueFd c;
  std::string err;
  REQUIRE(proto::connect_unix(f.dir + "/control.sock", 1000ms, &c, &err));
  return proto::Channel(std::move(c), 4000ms);
}

TEST_CASE("control server: heartbeats keep a client waiting through a long operation") {
  Fixture f;
  f.release.set_value();
  f.suspend_takes = 1500ms;  // three heartbeats at the fixture's 2 s timeout
  proto::Result r;
  std::string err;
  int events = 0;
  // The client waits 800 ms for each message: without heartbeats it gives up.
  REQUIRE(job_request(
      f.entry, 1000ms, 800ms, proto::kMsgSuspend, proto::TimeoutRequest{5000, {}},
      [&](const proto::ProgressEvent&) { ++events; }, &r, &err));
  CHECK(r.ok);
  CHECK(events == 0);  // heartbeats do not reach the progress handler
  CHECK(f.ctx.status.state == "suspended");
}

TEST_CASE("control server: a client that waits too little is told the outcome is unknown") {
  Fixture f;
  f.release.set_value();
  f.suspend_takes = 1500ms;
  proto::Result r;
  std::string err;
  // The client's wait is shorter than a heartbeat's interval (500 ms).
  CHECK_FALSE(job_request(f.entry, 1000ms, 200ms, proto::kMsgSuspend,
                          proto::TimeoutRequest{5000, {}}, nullptr, &r, &err));
  CHECK_MESSAGE(err.find("job " + f.entry.status.name +
                         ": no answer from the supervisor: timed out waiting 0.2 s for a "
                         "message") == 0,
                err);
  CHECK(err.find("cusnap ps") != std::string::npos);
  // The operation goes on without the client, and completes.
  for (int i = 0; i < 100 && f.ctx.status.state != "suspended"; ++i)
    std::this_thread::sleep_for(50ms);
  std::lock_guard lk(f.ctx.mu);
  CHECK(f.ctx.status.state == "suspended");
}

TEST_CASE("control server: a job that exits during a failed operation stays exited") {
  Fixture f;
  f.release.set_value();
  f.suspend_job_exits = true;
  proto::Result r;
  std::string err;
  REQUIRE(job_request(f.entry, 1000ms, 2000ms, proto::kMsgSuspend, proto::TimeoutRequest{5000, {}},
                      nullptr, &r, &err));
  CHECK_FALSE(r.ok);
  CHECK(nlohmann::json::parse(r.details).at("state") == "exited");
  std::lock_guard lk(f.ctx.mu);
  CHECK(f.ctx.status.state == "exited");  // not "running" again
}

TEST_CASE("control server: a silent client is dropped after the timeout") {
  Fixture f;
  proto::Channel ch = connect_released(f);
  std::string err;
  proto::Message m;
  CHECK(!ch.recv(&m, &err));  // the server's 2 s timeout closes it first
  CHECK(err == "connection closed");
}

TEST_CASE("control server: a request longer than kMaxRequestBytes is refused unread") {
  Fixture f;
  proto::Channel ch = connect_released(f);
  std::string err;
  // A well-formed request one byte over the limit: [1, "hello", "xx..."].
  const std::string pad(proto::kMaxRequestBytes, 'x');
  const std::string body = proto::encode_body(proto::kMsgHello, pad);
  REQUIRE(body.size() > proto::kMaxRequestBytes);
  // The server closes the connection once it has read the length: the
  // sending fails (EPIPE, reset) when that comes before the body is in the
  // socket's buffer, else the reading.
  if (ch.send_body(body, -1, &err)) {
    proto::Message m;
    CHECK(!ch.recv(&m, &err));  // closed, or reset: the server left the body unread
    CHECK((err == "connection closed" || err.find("reset") != std::string::npos));
  } else {
    INFO(err);
    CHECK((err.find("Broken pipe") != std::string::npos || err.find("reset") != std::string::npos));
  }
  // The server goes on serving.
  proto::JobStatus st;
  REQUIRE(job_hello(f.entry, 1000ms, &st, &err));
  CHECK(st.state == "running");
}

TEST_CASE("control server: a request of another protocol version is told the version spoken") {
  Fixture f;
  proto::Channel ch = connect_released(f);
  std::string err;
  const std::string other =
      proto::encode_body_of_version(proto::kProtocolVersion + 1, proto::kMsgHello, proto::Empty{});
  REQUIRE(ch.send_body(other, -1, &err));
  proto::Message m;
  REQUIRE(ch.recv(&m, &err));
  REQUIRE(m.type == proto::kMsgResult);
  proto::Result r;
  REQUIRE(m.get(&r, &err));
  CHECK(!r.ok);
  CHECK(r.exit_code == kExitUsage);
  CHECK(r.message == "request refused: unsupported protocol version " +
                         std::to_string(proto::kProtocolVersion + 1) + " (this side speaks " +
                         std::to_string(proto::kProtocolVersion) + ")");
}

TEST_CASE("job client: a supervisor answering in another protocol version is named as such") {
  char t[] = "/tmp/cusnap-ctl-XXXXXX";
  REQUIRE(mkdtemp(t));
  const std::string dir = t;
  UniqueFd l;
  std::string err;
  REQUIRE(proto::listen_unix(dir + "/control.sock", 0600, &l, &err));
  // A supervisor of a later cusnap: reads a request, answers in version 2.
  // It waits 5 s at most for the client, so that join cannot hang.
  std::thread other([&l] {
    pollfd p{l.get(), POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) return;
    UniqueFd c;
    std::string e;
    if (!proto::accept_unix(l.get(), &c, &e)) return;
    proto::Channel ch(std::move(c), 2000ms);
    std::string body;
    UniqueFd fd;
    if (!ch.recv_body(&body, &fd, &e)) return;
    const std::string other = proto::encode_body_of_version(proto::kProtocolVersion + 1,
                                                            proto::kMsgHello, proto::Empty{});
    ch.send_body(other, -1, &e);
  });
  JobEntry entry;
  entry.dir = dir;
  entry.status.name = "later";
  proto::JobStatus st;
  CHECK(!job_hello(entry, 2000ms, &st, &err));
  other.join();
  CHECK(err.find("unsupported protocol version") != std::string::npos);
  CHECK(err.find("likely started by another version of cusnap") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("control server: a peer that is neither root nor the owner is refused") {
  if (geteuid() != 0) return;  // needs to switch uid
  Fixture f(0666);
  f.release.set_value();
  REQUIRE(chmod(f.dir.c_str(), 0755) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(10);
    UniqueFd c;
    std::string err;
    if (!proto::connect_unix(f.dir + "/control.sock", 1000ms, &c, &err)) _exit(11);
    proto::Channel ch(std::move(c), 2000ms);  // the refusal comes before any request
    proto::Message m;
    if (!ch.recv(&m, &err)) _exit(13);
    proto::Result r;
    if (m.type != proto::kMsgResult || !m.get(&r, &err)) _exit(14);
    _exit(!r.ok && r.exit_code == kExitRefused && r.message.find("permission denied") == 0 ? 0
                                                                                           : 15);
  }
  int st = 0;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
}

TEST_CASE("control server: out of descriptors, the accept loop waits instead of spinning") {
  Fixture f;
  f.release.set_value();
  std::string err;
  const std::string path = f.dir + "/control.sock";

  // The client's socket is made first: connecting needs no descriptor.
  UniqueFd client(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(client);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  double spent = 0;
  {
    NoDescriptorsLeft none;
    REQUIRE(!none.fds.empty());
    CHECK(::fcntl(0, F_DUPFD_CLOEXEC, 0) < 0);
    REQUIRE(::connect(client.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    const double before = process_cpu_seconds();
    std::this_thread::sleep_for(1s);
    spent = process_cpu_seconds() - before;
  }
  INFO("CPU time of the process over 1 s without descriptors: " << spent << " s");
  CHECK(spent < 0.25);
  // With descriptors back, the pending connection is served.
  REQUIRE(::fcntl(client.get(), F_SETFL, ::fcntl(client.get(), F_GETFL) | O_NONBLOCK) == 0);
  proto::Channel ch(std::move(client), 3000ms);
  REQUIRE(ch.send(proto::kMsgHello, proto::Empty{}, &err));
  proto::Message m;
  REQUIRE(ch.recv(&m, &err));
  CHECK(m.type == proto::kMsgHello);
}

namespace {

/// A cancel of op sent as a client does (job_cancel), or with own false.
proto::Result send_cancel(const JobEntry& e, const std::string& op, bool own = true) {
  proto::Result r;
  std::string err;
  if (own) {
    REQUIRE(job_cancel(e, 1000ms, op, &r, &err));
    return r;
  }
  proto::Channel ch;
  REQUIRE(connect_job(e, 1000ms, &ch, &err));
  REQUIRE(ch.send(proto::kMsgCancel, proto::CancelRequest{op, false}, &err));
  REQUIRE(await_result(ch, 1000ms, nullptr, &r, &err));
  return r;
}

std::string cancel_said(const proto::Result& r) {
  auto j = nlohmann::json::parse(r.details, nullptr, false);
  return j.is_object() ? j.value("cancel", std::string()) : std::string();
}

}  // namespace

TEST_CASE("control server: a cancel reaches the running checkpoint; its result says cancelled") {
  Fixture f;
  bool own = true;
  SUBCASE("from this client") {
    own = true;
  }
  SUBCASE("from any client of the uid") {
    own = false;
  }
  auto first = std::async(std::launch::async, [&] {
    proto::Result r;
    std::string e;
    bool ok = job_request(f.entry, 1000ms, 5000ms, proto::kMsgCheckpoint,
                          proto::CheckpointRequest{"/tmp/ckpt", false, 1000, {}}, nullptr, &r, &e);
    return std::make_pair(ok, r);
  });
  while (f.checkpoints == 0) std::this_thread::sleep_for(5ms);
  // A suspend is not running: nothing of it to cancel.
  proto::Result none = send_cancel(f.entry, proto::kMsgSuspend, own);
  CHECK_FALSE(none.ok);
  CHECK(none.exit_code == kExitRefused);
  CHECK(none.message.find("nothing to cancel") != std::string::npos);
  proto::Result c = send_cancel(f.entry, proto::kMsgCheckpoint, own);
  CHECK(c.ok);
  CHECK(cancel_said(c) == proto::kCancelRequested);
  CHECK(cancel_said(send_cancel(f.entry, proto::kMsgCheckpoint, own)) == proto::kCancelRequested);
  f.release.set_value();
  auto [ok, r] = first.get();
  REQUIRE(ok);
  CHECK_FALSE(r.ok);
  CHECK(r.exit_code == kExitFailure);
  auto d = nlohmann::json::parse(r.details);
  CHECK(d["cancelled"] == true);
  CHECK(d["job"] == "fake");
  CHECK(f.ctx.status.state == "running");
  // Over, the checkpoint has nothing left to cancel.
  CHECK(send_cancel(f.entry, proto::kMsgCheckpoint, own).exit_code == kExitRefused);
}

TEST_CASE("control server: a cancel after the point of no return is too late; it completes") {
  Fixture f;
  f.commit_early = true;
  auto first = std::async(std::launch::async, [&] {
    proto::Result r;
    std::string e;
    bool ok = job_request(f.entry, 1000ms, 5000ms, proto::kMsgCheckpoint,
                          proto::CheckpointRequest{"/tmp/ckpt", true, 1000, {}}, nullptr, &r, &e);
    return std::make_pair(ok, r);
  });
  for (int i = 0; i < 2000 && !f.committed; ++i) std::this_thread::sleep_for(5ms);
  if (!f.committed) {  // let the fake end, so that the request's future can
    f.release.set_value();
    FAIL("the fake checkpoint never passed its commit");
  }
  proto::Result c = send_cancel(f.entry, proto::kMsgCheckpoint);
  CHECK(c.ok);
  CHECK(cancel_said(c) == proto::kCancelTooLate);
  f.release.set_value();
  auto [ok, r] = first.get();
  REQUIRE(ok);
  CHECK(r.ok);
  CHECK_FALSE(nlohmann::json::parse(r.details).contains("cancelled"));
}

TEST_CASE("control server: a cancel of what cannot be cancelled is a usage error") {
  Fixture f;
  proto::Channel ch;
  std::string err;
  REQUIRE(connect_job(f.entry, 1000ms, &ch, &err));
  REQUIRE(ch.send(proto::kMsgCancel, proto::CancelRequest{"resume", true}, &err));
  proto::Result r;
  REQUIRE(await_result(ch, 1000ms, nullptr, &r, &err));
  CHECK_FALSE(r.ok);
  CHECK(r.exit_code == kExitUsage);
  CHECK(r.message.find("cannot be cancelled") != std::string::npos);
  f.release.set_value();
}

TEST_CASE("job client: an interrupt while waiting asks for the cancel; the wait is then bounded") {
  Fixture f;
  int p[2];
  REQUIRE(::pipe(p) == 0);
  proto::Result reply;
  int interrupts = 0;
  InterruptHook hook;
  hook.fd = p[0];
  hook.on_interrupt = [&] {
    ++interrupts;
    std::string e;
    CHECK(job_cancel(f.entry, 1000ms, proto::kMsgCheckpoint, &reply, &e));
    return std::chrono::milliseconds(300);
  };
  // A checkpoint asked on a thread, interrupted once the engine runs it.
  struct Outcome {
    bool ok;
    proto::Result r;
    std::string e;
  };
  auto interrupted_checkpoint = [&] {
    auto first = std::async(std::launch::async, [&] {
      Outcome o{};
      o.ok = job_request(f.entry, 1000ms, 5000ms, proto::kMsgCheckpoint,
                         proto::CheckpointRequest{"/tmp/ckpt", false, 1000, {}}, nullptr, &o.r,
                         &o.e, hook);
      return o;
    });
    while (f.checkpoints == 0) std::this_thread::sleep_for(5ms);
    REQUIRE(::write(p[1], "x", 1) == 1);
    return first;
  };
  SUBCASE("the result comes within the bound") {
    auto first = interrupted_checkpoint();
    while (cancel_said(reply).empty()) std::this_thread::sleep_for(5ms);
    f.release.set_value();
    const Outcome o = first.get();
    REQUIRE(o.ok);
    CHECK(nlohmann::json::parse(o.r.details)["cancelled"] == true);
  }
  SUBCASE("no result within the bound: the outcome is not known") {
    const Outcome o = interrupted_checkpoint().get();  // heartbeats go on; the bound ends it
    const bool ok = o.ok;
    const std::string& e = o.e;
    CHECK_FALSE(ok);
    CHECK_MESSAGE(e.find("within the cancel's bound") != std::string::npos, e);
    CHECK(e.find("not known") != std::string::npos);
    f.release.set_value();
  }
  CHECK(interrupts == 1);
  ::close(p[0]);
  ::close(p[1]);
}
