#include "job_target.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>

#include "proto/json_text.h"

namespace cusnap::cli {

void add_job_argument(CLI::App& app, std::string* job) {
  app.add_option("JOB", *job, "Job name, pid (PID or SUPERV of cusnap ps) or runtime directory")
      ->required()
      ->check(not_empty())
      ->type_name("");
}

int resolve_job(const std::string& spec, bool json, JobEntry* out,
                const std::string& not_found_also) {
  std::string err;
  JobMiss miss = JobMiss::kNone;
  if (find_job(spec, out, &err, &miss)) return -1;
  if (miss == JobMiss::kAmbiguous) return fail_json(json, kExitUsage, err);
  if (miss == JobMiss::kUnusableBase)  // what to do, as cusnap ps says it
    return fail_json(json, kExitFailure, err + "; " + runtime_base_lookup_remedy());
  if (miss == JobMiss::kUnusableDir) return fail_json(json, kExitFailure, err);
  // A number is looked up as a name and as both pids of ps.
  if (spec.find('/') == std::string::npos &&
      spec.find_first_not_of("0123456789") == std::string::npos)
    err = "no job named " + spec + ", nor with PID or SUPERV " + spec +
          ", is running (cusnap ps lists the running jobs)";
  return fail_json(json, kExitNotFound, err + not_found_also);
}

nlohmann::json job_failure_object(int code, const std::string& msg, const JobEntry& job) {
  nlohmann::json j = failure_object(code, msg);
  j["job"] = j["name"] = job.status.name;
  j["pid"] = job.status.root_pid;
  return j;
}

int fail_job_json(bool json, int code, const std::string& msg, const JobEntry& job) {
  if (json) print_json(job_failure_object(code, msg, job));
  return fail(code, msg);
}

int report_result_failure(bool json, const proto::Result& r, const std::string& op,
                          const JobEntry& job) {
  const int code = r.exit_code == kExitOk ? kExitFailure : r.exit_code;
  const std::string& name = job.status.name;
  const std::string msg = !r.message.empty()
                              ? r.message
                              : "the " + op + " of job " + name +
                                    " failed, and its supervisor said no more: cusnap ps and "
                                    "cusnap inspect " +
                                    name + " show the job's state";
  if (!json) return fail(code, msg);
  nlohmann::json j = job_failure_object(code, msg, job);
  const nlohmann::json d = nlohmann::json::parse(r.details, nullptr, false);
  if (d.is_object() && d.contains("state") && d["state"].is_string()) j["state"] = d["state"];
  print_json(j);
  return fail(code, msg);
}

void print_phases(const nlohmann::json& phases) {
  for (const auto& p : phases) {
    std::printf("  %-24s %8.2f s\n", p.value("name", std::string("?")).c_str(),
                p.value("seconds", 0.0));
  }
}

void print_cut(const nlohmann::json& d) {
  if (d.contains("collective_cut") && d["collective_cut"].is_object()) {
    std::string ranks;
    for (auto& [pid, n] : d["collective_cut"].items())
      if (n.is_number_unsigned())
        ranks += (ranks.empty() ? "" : ", ") + std::string("process ") + pid + " at " +
                 std::to_string(n.get<uint64_t>());
    std::printf("collective cut: %s collective launches\n", ranks.c_str());
  }
  if (int n = d.value("capture_retries", 0); n > 0)
    std::printf("waited for a CUDA stream capture to end: the device was drained at attempt %d\n",
                n + 1);
}

namespace {

constexpr int kCancelSignals[] = {SIGINT, SIGTERM, SIGHUP};
// Written before the handlers are installed, read only by them.
volatile sig_atomic_t g_first_signal = 0;
int g_cancel_write_fd = -1;
std::string g_again_text;
std::string g_again_json[3];
struct sigaction g_cancel_old[3];

void on_cancel_signal(int sig) {
  if (g_first_signal == 0) {
    g_first_signal = sig;
    const char b = 1;
    if (::write(g_cancel_write_fd, &b, 1) < 0) {
    }
    return;
  }
  for (int i = 0; i < 3; ++i) {
    if (kCancelSignals[i] != sig) continue;
    if (::write(STDERR_FILENO, g_again_text.data(), g_again_text.size()) < 0) {
    }
    if (!g_again_json[i].empty() &&
        ::write(STDOUT_FILENO, g_again_json[i].data(), g_again_json[i].size()) < 0) {
    }
  }
  ::_exit(128 + sig);
}

/// A line of cusnap's own on stderr, on a fresh line where a progress line
/// may be drawn.
void say(const std::string& msg) {
  std::fprintf(stderr, "%scusnap: %s\n", ::isatty(STDERR_FILENO) ? "\r\033[K" : "", msg.c_str());
  std::fflush(stderr);
}

}  // namespace

CancelOnInterrupt::CancelOnInterrupt(const JobEntry& job, const char* op, bool json,
                                     std::chrono::milliseconds bound)
    : job_(job), op_(op), bound_(bound) {
  if (::pipe2(pipe_, O_CLOEXEC | O_NONBLOCK) != 0) pipe_[0] = pipe_[1] = -1;
  g_first_signal = 0;
  g_cancel_write_fd = pipe_[1];
  const std::string msg = "interrupted again: the " + op_ + " of job " + job.status.name +
                          " may still be running, or rolling back, in its supervisor; its "
                          "outcome is not known: cusnap ps shows the job's state";
  g_again_text = std::string(::isatty(STDERR_FILENO) ? "\n" : "") + "cusnap: " + msg + "\n";
  for (int i = 0; i < 3; ++i) {
    g_again_json[i] =
        json ? json_text(job_failure_object(128 + kCancelSignals[i], msg, job), 2) + "\n" : "";
    struct sigaction sa {};
    sa.sa_handler = on_cancel_signal;
    sigemptyset(&sa.sa_mask);
    // Each handler runs with the others blocked: the first's byte is written
    // before a second can end the command.
    for (int sig : kCancelSignals) sigaddset(&sa.sa_mask, sig);
    ::sigaction(kCancelSignals[i], &sa, &g_cancel_old[i]);
  }
}

CancelOnInterrupt::~CancelOnInterrupt() {
  for (int i = 0; i < 3; ++i) ::sigaction(kCancelSignals[i], &g_cancel_old[i], nullptr);
  g_cancel_write_fd = -1;
  for (int fd : pipe_)
    if (fd >= 0) ::close(fd);
}

int CancelOnInterrupt::signal() const {
  return g_first_signal;
}

InterruptHook CancelOnInterrupt::hook() {
  InterruptHook h;
  h.fd = pipe_[0];
  h.on_interrupt = [this] {
    const std::string what = "the " + op_ + " of job " + job_.status.name;
    say("cancelling " + what + " (interrupt again to leave without waiting)");
    proto::Result r;
    std::string err;
    if (!job_cancel(job_, control_timeout(), op_, &r, &err)) {
      say("cannot ask the supervisor to cancel " + what + ": " + err + "; it goes on");
    } else if (!r.ok) {
      say("cannot cancel " + what + ": " + r.message);
    } else {
      nlohmann::json d = nlohmann::json::parse(r.details, nullptr, false);
      if (d.is_object() && d.value("cancel", std::string()) == proto::kCancelTooLate)
        say("too late to cancel " + what + ": it is past the point where it completes");
    }
    return bound_;
  };
  return h;
}

int CancelOnInterrupt::finish(bool json, bool ok, const proto::Result& r, const std::string& err,
                              nlohmann::json* details) {
  const int sig = g_first_signal;
  if (sig == 0) return -1;
  const int code = 128 + sig;
  if (!ok) return fail_job_json(json, code, err, job_);
  nlohmann::json d = nlohmann::json::parse(r.details, nullptr, false);
  if (!r.ok && d.is_object() && d.value("cancelled", false)) {
    const std::string msg = "cancelled: job " + job_.status.name + " runs on unchanged";
    if (json) {
      nlohmann::json j = job_failure_object(code, msg, job_);
      j["cancelled"] = true;
      print_json(j);
    }
    say(msg);
    return code;
  }
  if (!r.ok) return report_result_failure(json, r, op_, job_);
  say("too late to cancel: the " + op_ + " of job " + job_.status.name + " completed");
  if (details != nullptr) (*details)["cancel"] = proto::kCancelTooLate;
  return -1;
}

}  // namespace cusnap::cli
