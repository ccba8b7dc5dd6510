// The guardian: a small process the supervisor forks when it starts
// supervising a job, outside the job's tree. It holds a copy of the read ends
// of the job's output pipes (and never reads them while the supervisor
// lives) and a pipe from the supervisor, on which the supervisor announces
// each engine operation it begins and ends. When that pipe closes without
// the supervisor saying goodbye (the supervisor was killed), the guardian
// brings the job back if an operation was under way (recover_job in
// engine.h: driver state restored and unlocked, processes continued, shared
// memory rebuilt, gates opened, an unfinished checkpoint removed), writes
// what it did to the job's log, and then becomes the job's
// supervisor again: it takes over the job's runtime directory (whose lock it
// holds), serves a new control socket there and runs the supervisor's loop,
// so `cusnap ps`, `checkpoint`, `suspend` and `resume` find the job as
// before (its exit status is no longer known: the guardian is not its
// parent), and forks a guardian of its own. A recovery that fails leaves the job suspended
// (recover_job marks it), and the guardian supervises it all the same, so that `cusnap resume` can
// try again. Where that fails it copies the job's output into the log until the job ends, so the
// job does not die of a broken pipe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>

#include "coord/engine.h"
#include "proto/unique_fd.h"

namespace cusnap {

/// The guardian process's entry (the hidden `cusnap __guardian` command the
/// forked child executes, so that it starts without the supervisor's driver
/// state: in a process forked after cuInit, cuInit and every device query
/// fail CUDA_ERROR_NOT_INITIALIZED; only the checkpoint API answers, measured
/// by tests/gpu/probes/fork_after_init.cpp).
/// Arguments: --cmd-fd N --out-fd N --err-fd N --log-fd N --lock-fd N
/// --job-fd N (a memory file holding the job's description as JSON, which
/// may be longer than one argument can be). Never returns.
[[noreturn]] void guardian_command(int argc, char** argv);

/// An engine operation under way, as the supervisor tells its guardian.
struct GuardedOperation {
  std::string op;         ///< "checkpoint", "suspend", "resume"; empty: none
  std::string state_dir;  ///< where it keeps what it saves
  /// Remove state_dir after a recovery when no manifest got written.
  bool remove_partial = false;
  /// The operation made state_dir: with remove_partial, it goes too (when
  /// empty), as after the operation's own failure.
  bool dir_made = false;
  /// The operation's timeout, which a recovery uses too.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  /// CUSNAP_RESTORE_MEMORY_MARGIN as the operation's client set it (or the
  /// supervisor's environment had it); absent: neither did.
  std::optional<std::string> margin;
  /// A checkpoint's CRIU dump once it began: its log, and the method of its
  /// lock on the job's TCP connections (empty: none). A recovery lifts that
  /// lock even where CRIU ended before the supervisor died.
  std::string dump_log, network_lock;
};

/// The line that announces op on the guardian's pipe: "begin " and one JSON
/// object whose strings are hex, so that a path of any bytes (a newline, or
/// what is not UTF-8) crosses whole and cannot break the line.
std::string guardian_begin_line(const GuardedOperation& op);
/// Reads such a line; false, *out unchanged, for anything else (not a
/// "begin", not JSON, no operation, a field of the wrong type). A timeout
/// of zero or above a day leaves the default.
bool parse_guardian_begin(const std::string& line, GuardedOperation* out) noexcept;

class Guardian {
 public:
  /// Forks the guardian. log_path: the job's output log (appended to);
  /// lock_fd: the runtime directory's lock, which the guardian keeps held so
  /// that the directory (and the log) stays while the job runs on. Must run
  /// before the supervisor starts threads. false + *err on failure (the job
  /// is then supervised without one).
  bool start(const JobInfo& job, int out_r, int err_r, const std::string& log_path, int lock_fd,
             std::string* err);
  /// An operation begins (GuardedOperation says what the guardian needs).
  void begin(const GuardedOperation& op);
  void end();
  /// The supervisor ends normally: the guardian exits without acting.
  void dismiss();
  ~Guardian() { dismiss(); }
  pid_t pid() const { return pid_; }

 private:
  void send(const std::string& line);
  UniqueFd pipe_w_;
  pid_t pid_ = 0;
};

}  // namespace cusnap
