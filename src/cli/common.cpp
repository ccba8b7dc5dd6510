#include "common.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "coord/abs_path.h"
#include "coord/runtime_dir.h"
#include "coord/supervisor.h"
#include "proto/env_settings.h"
#include "proto/json_text.h"
#include "proto/unique_fd.h"
#include "proto/utf8.h"
#include "proto/wire.h"

namespace cusnap::cli {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

void init_app(CLI::App& app, const std::string& name) {
  app.name("cusnap " + name);
  app.set_help_flag("-h,--help", "Print this help message and exit");
}

namespace {

/// What a bad command line with words CLI11 did not take (ExtrasError)
/// says: the first that looks like an option is an unknown option (with the
/// likely one), else the first is an argument too many.
std::string extras_message(const CLI::App& app, const std::vector<std::string>& extras) {
  for (const std::string& w : extras)
    if (w.size() > 1 && w[0] == '-') return unknown_option_message(app, w);
  const std::string w = extras.empty() ? std::string() : extras.front();
  std::string usage = app.get_name() + " [OPTIONS]";
  for (const CLI::Option* o : app.get_options())
    if (o->get_positional()) usage += " " + o->get_name();
  return "unexpected argument '" + w + "' (usage: " + usage + ")";
}

/// The option of app (not a positional) spelled word exactly ("-n",
/// "--name"), else nullptr.
const CLI::Option* option_named(const CLI::App& app, const std::string& word) {
  for (const CLI::Option* o : app.get_options()) {
    if (!o->nonpositional()) continue;
    for (const std::string& l : o->get_lnames())
      if (word == "--" + l) return o;
    for (const std::string& sn : o->get_snames())
      if (word == "-" + sn) return o;
  }
  return nullptr;
}

}  // namespace

bool json_among(const CLI::App* app, int argc, char** argv) {
  bool json = false;  // the last one counts, as for CLI11
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;
    if (app != nullptr && app->get_prefix_command() && (a.empty() || a[0] != '-')) break;
    if (a == "--json") {
      json = true;
    } else if (a.starts_with("--json=")) {
      // CLI11 reads false, 0, no, off and disable (any case) as false.
      std::string v = a.substr(7);
      for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      json = !(v == "false" || v == "0" || v == "no" || v == "off" || v == "disable");
    } else if (const CLI::Option* o = app != nullptr ? option_named(*app, a) : nullptr;
               o != nullptr && o->get_items_expected_min() > 0) {
      ++i;  // its value, whatever it looks like
    }
  }
  return json;
}

namespace {

/// --json given as a flag, for a command that has it: among the options
/// (before a "--", and for launch before CMD), not the value of an option
/// given as its own argument ("--name --json": missing_value_message refuses
/// it, and the user did not ask for JSON).
bool wants_json(const CLI::App& app, int argc, char** argv) {
  return app.get_option_no_throw("--json") != nullptr && json_among(&app, argc, argv);
}

/// An option that takes a value, given as its own argument ("-n NAME"),
/// followed by "--" (the end of the options: launch -n -- CMD) or by
/// another of the command's options (checkpoint JOB -o --json): CLI11
/// would take that for the value. The message, else empty.
std::string missing_value_message(const CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;
    // launch: from CMD on, the arguments are the job's.
    if (app.get_prefix_command() && (a.empty() || a[0] != '-')) break;
    const CLI::Option* o = option_named(app, a);
    if (o == nullptr || o->get_items_expected_min() == 0) continue;  // a flag, or not an option
    if (i + 1 >= argc) break;                                        // CLI11 says it is missing
    const std::string v = argv[i + 1];
    const std::string what = a + ": 1 required " + o->get_type_name() + " missing: ";
    if (v == "--")
      return what + "the '--' after it ends the options and is not a value (give it as " + a + " " +
             o->get_type_name() + ")";
    if (option_named(app, v.substr(0, v.find('='))) != nullptr)
      return what + "'" + v + "' after it is an option of " + app.get_name() +
             ", not a value (for a value that starts with '-', write " +
             (o->get_lnames().empty() ? a : "--" + o->get_lnames().front()) + "=" + v + ")";
    ++i;  // its value
  }
  return "";
}

}  // namespace

std::string unknown_option_message(const CLI::App& app, const std::string& word) {
  // "--name=VALUE": the option is what comes before the '='.
  const std::string opt = word.substr(0, word.find('='));
  std::string best;
  // Closer than that is a typo; a short option ("-x") is like every other.
  size_t best_d = opt.size() <= 2 ? 0 : opt.size() <= 3 ? 2 : 3;
  for (const CLI::Option* o : app.get_options()) {
    std::vector<std::string> names;
    for (const std::string& l : o->get_lnames()) names.push_back("--" + l);
    for (const std::string& s : o->get_snames()) names.push_back("-" + s);
    for (const std::string& n : names) {
      size_t d = edit_distance(opt, n);
      // A prefix of an option ("--leave") is taken for it.
      if (opt.size() >= 4 && n.compare(0, opt.size(), opt) == 0) d = std::min<size_t>(d, 1);
      if (d < best_d) {
        best_d = d;
        best = n;
      }
    }
  }
  std::string msg = "unknown option '" + opt + "'";
  if (!best.empty()) msg += "; did you mean '" + best + "'?";
  return msg;
}

int parse(CLI::App& app, int argc, char** argv) {
  try {
    if (const std::string msg = missing_value_message(app, argc, argv); !msg.empty())
      throw CLI::ArgumentMismatch(msg);
    app.parse(argc, argv);
    // Every command reads it, and so do the supervisor and the job's shims.
    int64_t ms = 0;
    if (std::string err; !proto::control_timeout_checked(&ms, &err)) {
      if (wants_json(app, argc, argv)) print_json(failure_object(kExitUsage, err));
      std::fprintf(stderr, "cusnap: error: %s\n", shown(err, Breaks::keep).c_str());
      return kExitUsage;
    }
    return -1;
  } catch (const CLI::CallForHelp& e) {
    app.exit(e);
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    // CLI11's "The following argument was not expected: --leave-runing"
    // neither says that it is an option nor which one was meant.
    const std::string msg = dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr
                                ? extras_message(app, app.remaining())
                                : std::string(e.what());
    if (wants_json(app, argc, argv)) print_json(failure_object(kExitUsage, msg));
    std::fprintf(stderr, "cusnap: error: %s\nRun '%s --help' for usage.\n",
                 shown(msg, Breaks::keep).c_str(), app.get_name().c_str());
    return kExitUsage;
  }
}

void add_timeout_option(CLI::App& app, double* seconds, const char* bounds, bool criu) {
  app.add_option("--timeout", *seconds,
                 std::string("Seconds allowed for ") + bounds +
                     " (default: 60); the supervisor adds an allowance that grows with memory "
                     "to each driver call" +
                     (criu ? " and to CRIU" : "") + " (see the man page)")
      ->check(positive())
      ->type_name("SECONDS");
}

void add_control_timeout_option(CLI::App& app, double* seconds, bool restore) {
  *seconds = std::chrono::duration<double>(control_timeout()).count();
  // Who is given the setting: a restore's processes keep their environment.
  const std::string given =
      restore ? "given to the supervisor as CUSNAP_CONTROL_TIMEOUT, it bounds its driver calls and "
                "talks with the shims too (the restored processes keep the environment they were "
                "checkpointed with)"
              : "given to the supervisor and the job as CUSNAP_CONTROL_TIMEOUT, it bounds their "
                "driver locks and talks with the shims too";
  app.add_option("--control-timeout", *seconds,
                 "Seconds allowed for each exchange on the control socket (default: "
                 "$CUSNAP_CONTROL_TIMEOUT or 10); " +
                     given)
      ->check(control_seconds())
      // Past the check: the supervisor's own bounds (the driver's lock and
      // unlock, its talks with the shims, the guardian) and the job's
      // shims read CUSNAP_CONTROL_TIMEOUT; the option stands for it there
      // too, not for the control socket alone.
      ->each([](const std::string& v) { ::setenv("CUSNAP_CONTROL_TIMEOUT", v.c_str(), 1); })
      ->type_name("SECONDS");
}

CLI::Validator not_empty() {
  return CLI::Validator(
      [](std::string& text) -> std::string { return text.empty() ? "must not be empty" : ""; }, "",
      "not empty");
}

void add_runtime_dir_option(CLI::App& app, std::string* dir) {
  app.add_option("--runtime-dir", *dir,
                 "Runtime directory of the job (default: BASE/NAME, BASE being "
                 "$CUSNAP_RUNTIME_BASE when set, else /run/cusnap for root and, for other users, "
                 "$XDG_RUNTIME_DIR/cusnap when XDG_RUNTIME_DIR is set, else /tmp/cusnap-UID); a "
                 "relative DIR is taken from the current directory; new, empty, or left by a dead "
                 "supervisor; made private (0700)")
      ->check(not_empty())
      ->transform(CLI::Validator(
          [](std::string& text) -> std::string {
            if (text.empty() || text[0] == '/') return "";
            std::error_code ec;
            std::string abs;
            if (!absolute_path(text, &abs, &ec))
              return "cannot make '" + text + "' absolute: " + ec.message();
            text = abs;
            return "";
          },
          "", "absolute"))
      // Recorded as JSON (job.json, ps): a bad command line, as checkpoint -o's is (after
      // the current directory is put before a relative one).
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            return valid_utf8(text)
                       ? ""
                       : "the directory is not valid UTF-8, which cusnap cannot record: choose "
                         "another";
          },
          "", "UTF-8"))
      ->type_name("DIR");
}

void add_name_option(CLI::App& app, std::string* name, const std::string& help) {
  app.add_option("-n,--name", *name, help)
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            std::string err;
            return valid_job_name(text, &err) ? "" : err;
          },
          "", "job name"))
      ->type_name("NAME");
}

int finish_supervised(const SuperviseOutcome& out) {
  // The job's last line, cut by a checkpoint, gets its end from the restored
  // job; this line is cusnap's own.
  if (out.output_mid_line && (!out.warning.empty() || !out.stopped_dir.empty()))
    std::fputc('\n', stderr);
  if (!out.warning.empty())
    std::fprintf(stderr, "cusnap: warning: %s\n", shown(out.warning, Breaks::keep).c_str());
  if (!out.stopped_dir.empty())
    std::fprintf(stderr, "cusnap: job %s checkpointed to %s and stopped\n", shown(out.name).c_str(),
                 shown(out.stopped_dir).c_str());
  return out.exit_code;
}

std::string unreadable_hint(int e, const std::string& action) {
  if (e == EACCES || e == EPERM) return ": " + action + " as a user who can read it (root)";
  if (out_of_descriptors(e)) return "";  // the reader said what to do
  return ": check the file system it is on, and try again";
}

int fail(int code, const std::string& msg) {
  std::fprintf(stderr, "cusnap: error: %s\n", shown(msg, Breaks::keep).c_str());
  return code;
}

namespace {

constexpr int kNoticeSignals[] = {SIGINT, SIGTERM, SIGHUP};
// Written before the handlers are installed, read only by them.
std::string g_notice_text;
std::string g_notice_json[3];
struct sigaction g_notice_old[3];

void on_notice_signal(int sig) {
  for (int i = 0; i < 3; ++i) {
    if (kNoticeSignals[i] != sig) continue;
    if (::write(STDERR_FILENO, g_notice_text.data(), g_notice_text.size()) < 0) {
    }
    if (!g_notice_json[i].empty() &&
        ::write(STDOUT_FILENO, g_notice_json[i].data(), g_notice_json[i].size()) < 0) {
    }
  }
  ::_exit(128 + sig);
}

}  // namespace

InterruptNotice::InterruptNotice(const std::string& operation, bool json,
                                 const nlohmann::json& job) {
  const std::string msg = "interrupted: " + operation +
                          " goes on in its supervisor (an interrupt here does not cancel it); "
                          "cusnap ps shows the job's state";
  // A progress line may be on the terminal: start on a fresh line.
  g_notice_text = std::string(::isatty(STDERR_FILENO) ? "\n" : "") + "cusnap: " + msg + "\n";
  for (int i = 0; i < 3; ++i) {
    g_notice_json[i].clear();
    if (json) {
      nlohmann::json j = failure_object(128 + kNoticeSignals[i], msg);
      for (const char* key : {"job", "name", "pid"})
        if (job.is_object() && job.contains(key)) j[key] = job[key];
      g_notice_json[i] = json_text(j, 2) + "\n";
    }
    struct sigaction sa {};
    sa.sa_handler = on_notice_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(kNoticeSignals[i], &sa, &g_notice_old[i]);
  }
}

InterruptNotice::~InterruptNotice() {
  for (int i = 0; i < 3; ++i) ::sigaction(kNoticeSignals[i], &g_notice_old[i], nullptr);
}

int fail_json(bool json, int code, const std::string& msg) {
  if (json) print_json(failure_object(code, msg));
  return fail(code, msg);
}

nlohmann::json failure_object(int code, const std::string& msg) {
  return {{"ok", false}, {"exit_code", code}, {"error", msg}};
}

void print_json(const nlohmann::json& j) {
  std::string s = json_text(j, 2) + "\n";
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

std::string human_bytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

std::string human_duration(int64_t s) {
  if (s < 0) s = 0;
  char buf[32];
  if (s >= 86400)
    std::snprintf(buf, sizeof buf, "%lldd%02lldh", static_cast<long long>(s / 86400),
                  static_cast<long long>(s % 86400 / 3600));
  else if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s % 3600 / 60));
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  return buf;
}

std::string shown(const std::string& text, Breaks breaks) {
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c >= 0x20 && c != 0x7f) || (breaks == Breaks::keep && (c == '\n' || c == '\t'))) {
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

std::string shell_word(const std::string& text) {
  const auto plain = [](unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c != 0 && std::strchr("_./:=@%+,-", c) != nullptr);
  };
  const auto control = [](unsigned char c) { return c < 0x20 || c == 0x7f; };
  if (!text.empty() && std::all_of(text.begin(), text.end(), plain)) return text;
  if (std::none_of(text.begin(), text.end(), control)) {
    std::string out = "'";
    for (char ch : text) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    return out + "'";
  }
  // shown()'s \n, \t, \r and \xNN are $'...' escapes as they stand; a
  // backslash and a quote of the text are escaped before.
  std::string escaped;
  for (char ch : text) {
    if (ch == '\\' || ch == '\'') escaped += '\\';
    escaped += ch;
  }
  return "$'" + shown(escaped) + "'";
}

std::string shown_args(const std::vector<std::string>& args) {
  std::string s;
  for (const std::string& a : args) {
    if (!s.empty()) s += ' ';
    s += shown(a);
  }
  return s;
}

std::chrono::milliseconds control_timeout() {
  return proto::control_timeout_from_env();
}

std::chrono::milliseconds seconds(double s) {
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0 + 0.5));
}

bool client_settings(std::span<const char* const> names, proto::Settings* out, std::string* err) {
  for (const char* name : names)
    if (const char* v = std::getenv(name)) {
      if (!proto::sent_setting_checked(name, v, proto::kMaxSettingBytes, err)) return false;
      (*out)[name] = v;
    }
  return true;
}

bool client_settings(proto::Settings* out, std::string* err) {
  return client_settings(proto::kClientSettings, out, err);
}

ProgressLine::ProgressLine(bool enabled) : enabled_(enabled && ::isatty(STDERR_FILENO)) {}

ProgressLine::~ProgressLine() {
  finish();
}

void ProgressLine::update(const std::string& phase, uint64_t done, uint64_t total) {
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  if (phase != phase_) {
    phase_ = phase;
    phase_start_ = now;
  } else if (now - last_draw_ < std::chrono::milliseconds(100) && done != total) {
    return;  // at most ten redraws a second
  }
  last_draw_ = now;
  last_bytes_ = done;
  std::string line = "  " + phase;
  if (done > 0 || total > 0) {
    line += "  " + human_bytes(done);
    if (total > 0) {
      char pct[16];
      std::snprintf(pct, sizeof pct, " (%d%%)", static_cast<int>(100.0 * done / total));
      line += " / " + human_bytes(total) + pct;
    }
    double secs = std::chrono::duration<double>(now - phase_start_).count();
    if (secs > 0.2) line += "  " + human_bytes(static_cast<uint64_t>(done / secs)) + "/s";
  }
  std::fprintf(stderr, "\r%s\033[K", line.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressLine::finish() {
  if (enabled_ && drawn_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }
  drawn_ = false;
}

}  // namespace cusnap::cli
