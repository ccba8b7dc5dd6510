// Guardian (guardian.h).
#include "coord/guardian.h"

#include "coord/coordinator_ops.h"
#include "coord/hex.h"
#include "coord/procs.h"
#include "coord/supervisor_loop.h"
#include "proto/control.h"
#include "proto/json_text.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

namespace cusnap {

namespace {

/// What the kernel adds to /proc/PID/exe once the file was replaced.
constexpr std::string_view kDeletedSuffix = " (deleted)";

/// The guardian process. Never returns.
[[noreturn]] void guardian_main(const JobInfo& job, int cmd_r, int out_r, int err_r, int log_fd,
                                int lock_fd) {
  // Quiet: the job's terminal is not ours to write to; signals that would
  // reach the supervisor's group must not end us before we are needed.
  for (int s : {SIGINT, SIGHUP, SIGPIPE, SIGTERM}) ::signal(s, SIG_IGN);
  ::prctl(PR_SET_NAME, "cusnap-guardian");
  std::string buf;
  GuardedOperation op;
  bool dismissed = false;
  char chunk[512];
  for (;;) {
    ssize_t n = ::read(cmd_r, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buf.append(chunk, static_cast<size_t>(n));
    size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      std::string line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      if (line == "dismiss") {
        dismissed = true;
      } else if (line == "end") {
        op = GuardedOperation();
      } else {
        // What does not parse leaves the last operation as it was.
        GuardedOperation next;
        if (parse_guardian_begin(line, &next)) op = next;
      }
    }
  }
  if (dismissed) ::_exit(0);
  // The log the supervisor wrote last: past its cap it started a new one.
  if (!job.runtime_dir.empty()) {
    const int now = ::open((job.runtime_dir + "/output.log").c_str(),
                           O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW);
    if (now >= 0) {
      ::dup3(now, log_fd, O_CLOEXEC);
      ::close(now);
    }
  }
  auto log = [&](const std::string& s) { write_all(log_fd, s.data(), s.size()); };
  bool ok = true;
  RecoverBlock blocked = RecoverBlock::kNone;
  if (!op.op.empty()) {
    log("cusnap: the supervisor of job " + job.name + " died during " + op.op +
        "; the guardian brings the job back\n");
    std::string report;
    // The operation's own timeout and free-memory margin, as its client set them.
    ok = recover_job(job, op.state_dir, op.remove_partial, &report, op.timeout, &blocked,
                     op.margin ? op.margin->c_str() : nullptr, {op.dump_log, op.network_lock});
    // What recover_job left of a directory the checkpoint made: nothing,
    // unless a manifest got written (then it is not empty, and stays).
    if (ok && op.remove_partial && op.dir_made) ::rmdir(op.state_dir.c_str());
    std::istringstream lines(report);
    for (std::string l; std::getline(lines, l);) log("cusnap: guardian: " + l + "\n");
  } else {
    log("cusnap: the supervisor of job " + job.name + " died; the guardian takes over\n");
  }
  // A job the recovery could not bring back completely is left suspended
  // (recover_job marks it): supervised, cusnap resume can try again.
  if (lock_fd >= 0 && !job.runtime_dir.empty() && process_runs(job.root_pid)) {
    // Supervise it from here on: a control socket in the same place, so ps,
    // checkpoint, suspend and resume find the job again.
    SupervisorConfig cfg;
    cfg.name = job.name;
    cfg.runtime_dir = job.runtime_dir;
    cfg.echo_output = false;
    std::unique_ptr<SupervisorLoop> loop;
    SuperviseOutcome fail;
    if (SupervisorLoop::adopt(cfg, job.runtime_dir, lock_fd, &loop, &fail)) {
      // A recovery that can never succeed (the driver refused the restore,
      // or the saved shared memory is gone) must not send the user to
      // cusnap resume: the report above says what to do instead.
      const std::string by = "supervised by process " + std::to_string(::getpid());
      log(ok ? "cusnap: guardian: the job runs on, " + by + "\n"
          : blocks_for_good(blocked)
              ? "cusnap: guardian: the job cannot be brought back; it is left suspended, " + by +
                    " (cusnap inspect " + job.name + " says why)\n"
              : "cusnap: guardian: the job could not be brought back completely; it is left "
                "suspended, " +
                    by + ": run cusnap resume " + job.name + " to try again\n");
      ::close(log_fd);
      SuperviseOutcome out =
          loop->run(job, UniqueFd(out_r), UniqueFd(err_r), "", default_coordinator_ops());
      ::_exit(out.exit_code & 0xff);
    }
    log("cusnap: guardian: cannot supervise the job (" + fail.error + ")\n");
  }
  if (!process_runs(job.root_pid))  // gone, or a zombie no supervisor reaps
    log("cusnap: guardian: the job has ended (its process " + std::to_string(job.root_pid) +
        " is gone)\n");
  else
    log(ok ? "cusnap: guardian: the job runs on, unsupervised; its output goes on into this log\n"
           : "cusnap: guardian: the job could not be brought back completely\n");
  // The output: into the log until every writer is gone.
  std::vector<char> data(1 << 16);
  for (;;) {
    pollfd p[2] = {{out_r, POLLIN, 0}, {err_r, POLLIN, 0}};
    if (out_r < 0 && err_r < 0) break;
    if (::poll(p, 2, -1) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      int& fd = i == 0 ? out_r : err_r;
      if (fd < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = ::read(fd, data.data(), data.size());
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {
        ::close(fd);
        fd = -1;
        continue;
      }
      write_all(log_fd, data.data(), static_cast<size_t>(n));
    }
  }
  ::_exit(0);
}

nlohmann::json job_to_json(const JobInfo& j) {
  return {{"name", j.name},           {"root_pid", j.root_pid},       {"argv", j.argv},
          {"cwd", j.cwd},             {"runtime_dir", j.runtime_dir}, {"shim_dir", j.shim_dir},
          {"owner_uid", j.owner_uid}, {"stdout_pipe", j.stdout_pipe_id},
          {"stderr_pipe", j.stderr_pipe_id}};
}

bool job_from_json(const std::string& text, JobInfo* j) {
  try {
    auto o = nlohmann::json::parse(text);
    j->name = o.at("name").get<std::string>();
    j->root_pid = o.at("root_pid").get<pid_t>();
    j->argv = o.at("argv").get<std::vector<std::string>>();
    j->cwd = o.at("cwd").get<std::string>();
    j->runtime_dir = o.at("runtime_dir").get<std::string>();
    j->shim_dir = o.at("shim_dir").get<std::string>();
    j->owner_uid = o.at("owner_uid").get<uid_t>();
    j->stdout_pipe_id = o.at("stdout_pipe").get<std::string>();
    j->stderr_pipe_id = o.at("stderr_pipe").get<std::string>();
    return j->root_pid > 0;
  } catch (...) {
    return false;
  }
}

/// The job's description from the memory file the supervisor wrote it to
/// (Guardian::start), which is closed. Its size is bounded: a job's argv and
/// environment cannot exceed what exec takes, far below this.
bool job_from_fd(UniqueFd fd, JobInfo* job) {
  constexpr size_t kMax = 64u << 20;
  std::string text;
  char chunk[1 << 16];
  for (off_t off = 0;;) {
    ssize_t n = ::pread(fd.get(), chunk, sizeof chunk, off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || text.size() + static_cast<size_t>(n) > kMax) return false;
    if (n == 0) break;
    text.append(chunk, static_cast<size_t>(n));
    off += n;
  }
  return job_from_json(text, job);
}

}  // namespace

void guardian_command(int argc, char** argv) {
  int cmd = -1, out = -1, err = -1, log = -1, lock = -1, job_fd = -1;
  for (int i = 0; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    int v = std::atoi(argv[i + 1]);
    if (k == "--cmd-fd") cmd = v;
    else if (k == "--out-fd") out = v;
    else if (k == "--err-fd") err = v;
    else if (k == "--log-fd") log = v;
    else if (k == "--lock-fd") lock = v;
    else if (k == "--job-fd")
      job_fd = v;
  }
  JobInfo job;
  if (cmd < 0 || log < 0 || job_fd < 0 || !job_from_fd(UniqueFd(job_fd), &job)) {
    std::fprintf(stderr, "cusnap: __guardian is internal to the supervisor\n");
    ::_exit(kExitUsage);
  }
  for (int fd : {cmd, out, err, log, lock})
    if (fd >= 0) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  guardian_main(job, cmd, out, err, log, lock);
}

bool Guardian::start(const JobInfo& job, int out_r, int err_r, const std::string& log_path,
                     int lock_fd, std::string* err) {
  UniqueFd cmd_r, cmd_w;
  if (!make_pipe(&cmd_r, &cmd_w, 0, "guardian pipe", err)) return false;
  UniqueFd log(::open(log_path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW));
  if (!log) {
    *err = "guardian: opening " + log_path + ": " + std::strerror(errno);
    return false;
  }
  // The job's description goes by a memory file, not by argv: one argument
  // is limited to 128 KiB, and a job's own argv may be longer than that
  // (exec would fail with E2BIG and the guardian would be left in the
  // supervisor's image, where after a restore the driver answers only its
  // checkpoint API).
  UniqueFd job_mem(::memfd_create("cusnap-guardian-job", MFD_CLOEXEC));
  if (!job_mem) {
    *err = std::string("guardian: memfd_create: ") + std::strerror(errno);
    return false;
  }
  const std::string j = json_text(job_to_json(job));
  if (!write_all(job_mem.get(), j.data(), j.size())) {
    *err = std::string("guardian: writing the job's description: ") + std::strerror(errno);
    return false;
  }
  const int p[2] = {cmd_r.get(), cmd_w.get()}, log_fd = log.get(), job_fd = job_mem.get();
  pid_t pid = ::fork();
  if (pid < 0) {
    *err = std::string("guardian: fork: ") + std::strerror(errno);
    return false;
  }
  if (pid == 0) {
    ::close(p[1]);
    // Everything else the supervisor holds is not ours.
    for (int fd = 3; fd < 1024; ++fd)
      if (fd != p[0] && fd != out_r && fd != err_r && fd != log_fd && fd != lock_fd && fd != job_fd)
        ::close(fd);
    // Out of the supervisor's process group and session: a signal to them
    // must not reach the guardian.
    ::setsid();
    int devnull = ::open("/dev/null", O_RDWR);
    if (devnull >= 0) {
      ::dup2(devnull, 0);
      ::dup2(devnull, 1);
      ::dup2(devnull, 2);
      if (devnull > 2) ::close(devnull);
    }
    // A fresh image: the supervisor may have initialized the CUDA driver
    // (a restore does), after which a forked child's cuInit and device
    // queries fail (the free-memory check needs them).
    for (int fd : {p[0], out_r, err_r, log_fd, lock_fd, job_fd})
      if (fd >= 0) ::fcntl(fd, F_SETFD, 0);
    std::string a[] = {std::to_string(p[0]),   std::to_string(out_r),   std::to_string(err_r),
                       std::to_string(log_fd), std::to_string(lock_fd), std::to_string(job_fd)};
    const char* args[] = {"cusnap",     "__guardian", "--cmd-fd",   a[0].c_str(), "--out-fd",
                          a[1].c_str(), "--err-fd",   a[2].c_str(), "--log-fd",   a[3].c_str(),
                          "--lock-fd",  a[4].c_str(), "--job-fd",   a[5].c_str(), nullptr};
    char self[4096];
    ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
      self[n] = 0;
      const char* base = std::strrchr(self, '/');
      // Only the cusnap binary knows the command (not a test program). One
      // replaced on disk since it started (an upgrade) reads "cusnap
      // (deleted)": its image is executed all the same, as the same version.
      std::string_view name = base ? base + 1 : "";
      if (name.ends_with(kDeletedSuffix)) name.remove_suffix(kDeletedSuffix.size());
      if (name == "cusnap") ::execv("/proc/self/exe", const_cast<char* const*>(args));
    }
    // No exec (no /proc?): carry on in this image, which a launch's
    // supervisor left without driver state.
    ::close(job_fd);
    // out_r and err_r share their file status flags with the supervisor's
    // (O_NONBLOCK, which its loop needs): never change them here; the drain
    // below polls and takes EAGAIN in its stride.
    guardian_main(job, p[0], out_r, err_r, log_fd, lock_fd);
  }
  pipe_w_ = std::move(cmd_w);  // the read end and the log are the guardian's alone now
  pid_ = pid;
  return true;
}

void Guardian::send(const std::string& line) {
  if (!pipe_w_) return;
  std::string l = line + "\n";
  write_all(pipe_w_.get(), l.data(), l.size());
}

std::string guardian_begin_line(const GuardedOperation& op) {
  nlohmann::json j = {{"op", hex_encode(op.op)},
                      {"state_dir", hex_encode(op.state_dir)},
                      {"remove_partial", op.remove_partial},
                      {"dir_made", op.dir_made},
                      {"timeout_ms", static_cast<uint64_t>(op.timeout.count())}};
  if (op.margin) j["margin"] = hex_encode(*op.margin);
  if (!op.dump_log.empty()) j["dump_log"] = hex_encode(op.dump_log);
  if (!op.network_lock.empty()) j["network_lock"] = hex_encode(op.network_lock);
  return "begin " + j.dump();
}

bool parse_guardian_begin(const std::string& line, GuardedOperation* out) noexcept {
  try {
    if (line.rfind("begin ", 0) != 0) return false;
    const nlohmann::json j = nlohmann::json::parse(line.substr(6), nullptr, false);
    if (!j.is_object()) return false;
    // Every string field is hex (guardian_begin_line); a field of the
    // wrong type throws, which refuses the line.
    GuardedOperation op;
    if (!hex_decode(j.value("op", ""), &op.op) || op.op.empty()) return false;
    if (!hex_decode(j.value("state_dir", ""), &op.state_dir)) return false;
    op.remove_partial = j.value("remove_partial", false);
    op.dir_made = j.value("dir_made", false);
    if (j.contains("timeout_ms") && !j["timeout_ms"].is_number_unsigned()) return false;
    const uint64_t ms = j.value("timeout_ms", uint64_t{0});
    // Zero, or beyond what a request may carry: the default stands.
    if (ms > 0 && ms <= uint64_t(proto::kMaxTimeoutMs)) op.timeout = std::chrono::milliseconds(ms);
    if (j.contains("margin")) {
      op.margin.emplace();
      if (!hex_decode(j["margin"].get<std::string>(), &*op.margin)) return false;
    }
    if (!hex_decode(j.value("dump_log", ""), &op.dump_log) ||
        !hex_decode(j.value("network_lock", ""), &op.network_lock))
      return false;
    *out = std::move(op);
    return true;
  } catch (...) {
    return false;
  }
}

void Guardian::begin(const GuardedOperation& op) {
  send(guardian_begin_line(op));
}

void Guardian::end() { send("end"); }

void Guardian::dismiss() {
  if (!pipe_w_) return;
  send("dismiss");
  pipe_w_.reset();
  // The supervisor reaps it with everything else; wait briefly so it does
  // not outlive the supervisor by much.
  if (pid_ > 0) {
    for (int i = 0; i < 100; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) != 0) break;
      struct timespec ts {0, 10000000};
      ::nanosleep(&ts, nullptr);
    }
  }
  pid_ = 0;
}

}  // namespace cusnap
