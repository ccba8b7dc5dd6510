// cusnap launch [--name N] [--runtime-dir D] [--no-shim] [--strict] -- CMD...
#include <cstdio>

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
  double control_s = std::chrono::duration<double>(control_timeout()).count();
  bool no_shim = false;
  app.add_option("-n,--name", req.cfg.name,
                 "Job name (default: the command's name and a random suffix)")
      ->type_name("NAME");
  app.add_option("--runtime-dir", req.cfg.runtime_dir,
                 "Runtime directory of the job (default: $CUSNAP_RUNTIME_BASE/NAME)")
      ->type_name("DIR");
  app.add_flag("--no-shim", no_shim, "Do not preload libcusnap_shim.so into the job");
  app.add_flag("--strict", req.strict,
               "Refuse (EPERM) the job's system calls whose state CRIU cannot save: io_uring, "
               "userfaultfd, perf_event_open, bpf, memfd_secret");
  app.add_option("--control-timeout", control_s,
                 "Seconds allowed for each exchange on the control socket")
      ->check(positive())
      ->type_name("SECONDS");
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
  if (!out.warning.empty()) std::fprintf(stderr, "cusnap: warning: %s\n", out.warning.c_str());
  if (!out.stopped_dir.empty())
    std::fprintf(stderr, "cusnap: job %s checkpointed to %s and stopped\n", out.name.c_str(),
                 out.stopped_dir.c_str());
  return out.exit_code;
}

}  // namespace cusnap::cli
