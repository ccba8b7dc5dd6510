#include "coord/criu.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "coord/process_kill.h"
#include "proto/unique_fd.h"

namespace cusnap {
namespace {

bool executable(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0;
}

std::string search_path(const std::string& name) {
  std::string path = getenv("PATH") ? getenv("PATH") : "";
  path += ":/usr/local/sbin:/usr/sbin:/sbin";
  std::istringstream ss(path);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) continue;
    if (executable(dir + "/" + name)) return dir + "/" + name;
  }
  return {};
}

// The child side of a spawn: async-signal-safe calls only (the caller may be
// multi-threaded). Every descriptor but 0-2 and the kept ones is closed on exec.
[[noreturn]] void exec_child(char* const* argv, char* const* envp, int out_fd, const int* keep,
                             size_t nkeep, pid_t die_with = 0) {
  if (die_with > 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != die_with) _exit(127);  // it died before the line above
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  signal(SIGPIPE, SIG_DFL);
  int null_fd = open("/dev/null", O_RDONLY);
  if (null_fd >= 0) dup2(null_fd, 0);
  if (out_fd >= 0) {
    dup2(out_fd, 1);
    dup2(out_fd, 2);
  }
  syscall(SYS_close_range, 3U, ~0U, 4U /* CLOSE_RANGE_CLOEXEC */);
  for (size_t i = 0; i < nkeep; ++i) fcntl(keep[i], F_SETFD, 0);
  execve(argv[0], argv, envp);
  _exit(127);
}

/// CRIU's switch (fault injection FI_NO_BREAKPOINTS) that makes it follow the
/// parasite's end by system-call stops instead of a hardware breakpoint.
constexpr const char* kCriuNoBreakpoints = "CRIU_FAULT=130";

struct Spawned {
  pid_t pid = -1;
};

/// Starts prog with this process's environment plus `extra` ("NAME=VALUE";
/// a name the environment already has keeps its value).
bool spawn(const std::string& prog, const std::vector<std::string>& args, int out_fd,
           const std::vector<int>& keep, Spawned* s, std::string* err,
           const std::vector<std::string>& extra = {}, bool die_with_caller = false) {
  std::vector<std::string> all{prog};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> added;
  for (const std::string& e : extra)
    if (!getenv(e.substr(0, e.find('=')).c_str())) added.push_back(e);
  std::vector<char*> envp;
  for (char** e = environ; e && *e; ++e) envp.push_back(*e);
  for (std::string& e : added) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t self = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    *err = "fork for " + prog + " failed: " + std::strerror(errno);
    return false;
  }
  if (pid == 0)
    exec_child(argv.data(), envp.data(), out_fd, keep.data(), keep.size(),
               die_with_caller ? self : 0);
  s->pid = pid;
  return true;
}

/// How wait_child's child ended.
enum class ChildEnd {
  kExited,     ///< *status holds its wait status
  kTimedOut,   ///< the timeout passed: killed
  kStopped,    ///< stop() asked for its end: killed
  kLostStatus  ///< reaped by someone else; its status is unknown
};

/// Bounds of wait_child beyond its child's own end.
struct ChildWait {
  std::chrono::milliseconds timeout{0};
  std::function<void()> tick{};         ///< about every 250 ms
  std::function<void()> before_kill{};  ///< just before a kill
  std::function<bool()> stop{};         ///< looked at about every 50 ms: true ends the child
  /// When set, a kill (timeout or stop) waits until it returns true, at most
  /// kill_grace more (then kills all the same).
  std::function<bool()> killable{};
  std::chrono::milliseconds kill_grace{0};
};

/// Waits for pid; *status gets its wait status. A timeout or stop kills pid
/// with every process it forked (killed alone, CRIU can leave a helper it
/// forked while it probes the kernel stopped for ever), after before_kill.
ChildEnd wait_child(pid_t pid, const ChildWait& w, int* status) {
  const auto start = std::chrono::steady_clock::now();
  auto last_tick = start;
  std::optional<ChildEnd> ending;
  std::chrono::steady_clock::time_point ending_since;
  for (int sleep_us = 1000;; sleep_us = std::min(sleep_us * 2, 50000)) {
    const pid_t r = waitpid(pid, status, WNOHANG);
    if (r == pid) return ChildEnd::kExited;
    if (r < 0 && errno == ECHILD) return ChildEnd::kLostStatus;
    const auto now = std::chrono::steady_clock::now();
    if (!ending) {
      if (now - start > w.timeout)
        ending = ChildEnd::kTimedOut;
      else if (w.stop && w.stop())
        ending = ChildEnd::kStopped;
      ending_since = now;
    }
    if (ending && (!w.killable || now - ending_since >= w.kill_grace || w.killable())) {
      if (w.before_kill) w.before_kill();
      kill_process_tree(pid, TreeReap::kNotRoot);
      waitpid(pid, status, 0);
      return *ending;
    }
    if (w.tick && now - last_tick > std::chrono::milliseconds(250)) {
      w.tick();
      last_tick = now;
    }
    usleep(ending ? std::min(sleep_us, 10000) : sleep_us);
  }
}

/// wait_child with a timeout alone.
ChildEnd wait_child(pid_t pid, std::chrono::milliseconds timeout, int* status) {
  return wait_child(pid, ChildWait{.timeout = timeout}, status);
}

bool file_has_line(const std::string& path, const std::string& needle) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (line.find(needle) != std::string::npos) return true;
  return false;
}

#if defined(__x86_64__)
// What the probe's child calls once the breakpoint is set on it.
extern "C" __attribute__((noinline, used)) void cusnap_breakpoint_probe_target() {
  asm volatile("" ::: "memory");
}

bool probe_breakpoints(std::string* why) {
  const pid_t child = fork();
  if (child < 0) {
    *why = std::string("no probe (fork: ") + std::strerror(errno) + ")";
    return true;
  }
  if (child == 0) {  // async-signal-safe calls only
    if (ptrace(PTRACE_TRACEME, 0, nullptr, nullptr) != 0) _exit(2);
    raise(SIGSTOP);
    cusnap_breakpoint_probe_target();
    _exit(0);
  }
  int st = 0;
  auto end = [&](bool works, std::string text) {
    kill(child, SIGKILL);
    while (waitpid(child, &st, 0) < 0 && errno == EINTR) {
    }
    *why = std::move(text);
    return works;
  };
  if (waitpid(child, &st, 0) != child || !WIFSTOPPED(st))
    return end(true, "no probe (the traced child did not stop)");
  void* addr = reinterpret_cast<void*>(&cusnap_breakpoint_probe_target);
  if (ptrace(PTRACE_POKEUSER, child, offsetof(struct user, u_debugreg[0]), addr) != 0 ||
      ptrace(PTRACE_POKEUSER, child, offsetof(struct user, u_debugreg[7]),
             reinterpret_cast<void*>(1)) != 0)  // L0: local, on execution
    return end(false, std::string("a debug register cannot be set: ") + std::strerror(errno));
  if (ptrace(PTRACE_CONT, child, nullptr, nullptr) != 0)
    return end(true, "no probe (PTRACE_CONT failed)");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (;;) {
    const pid_t r = waitpid(child, &st, WNOHANG);
    if (r == child && WIFSTOPPED(st) && WSTOPSIG(st) == SIGTRAP)
      return end(true, "a hardware breakpoint stopped the traced child");
    if (r == child && WIFSTOPPED(st)) {
      ptrace(PTRACE_CONT, child, nullptr, nullptr);
      continue;
    }
    if (r == child) return end(false, "the traced child ran past a hardware breakpoint");
    if (r < 0 && errno != EINTR) return end(true, "no probe (the child's status was lost)");
    if (std::chrono::steady_clock::now() > deadline)
      return end(false, "a hardware breakpoint did not stop the traced child within 2 s");
    usleep(2000);
  }
}
#endif

}  // namespace

bool hw_breakpoints_work(std::string* why) {
  static std::once_flag once;
  static bool works = true;
  static std::string seen;
#if defined(__x86_64__)
  std::call_once(once, [] { works = probe_breakpoints(&seen); });
#else
  std::call_once(once, [] { seen = "not probed on this architecture"; });
#endif
  if (why) *why = seen;
  return works;
}

bool criu_breakpoints(const char* value, bool* use, std::string* err) {
  const std::string v = value ? value : "";
  if (v.empty() || v == "auto") {
    *use = hw_breakpoints_work(nullptr);
  } else if (v == "on" || v == "1") {
    *use = true;
  } else if (v == "off" || v == "0") {
    *use = false;
  } else {
    *err = "CUSNAP_CRIU_BREAKPOINTS=\"" + v.substr(0, 64) +
           "\" is not auto, on or off: unset it to let cusnap find out whether this machine's "
           "hardware breakpoints work";
    return false;
  }
  return true;
}

bool parse_criu_version(std::string_view text, CriuInfo* out) {
  size_t p = text.find("Version:");
  if (p == std::string_view::npos) return false;
  p += 8;
  while (p < text.size() && text[p] == ' ') ++p;
  size_t e = text.find_first_of(" \n\r", p);
  std::string v(text.substr(p, e == std::string_view::npos ? text.size() - p : e - p));
  int parts[3] = {0, 0, 0};
  if (std::sscanf(v.c_str(), "%d.%d.%d", &parts[0], &parts[1], &parts[2]) < 2) return false;
  out->version = v;
  out->major = parts[0];
  out->minor = parts[1];
  out->patch = parts[2];
  return true;
}

bool find_criu(CriuInfo* out, std::string* err, const char* breakpoints,
               std::chrono::milliseconds version_timeout) {
  const char* env = getenv("CUSNAP_CRIU");
  std::string path = env && *env ? env : search_path("criu");
  if (path.empty()) {
    *err =
        "CRIU was not found on PATH nor in /usr/local/sbin, /usr/sbin, /sbin: install CRIU >= 4.1 "
        "or set CUSNAP_CRIU to its path";
    return false;
  }
  if (!executable(path)) {
    *err = "CRIU at " + path +
           " (from CUSNAP_CRIU) is not an executable file: install CRIU >= 4.1 "
           "or point CUSNAP_CRIU at it";
    return false;
  }
  UniqueFd version_r, version_w;
  if (!make_pipe(&version_r, &version_w, 0, "the pipe for CRIU's version", err)) return false;
  Spawned s;
  bool ok = spawn(path, {"--version"}, version_w.get(), {}, &s, err);
  version_w.reset();
  std::string text;
  if (ok) {
    // Read until the end of its output, within the time limit: a CRIU (or
    // whatever CUSNAP_CRIU names) that hangs must not hang cusnap.
    const auto until = std::chrono::steady_clock::now() + version_timeout;
    bool ended = false;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0 || text.size() > 65536) break;
      pollfd p{version_r.get(), POLLIN, 0};
      const int r = poll(&p, 1, int(std::min<long long>(left.count(), 1 << 30)));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      char buf[4096];
      const ssize_t n = read(version_r.get(), buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ended = true;
        break;
      }
      text.append(buf, size_t(n));
    }
    int status = 0;
    const auto wait_left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    const bool killed = wait_child(s.pid,
                                   ended ? std::max(wait_left, std::chrono::milliseconds(0))
                                         : std::chrono::milliseconds(0),
                                   &status) == ChildEnd::kTimedOut;
    if (!ended || killed) {
      *err = "`" + path + " --version` did not finish within " +
             std::to_string(version_timeout.count()) +
             " ms: it was killed; check that CRIU runs (or set CUSNAP_CRIU to a working one)";
      ok = false;
    }
  }
  version_r.reset();
  if (!ok) return false;
  out->path = path;
  if (!parse_criu_version(text, out)) {
    *err = "`" + path + " --version` printed no version: install CRIU >= 4.1 or set CUSNAP_CRIU";
    return false;
  }
  if (out->major < 4 || (out->major == 4 && out->minor < 1)) {
    *err = "CRIU at " + path + " is version " + out->version +
           "; cusnap needs CRIU >= 4.1 (older versions fail on 6.x kernels): install a newer "
           "CRIU or set CUSNAP_CRIU to one";
    return false;
  }
  bool use_breakpoints = true;
  if (!criu_breakpoints(breakpoints, &use_breakpoints, err)) return false;
  out->no_breakpoints = !use_breakpoints;
  return true;
}

bool criu_network_lock(const char* value, std::string* method, std::string* err) {
  const std::string v = value ? value : "";
  if (v.empty()) {
    *method = "nftables";
  } else if (v == "nftables" || v == "iptables" || v == "skip") {
    *method = v;
  } else {
    *err = "CUSNAP_CRIU_NETWORK_LOCK=\"" + v.substr(0, 64) +
           "\" is not nftables, iptables or skip (CRIU's network lock methods): unset it for "
           "nftables";
    return false;
  }
  return true;
}

bool criu_ghost_limit(const char* env, std::string* arg, std::string* err) {
  if (!env || !*env) {
    // CRIU reads the value with atol(): the largest it takes whole.
    *arg = std::to_string(std::numeric_limits<long>::max());
    return true;
  }
  std::string_view v(env);
  int shift = 0;
  switch (v.back()) {
    case 'K':
      shift = 10;
      break;
    case 'M':
      shift = 20;
      break;
    case 'G':
      shift = 30;
      break;
    default:
      break;
  }
  std::string_view digits = shift ? v.substr(0, v.size() - 1) : v;
  unsigned long long n = 0;
  bool ok = !digits.empty() && digits.size() <= 12;
  for (char c : digits) {
    if (c < '0' || c > '9') ok = false;
    if (ok) n = n * 10 + unsigned(c - '0');
  }
  if (!ok || n == 0 || (n << shift) >> shift != n ||
      (n << shift) > uint64_t(std::numeric_limits<long>::max())) {
    *err = "CUSNAP_CRIU_GHOST_LIMIT=\"" + std::string(v) +
           "\" is not a size (bytes, or a number followed by K, M or G, e.g. 4G): unset it to "
           "save deleted files of any size";
    return false;
  }
  *arg = std::string(v);
  return true;
}

std::string log_tail(const std::string& path, int n) {
  std::ifstream in(path);
  if (!in) return "  (no log at " + path + ")\n";
  std::deque<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (int(lines.size()) > n) lines.pop_front();
  }
  std::string out;
  for (const std::string& l : lines) out += "  " + l + "\n";
  return out;
}

namespace {

/// The pid field of a CRIU log line, "(00.058898)    649: ..." -> "649"
/// (empty for a line without one).
std::string log_line_pid(const std::string& line) {
  size_t close = line.find(')');
  if (line.empty() || line[0] != '(' || close == std::string::npos) return "";
  size_t b = line.find_first_not_of(' ', close + 1);
  size_t e = b == std::string::npos ? b : line.find(':', b);
  if (e == std::string::npos || e == b) return "";
  std::string pid = line.substr(b, e - b);
  return pid.find_first_not_of("0123456789") == std::string::npos ? pid : "";
}

/// An "Error" line CRIU logs and goes on from: not why a run failed.
bool benign_error(const std::string& line) {
  // Raising its own descriptor limit where the hard limit cannot be raised.
  return line.find("rlimit: Can't setup RLIMIT_NOFILE for self") != std::string::npos;
}

}  // namespace

std::string log_errors(const std::string& path, int max_errors, int context) {
  std::ifstream in(path);
  if (!in) return "";
  std::deque<std::string> recent;  // the lines before the first error
  std::vector<std::string> errors;
  std::string line, first_pid;
  std::vector<std::string> before;
  while (std::getline(in, line)) {
    if (benign_error(line)) continue;
    if (line.find("Error (") != std::string::npos) {
      if (errors.empty()) {
        // The lines of the same process just before the first error say
        // what it was restoring (which socket, file or mapping).
        first_pid = log_line_pid(line);
        for (auto it = recent.rbegin(); it != recent.rend() && int(before.size()) < context; ++it)
          if (log_line_pid(*it) == first_pid) before.insert(before.begin(), *it);
      }
      if (int(errors.size()) < max_errors) errors.push_back(line);
      continue;
    }
    if (errors.empty()) {
      recent.push_back(line);
      if (recent.size() > 200) recent.pop_front();
    }
  }
  if (errors.empty()) return "";
  std::string out;
  for (const std::string& l : before) out += "  " + l + "\n";
  for (const std::string& l : errors) out += "  " + l + "\n";
  return out;
}

bool run_criu(const CriuInfo& criu, const CriuRun& run, std::string* err) {
  std::string action = run.args.empty() ? "?" : run.args[0];
  UniqueFd out_fd;
  if (!run.output_path.empty()) {
    out_fd.reset(open(run.output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!out_fd) {
      *err = "cannot create " + run.output_path + ": " + std::strerror(errno);
      return false;
    }
  }
  Spawned s;
  std::vector<std::string> env;
  if (criu.no_breakpoints) env.push_back(kCriuNoBreakpoints);
  bool ok =
      spawn(criu.path, run.args, out_fd.get(), run.inherit_fds, &s, err, env, run.die_with_caller);
  out_fd.reset();  // CRIU holds its own copy
  if (!ok) return false;
  int status = 0;
  const ChildEnd w = wait_child(s.pid,
                                ChildWait{.timeout = run.timeout,
                                          .tick = run.on_tick,
                                          .before_kill = run.before_kill,
                                          .stop = run.stop_now,
                                          .killable = run.killable,
                                          .kill_grace = run.kill_grace},
                                &status);
  std::string why;
  if (w == ChildEnd::kStopped) {
    *err = "criu " + action + " was stopped on request (killed)";
    return false;
  }
  if (w == ChildEnd::kTimedOut) {
    const auto ms = run.timeout.count();
    why =
        "timed out after " +
        (ms < 10000 && ms % 1000 ? std::to_string(ms) + " ms" : std::to_string(ms / 1000) + " s") +
        " and was killed";
    // CRIU stops each infected process at a hardware breakpoint; where those
    // do not fire it waits for ever at "Waiting for PID to trap".
    if (!criu.no_breakpoints && log_tail(run.log_path, 4).find("to trap") != std::string::npos)
      why +=
          " while it waited for a process to stop at a hardware breakpoint, which this "
          "machine may not deliver: set CUSNAP_CRIU_BREAKPOINTS=off";
  } else if (w == ChildEnd::kLostStatus) {
    // Another thread reaped CRIU; its log still tells how it ended.
    if (!run.success_line.empty() && file_has_line(run.log_path, run.success_line)) return true;
    why = "exit status lost; its log does not say it finished";
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    return true;
  } else if (WIFEXITED(status)) {
    why = "exit status " + std::to_string(WEXITSTATUS(status));
    if (WEXITSTATUS(status) == 127) why += ": could not execute " + criu.path;
  } else {
    why = std::string("killed by signal ") + strsignal(WTERMSIG(status));
    // CRIU runs in the terminal's process group: Ctrl-C reaches it too.
    if (WTERMSIG(status) == SIGINT || WTERMSIG(status) == SIGTERM)
      why += ": interrupted, as by Ctrl-C or a kill";
  }
  // CRIU's first errors (with what the failing process was doing just
  // before) say why; the end of the log is mostly the unwinding after it.
  const std::string errors = log_errors(run.log_path, 6, 3);
  // CRIU places its own descriptors above the job's, within its limit (the
  // one it inherits from cusnap); a restore under a low "ulimit -n" fails so.
  if (errors.find("Can't chose service_fd_base") != std::string::npos) {
    rlimit lim{};
    why += ": CRIU found no room for its descriptors above the job's";
    if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY)
      why += " within the limit of " + std::to_string(lim.rlim_cur) + " open files";
    why += "; raise \"ulimit -n\" for the cusnap command";
  }
  if (errors.empty())
    *err = "criu " + action + " failed (" + why + "); the end of its log " + run.log_path + ":\n" +
           log_tail(run.log_path, 15);
  else
    *err = "criu " + action + " failed (" + why + "); the errors in its log " + run.log_path +
           ":\n" + errors;
  std::string output;
  if (!run.output_path.empty()) {
    std::ifstream in(run.output_path);
    std::getline(in, output, '\0');
    if (!output.empty()) *err += "its output:\n" + log_tail(run.output_path, 5);
  }
  return false;
}

int run_program(const std::string& name, const std::vector<std::string>& args,
                std::chrono::milliseconds timeout, std::string* err) {
  const std::string path = search_path(name);
  if (path.empty()) {
    *err = name + " is not installed (not found on PATH, /usr/local/sbin, /usr/sbin or /sbin)";
    return -1;
  }
  const UniqueFd null_fd(open("/dev/null", O_WRONLY | O_CLOEXEC));
  Spawned s;
  if (!spawn(path, args, null_fd.get(), {}, &s, err)) return -1;
  int status = 0;
  const ChildEnd w = wait_child(s.pid, timeout, &status);
  if (w == ChildEnd::kTimedOut) {
    *err = path + " did not end within " + std::to_string(timeout.count()) + " ms and was killed";
    return -1;
  }
  if (w == ChildEnd::kLostStatus || !WIFEXITED(status)) {
    *err = path + (w == ChildEnd::kLostStatus ? ": exit status lost" : ": killed by a signal");
    return -1;
  }
  return WEXITSTATUS(status);
}

}  // namespace cusnap
