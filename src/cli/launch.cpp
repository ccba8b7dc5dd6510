// cusnap launch [--name N] [--runtime-dir D] [--no-shim] [--strict] -- CMD...
#include "common.h"
#include "coord/supervisor.h"

namespace cusnap::cli {

int cmd_launch(int argc, char** argv) {
  CLI::App app{
      "Start CMD in a new session under cusnap's supervision: its output is streamed and kept in "
      "the job's runtime directory, signals are forwarded, and cusnap exits with the job's "
      "status."};
  init_app(app, "launch");
  LaunchRequest req;
  double control_s = 0;
  bool no_shim = false;
  app.add_option("-n,--name", req.cfg.name,
                 "Job name (default: the command's name and a random suffix)")
      ->type_name("NAME");
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
  if (!req.argv.empty() && req.argv[0] == "--") req.argv.erase(req.argv.begin());
  if (req.argv.empty())
    return fail(kExitUsage, "no command given: cusnap launch [OPTIONS] -- CMD...");
  req.use_shim = !no_shim;
  req.cfg.control_timeout = seconds(control_s);

  SuperviseOutcome out = launch_job(req);
  if (!out.error.empty()) return fail(out.exit_code, out.error);
  return finish_supervised(out);
}

}  // namespace cusnap::cli
