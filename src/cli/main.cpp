// cusnap: checkpoint and restore GPU (CUDA) jobs. This file only dispatches
// to one subcommand; each lives in a file of its own and does its work
// through src/coord.
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"
#include "coord/guardian.h"

namespace cusnap::cli {
namespace {

const Command kCommands[] = {
    {"launch", "start a job under cusnap's supervision", cmd_launch},
    {"checkpoint", "checkpoint a running job into a directory", cmd_checkpoint},
    {"restore", "restore a job from a checkpoint directory and supervise it", cmd_restore},
    {"suspend", "release a job's GPUs in place", cmd_suspend},
    {"resume", "give a suspended job its GPUs back", cmd_resume},
    {"ps", "list running jobs", cmd_ps},
    {"inspect", "describe a checkpoint directory or a running job", cmd_inspect},
};

/// The closest command name, if it is close enough to be a typo.
const char* suggest(const std::string& word) {
  const char* best = nullptr;
  size_t best_d = 3;
  for (const Command& c : kCommands) {
    size_t d = edit_distance(word, c.name);
    if (std::strncmp(c.name, word.c_str(), word.size()) == 0 && word.size() >= 2) d = 1;
    if (d < best_d) {
      best_d = d;
      best = c.name;
    }
  }
  return best;
}

void usage(FILE* out) {
  std::fprintf(out,
               "usage: cusnap COMMAND [OPTIONS] [ARGS]\n\n"
               "Checkpoint and restore GPU (CUDA) jobs.\n\n"
               "Commands:\n");
  for (const Command& c : kCommands) std::fprintf(out, "  %-11s %s\n", c.name, c.summary);
  std::fprintf(out,
               "\nRun 'cusnap COMMAND --help' for a command's options; see cusnap(1) for\n"
               "exit codes and environment variables.\n");
}

/// Opens /dev/null onto each of stdin, stdout and stderr that is closed:
/// else the first files cusnap opens (a runtime directory's lock, a log)
/// would take those numbers, and the job's output, or an error message,
/// would be written into them.
void open_standard_fds() {
  for (int fd = STDIN_FILENO; fd <= STDERR_FILENO; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int null = ::open("/dev/null", O_RDWR);  // the lowest free number: fd
    if (null < 0) ::_exit(cusnap::kExitFailure);   // nowhere to say it
    if (null != fd) {
      ::dup2(null, fd);
      ::close(null);
    }
  }
}

/// "unknown command" on stderr, with the likely one; returns kExitUsage.
/// An option before the command (cusnap --json ps, cusnap -v) is said to be
/// one, with the command line it likely meant: no command is like it. A
/// --json among the arguments (before a --) also prints the failure object
/// on stdout, as a command's bad command line does.
int unknown_command(const std::string& cmd, int argc = 0, char** argv = nullptr) {
  const bool json = json_among(nullptr, argc, argv);
  std::string msg;
  if (cmd.size() > 1 && cmd[0] == '-') {
    std::string moved;
    for (int i = 2; i < argc && moved.empty(); ++i)
      for (const Command& c : kCommands)
        if (argv[i] == std::string(c.name)) {
          moved = std::string("cusnap ") + c.name;
          for (int j = 1; j < i; ++j) moved += std::string(" ") + argv[j];
          for (int j = i + 1; j < argc; ++j) moved += std::string(" ") + argv[j];
        }
    // A mistyped --help or --version (--hlep, --versoin).
    const char* meant = nullptr;
    for (const char* opt : {"--help", "--version"})
      if (edit_distance(cmd, opt) <= 2) meant = opt;
    msg = !moved.empty() ? "unknown option '" + shown(cmd) +
                               "' before the command: a command's options follow it; did you "
                               "mean '" +
                               shown(moved) + "'?"
          : meant ? "unknown option '" + shown(cmd) + "'; did you mean '" + meant + "'?"
                  : "unknown option '" + shown(cmd) +
                        "': before a command cusnap takes only --help and --version; a "
                        "command's options follow it (cusnap COMMAND [OPTIONS]; 'cusnap "
                        "--help' lists the commands)";
  } else if (const char* s = suggest(cmd)) {
    msg = "unknown command '" + shown(cmd) + "'; did you mean '" + s + "'?";
  } else {
    msg = "unknown command '" + shown(cmd) + "'; run 'cusnap --help' for the list";
  }
  return fail_json(json, cusnap::kExitUsage, msg);
}

}  // namespace
}  // namespace cusnap::cli

int main(int argc, char** argv) {
  using namespace cusnap::cli;
  open_standard_fds();
  if (argc < 2) {
    usage(stderr);
    return cusnap::kExitUsage;
  }
  std::string cmd = argv[1];
  // --help, --version and version take nothing after them, help one COMMAND:
  // anything more is a mistake to say, not to ignore.
  const bool info = cmd == "-h" || cmd == "--help" || cmd == "--version" || cmd == "version";
  if ((info && argc > 2) || (cmd == "help" && argc > 3)) {
    const int extra = info ? 2 : 3;
    std::fprintf(stderr,
                 "cusnap: error: unexpected argument '%s': 'cusnap %s' takes %s\n"
                 "Run 'cusnap --help' for usage.\n",
                 shown(argv[extra]).c_str(), shown(cmd).c_str(),
                 info ? "none" : "at most one COMMAND");
    return cusnap::kExitUsage;
  }
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    if (cmd == "help" && argc > 2) {
      const std::string topic = argv[2];
      if (topic == "help" || topic == "-h" || topic == "--help") {
        usage(stdout);
        return cusnap::kExitOk;
      }
      if (topic == "version" || topic == "--version") {
        std::printf("Usage: cusnap version (or cusnap --version)\n\nPrints cusnap's version.\n");
        return cusnap::kExitOk;
      }
      for (const Command& c : kCommands)
        if (argv[2] == std::string(c.name)) {
          char help[] = "--help";
          char* args[] = {argv[2], help, nullptr};
          return c.run(2, args);
        }
      return unknown_command(argv[2]);
    }
    usage(stdout);
    return cusnap::kExitOk;
  }
  if (cmd == "--version" || cmd == "version") {
    std::printf("cusnap %s\n", CUSNAP_VERSION);
    return cusnap::kExitOk;
  }
  for (const Command& c : kCommands)
    if (cmd == c.name) return c.run(argc - 1, argv + 1);
  // Internal: the guardian a supervisor starts (src/coord/guardian.h).
  if (cmd == "__guardian") cusnap::guardian_command(argc - 2, argv + 2);
  return unknown_command(cmd, argc, argv);
}
