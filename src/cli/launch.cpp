// cusnap launch [--name N] [--runtime-dir D] [--no-shim] [--strict] -- CMD...
#include <unistd.h>

#include <memory>

#include "common.h"
#include "coord/supervisor.h"
#include "proto/env_settings.h"

namespace cusnap::cli {
namespace {

/// The usage line names CMD, which CLI11 does not see as a positional.
class LaunchFormatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App* app, std::string name) const override {
    (void)app;
    return get_label("Usage") + ": " + name + " [OPTIONS] -- CMD [ARGS...]\n";
  }
};

}  // namespace

int cmd_launch(int argc, char** argv) {
  CLI::App app{
      "Start CMD in a new session under cusnap's supervision: its output is streamed and kept in "
      "the job's runtime directory, signals are forwarded, and cusnap exits with the job's "
      "status."};
  init_app(app, "launch");
  app.formatter(std::make_shared<LaunchFormatter>());
  LaunchRequest req;
  double control_s = 0;
  bool no_shim = false;
  add_name_option(app, &req.cfg.name, "Job name (default: the command's name and a random suffix)");
  add_runtime_dir_option(app, &req.cfg.runtime_dir);
  app.add_flag("--no-shim", no_shim, "Do not preload libcusnap_shim.so into the job");
  app.add_flag("--strict", req.strict,
               "Refuse (EPERM) the job's system calls whose state CRIU cannot save: io_uring, "
               "userfaultfd, perf_event_open, bpf, memfd_secret");
  add_control_timeout_option(app, &control_s);
  app.footer("CMD... follows the options, after '--': cusnap launch [OPTIONS] -- CMD [ARGS...]");
  app.prefix_command();  // everything from CMD on belongs to the job
  int rc = parse(app, argc, argv);
  if (rc >= 0) return rc;
  req.argv = app.remaining();
  // CLI11 takes the first argument it does not know as CMD: a mistyped option
  // before '--' would be run as a program.
  if (!req.argv.empty() && req.argv[0].starts_with("-") && req.argv[0] != "--")
    return fail(kExitUsage, unknown_option_message(app, req.argv[0]) +
                                " (cusnap launch --help lists the options; the command follows "
                                "them, after '--')");
  if (!req.argv.empty() && req.argv[0] == "--") req.argv.erase(req.argv.begin());
  if (req.argv.empty())
    return fail(kExitUsage, "no command given: cusnap launch [OPTIONS] -- CMD...");
  req.use_shim = !no_shim;
  req.cfg.control_timeout = seconds(control_s);
  // The shim takes its default for a bad value rather than fail the job: say so now.
  if (std::string err; !proto::check_env_settings(req.use_shim, true, &err))
    return fail(kExitUsage, err);

  // A name cusnap chose is said once, where a person reads it: every other
  // command needs it (a script's captured stderr holds only the job's own).
  if (req.cfg.name.empty() && ::isatty(STDERR_FILENO))
    req.on_named = [](const std::string& name) {
      std::fprintf(stderr, "cusnap: job %s (cusnap ps lists it)\n", name.c_str());
    };
  SuperviseOutcome out = launch_job(req);
  if (!out.error.empty()) return fail(out.exit_code, out.error);
  return finish_supervised(out);
}

}  // namespace cusnap::cli
