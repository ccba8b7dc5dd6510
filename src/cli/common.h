// What the subcommands share: the command table entry, error reporting,
// progress on a terminal, sizes and durations for people, timeouts.
// Only src/cli prints and exits.
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "coord/engine.h"
#include "proto/control.h"
#include "proto/decimal.h"
#include "proto/env_settings.h"

namespace cusnap {
struct SuperviseOutcome;
}

namespace cusnap::cli {

/// One subcommand: parses its own options and returns the exit code.
struct Command {
  const char* name;
  const char* summary;
  int (*run)(int argc, char** argv);  ///< argv[0] is the subcommand's name
};

int cmd_launch(int argc, char** argv);
int cmd_checkpoint(int argc, char** argv);
int cmd_restore(int argc, char** argv);
int cmd_suspend(int argc, char** argv);
int cmd_resume(int argc, char** argv);
int cmd_ps(int argc, char** argv);
int cmd_inspect(int argc, char** argv);

/// A CLI11 app named "cusnap NAME" with the options every command shares.
void init_app(CLI::App& app, const std::string& name);
/// Parses; returns -1 when the command should go on, else the exit code
/// (0 after --help, kExitUsage after a bad command line). A bad command line
/// of a command that has --json, given among the arguments, also prints
/// {"ok": false, "exit_code": 2, "error"} on stdout (fail_json).
int parse(CLI::App& app, int argc, char** argv);
/// --json (or --json=VALUE CLI11 reads as true, the last one counting)
/// among argv[1..] before a "--"; with app, not an option's value nor past
/// launch's CMD. Without app (no command to ask) every word is looked at.
bool json_among(const CLI::App* app, int argc, char** argv);

/// Levenshtein distance, for "did you mean".
size_t edit_distance(const std::string& a, const std::string& b);
/// "unknown option 'WORD'", with the option of app it likely stands for (a
/// typo, a prefix) when there is one.
std::string unknown_option_message(const CLI::App& app, const std::string& word);

/// How a number of seconds is written, said when one is refused.
inline constexpr const char* kSecondsForm =
    "written as digits with an optional fraction (0.5, 30, 1.25)";

/// A number of seconds from 0.001 to a week, written as digits with an
/// optional fraction (no sign, exponent, hex or blank, which strtod takes),
/// without a note in --help (the option says "Seconds"); the supervisor
/// rounds it to whole milliseconds. CLI11 puts the option's name before the
/// message.
inline CLI::Validator positive() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const bool plain = proto::plain_decimal(text.c_str());
        const double v = plain ? std::strtod(text.c_str(), nullptr) : 0;
        if (!plain || !(v >= 0.001) || !(v <= 604800))
          return "'" + text + "' is not a number of seconds from 0.001 to 604800 (a week), " +
                 kSecondsForm;
        return "";
      },
      "", "positive");
}

/// A number of seconds greater than 0 and at most 31536000 (a year), rounded
/// to whole milliseconds, at least 1: what CUSNAP_CONTROL_TIMEOUT takes
/// (proto::parse_timeout_seconds), for --control-timeout.
inline CLI::Validator control_seconds() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        int64_t ms = 0;
        if (!proto::parse_timeout_seconds(text.c_str(), &ms))
          return "'" + text +
                 "' is not a number of seconds greater than 0 and at most 31536000 (a year), " +
                 kSecondsForm;
        return "";
      },
      "", "control seconds");
}

/// "--timeout SECONDS" (default 60): help says what it bounds, "each phase"
/// or "the operation", and that the driver's calls (and with criu, CRIU) get
/// more in proportion to memory (driver_deadline, and the CRIU run's bound in
/// engine_checkpoint.cpp and engine_restore.cpp).
void add_timeout_option(CLI::App& app, double* seconds, const char* bounds, bool criu);
/// "--control-timeout SECONDS", for commands that supervise the job; *seconds
/// starts as control_timeout(). restore: the job's processes are not given it
/// (they keep their checkpointed environment), and the help says so.
void add_control_timeout_option(CLI::App& app, double* seconds, bool restore = false);
/// "--runtime-dir DIR", for commands that supervise the job: not empty, and
/// made absolute against the current directory as it is parsed (the job's
/// link in the runtime base, and everything else that reads it later, run
/// elsewhere).
void add_runtime_dir_option(CLI::App& app, std::string* dir);
/// "-n,--name NAME": a valid job name (valid_job_name), else a usage error.
void add_name_option(CLI::App& app, std::string* name, const std::string& help);
/// A check that refuses an empty value ("-o ''").
CLI::Validator not_empty();

/// The end of a supervising command (launch, restore): its warning and a
/// checkpoint that stopped the job on stderr; returns what cusnap exits with.
int finish_supervised(const SuperviseOutcome& out);

/// What to do about a checkpoint this process could not read (errno e of
/// read_manifest_coded's kExitFailure): for a permission, ": ACTION as a
/// user who can read it (root)" (action: "run the restore"); out of
/// descriptors, nothing (the reader's message says what to do); else to
/// try again once its file system reads.
std::string unreadable_hint(int e, const std::string& action);

/// "cusnap: error: MSG" on stderr, through shown(MSG, Breaks::keep); returns
/// code.
int fail(int code, const std::string& msg);
/// Same, and with json also {"ok": false, "exit_code", "error"} on stdout.
int fail_json(bool json, int code, const std::string& msg);
/// The failure object every command prints with --json:
/// {"ok": false, "exit_code", "error"}.
nlohmann::json failure_object(int code, const std::string& msg);
/// Prints a JSON value on stdout, one document per line.
void print_json(const nlohmann::json& j);

/// How shown() treats a line break or tab: escaped (a name, a path, a
/// command line shown on one line) or kept (an error message of several
/// lines).
enum class Breaks { escape, keep };
/// text for a terminal: control bytes (a newline, an escape sequence) as
/// \n, \t, \r or \xNN, so that a name or command line read from a file or
/// another process cannot rewrite the screen. Other bytes are kept, and with
/// Breaks::keep line breaks and tabs too.
std::string shown(const std::string& text, Breaks breaks = Breaks::escape);
/// text as one shell word, for a command the user may paste: as it is when
/// every byte is in [A-Za-z0-9_./:=@%+,-], else in single quotes (' as '\'');
/// with a control byte, $'...' (bash, zsh, ksh) holding shown()'s escapes.
std::string shell_word(const std::string& text);
/// Arguments for the terminal: each shown, space-separated.
std::string shown_args(const std::vector<std::string>& args);

/// "1.5 GiB".
std::string human_bytes(uint64_t n);
/// "3h02m", "4m05s", "12s".
std::string human_duration(int64_t seconds);

/// The control timeout: CUSNAP_CONTROL_TIMEOUT, else 10 s.
std::chrono::milliseconds control_timeout();
/// Seconds from an option to milliseconds.
std::chrono::milliseconds seconds(double s);

/// The settings of this command's environment among names (each one of
/// proto::kClientSettings, man cusnap ENVIRONMENT), which count in the job's
/// supervisor before its own; false and *err when one is not a value its
/// setting takes or is longer than proto::kMaxSettingBytes (saying what it
/// takes: proto::sent_setting_checked). The caller exits kExitUsage, as
/// launch does for the same value.
bool client_settings(std::span<const char* const> names, proto::Settings* out, std::string* err);
/// The same with every one of proto::kClientSettings (a checkpoint's).
bool client_settings(proto::Settings* out, std::string* err);

/// While it lives (restore, resume: operations that cannot be cancelled;
/// checkpoint and suspend use CancelOnInterrupt, job_target.h), SIGINT,
/// SIGTERM and SIGHUP end this command at once,
/// saying on stderr that the operation (operation: "the checkpoint of job
/// X") goes on in the job's supervisor (a signal to the client cannot cancel
/// it) and how to follow it, and with json printing the failure object on
/// stdout (with the fields of job, when given: job, name, pid); the exit
/// status is 128 + the signal's number.
class InterruptNotice {
 public:
  InterruptNotice(const std::string& operation, bool json,
                  const nlohmann::json& job = nlohmann::json::object());
  ~InterruptNotice();
  InterruptNotice(const InterruptNotice&) = delete;
  InterruptNotice& operator=(const InterruptNotice&) = delete;
};

/// Renders progress on stderr when it is a terminal: phase, bytes, rate.
/// Does nothing in a pipe or when disabled (--json).
class ProgressLine {
 public:
  explicit ProgressLine(bool enabled);
  ~ProgressLine();
  void update(const std::string& phase, uint64_t done, uint64_t total);
  /// Ends the line so that later output starts on a fresh one.
  void finish();

 private:
  bool enabled_;
  bool drawn_ = false;
  std::string phase_;
  uint64_t last_bytes_ = 0;
  std::chrono::steady_clock::time_point phase_start_, last_draw_;
};

}  // namespace cusnap::cli
