// CRIU as an external program: found in $CUSNAP_CRIU or on PATH (plus the
// sbin directories, which a non-login PATH may lack), version >= 4.1 required
// (3.17 fails on 6.x kernels: GPU.md), run as a child with its log in a file;
// failures quote the end of that log.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace cusnap {

struct CriuInfo {
  std::string path;
  std::string version;  ///< as CRIU prints it, e.g. "4.1.1"
  int major = 0, minor = 0, patch = 0;
  /// Run CRIU without hardware breakpoints (criu_breakpoints).
  bool no_breakpoints = false;
};

/// Whether a hardware breakpoint stops a traced process on this machine. CRIU
/// stops each process it infected at a breakpoint on the parasite's last
/// instruction; where breakpoints do not fire (seen in virtual machines, with
/// `criu check` passing), `criu dump` and `criu restore` wait for ever. The
/// probe traces a forked child, sets a breakpoint (x86 debug registers) on a
/// function the child then calls, and waits up to 2 s for the stop. Probed
/// once per process; true on other architectures. *why says what was seen.
bool hw_breakpoints_work(std::string* why);

/// Whether CRIU runs with hardware breakpoints, from the value of
/// CUSNAP_CRIU_BREAKPOINTS: "auto" (or nullptr or empty: probe,
/// hw_breakpoints_work), "on", "off". Without them CRIU follows the parasite's
/// end by system-call stops (its own fallback, chosen through CRIU_FAULT=130),
/// which works everywhere. False with *err for another value.
bool criu_breakpoints(const char* value, bool* use, std::string* err);

/// Parses the output of `criu --version` ("Version: 4.1.1" plus maybe a
/// GitID line). False when no version line is there.
bool parse_criu_version(std::string_view text, CriuInfo* out);

/// Finds CRIU, runs `criu --version`, requires >= 4.1, and decides about
/// breakpoints (criu_breakpoints of `breakpoints`, the value of
/// CUSNAP_CRIU_BREAKPOINTS). The error says what was found and how to install
/// or point at a newer one. A `criu --version` that has not ended within
/// version_timeout (or prints more than 64 KiB) is killed and refused.
constexpr std::chrono::milliseconds kCriuVersionTimeout{10000};
bool find_criu(CriuInfo* out, std::string* err, const char* breakpoints,
               std::chrono::milliseconds version_timeout = kCriuVersionTimeout);

/// The --ghost-limit CRIU's dump gets: how big a deleted file the job holds
/// (open or mapped, e.g. NCCL's host buffers in /dev/shm, or tensors PyTorch
/// shares through unlinked shared memory) may be for CRIU to save its
/// contents whole in the checkpoint. `value`, of CUSNAP_CRIU_GHOST_LIMIT:
/// bytes, or a number with K, M or G (binary units, as CRIU reads them);
/// nullptr or empty: no limit (CRIU's own default of 1 MiB fails the
/// checkpoint of such jobs). False, with *err naming the value, for anything
/// else.
bool criu_ghost_limit(const char* value, std::string* arg, std::string* err);

/// CRIU's --network-lock method for a dump with established TCP connections,
/// from the value of CUSNAP_CRIU_NETWORK_LOCK: nftables (nullptr or empty),
/// iptables or skip. False, with *err naming the value, for anything else.
bool criu_network_lock(const char* value, std::string* method, std::string* err);

/// One run of CRIU.
struct CriuRun {
  std::vector<std::string> args;  ///< after the program name
  std::vector<int> inherit_fds;   ///< kept open, at the same numbers, in CRIU
  std::string output_path;        ///< CRIU's own stdout and stderr go here
  std::string log_path;           ///< the -o log, for the error message
  std::string success_line;       ///< log line that proves success if our wait lost the status
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  std::function<void()> on_tick;  ///< called about every 250 ms while CRIU runs
  /// Called when the timeout has passed, just before CRIU is killed (a dump
  /// stops the job here, so that no process of it runs on between CRIU's
  /// end, which lets go of the tasks it held, and the roll back).
  std::function<void()> before_kill;
  /// Looked at about every 50 ms while CRIU runs: once it returns true,
  /// CRIU is ended as at the timeout (before_kill, then killed) and
  /// run_criu fails saying it was stopped on request.
  std::function<bool()> stop_now;
  /// When set, CRIU ended (timeout or stop_now) is killed only once this
  /// returns true (a dump: not while it drives a process by ptrace alone,
  /// criu_interrupt.h), looked at about every 10 ms, or once kill_grace has
  /// passed since the end was due (a CRIU hung there is killed all the same).
  std::function<bool()> killable;
  std::chrono::milliseconds kill_grace{5000};
  /// CRIU is killed (PR_SET_PDEATHSIG) when the thread that runs it dies: a
  /// restore whose process was killed must not finish without it (a dump
  /// must, for the guardian to find a whole checkpoint or none).
  bool die_with_caller = false;
};

/// Runs CRIU and waits for it. On failure *err says "criu ACTION failed (...)"
/// followed by CRIU's first errors (log_errors), or by the last lines of its
/// log when it has none.
bool run_criu(const CriuInfo& criu, const CriuRun& run, std::string* err);

/// Runs a helper program (name found like CRIU: on PATH, then the sbin
/// directories) with args, its input and output /dev/null, and waits up to
/// timeout (then kills it). Returns its exit status, or -1 with *err when it
/// is not installed, could not start, was killed or did not end in time.
int run_program(const std::string& name, const std::vector<std::string>& args,
                std::chrono::milliseconds timeout, std::string* err);

/// The last n lines of a text file, each indented, for error messages.
std::string log_tail(const std::string& path, int n);

/// The first max_errors "Error (...)" lines of a CRIU log, each indented,
/// preceded by up to `context` lines the same process logged just before the
/// first one; empty when the log has none (or cannot be read).
std::string log_errors(const std::string& path, int max_errors, int context);

}  // namespace cusnap
