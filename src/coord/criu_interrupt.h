// When a running `criu dump` may be killed without harm to the job (a
// cancel ends it early: engine_checkpoint.cpp).
//
// CRIU dumps each process by injecting parasite code into it (compel). Most
// of a dump, the pages included, runs with the parasite as a daemon in the
// process, talking to CRIU over a socket: killed then, CRIU lets go of the
// process, the parasite sees its socket close and returns the thread to its
// own code through the signal frame CRIU saved (rt_sigreturn), and the
// process runs on as before (the parasite's mapping stays, unused). In two
// short steps CRIU drives the process by ptrace alone, with its registers
// set to run system calls CRIU injected (and, for each, a few bytes of its
// code replaced): while it infects the process, up to the daemon's start,
// and while it takes the parasite out again, from the daemon's stop until
// the process's mappings are dumped. Killed then, CRIU leaves the process
// at that code, which ends it. Those steps last milliseconds; CRIU's log
// (-v4) marks where each begins and ends.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>
#include <utility>

namespace cusnap {

/// From the text of a `criu dump` log (-v4) so far: false while its last
/// mark is the start of an infection ("Parasite syscall_ip at") or of a cure
/// ("Waiting for PID to trap") not yet followed by the step's end ("has been
/// switched to daemon mode", "Dumping mm (pid:"); true otherwise, no mark
/// at all included.
bool criu_dump_killable_text(std::string_view log_text);

/// Follows a `criu dump` log as CRIU writes it, for the answer of
/// criu_dump_killable_text about all of it at each look, reading only what
/// was added since the last look.
class CriuDumpLog {
 public:
  explicit CriuDumpLog(std::string path) : path_(std::move(path)) {}
  /// Whether CRIU may be killed now; true when the log cannot be read.
  bool killable();

 private:
  std::string path_;
  off_t looked_ = 0;  ///< bytes of the log looked at so far
  int mark_ = -1;     ///< the last mark in them (an index of the marks), or -1
  std::string tail_;  ///< their last bytes, where a mark cut by the end may begin
};

/// The same for the log file at path, read whole once.
bool criu_dump_killable(const std::string& log_path);

}  // namespace cusnap
