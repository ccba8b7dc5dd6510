#include "coord/restore_watch.h"

#include <fcntl.h>
#include <linux/sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <doctest/doctest.h>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "proto/proc_stat.h"

using namespace cusnap;
using namespace std::chrono_literals;

namespace {

/// `sleep 60` in a child, under the process id `at` when given (as CRIU
/// gives a restored process its id: clone3's set_tid, root only); 0 when
/// that id is taken.
pid_t sleeper(pid_t at = 0) {
  clone_args args{};
  args.exit_signal = SIGCHLD;
  if (at > 0) {
    args.set_tid = reinterpret_cast<uintptr_t>(&at);
    args.set_tid_size = 1;
  }
  const long p = ::syscall(SYS_clone3, &args, sizeof args);
  if (p == 0) {
    ::execlp("sleep", "sleep", "60", nullptr);
    ::_exit(127);
  }
  return p > 0 ? pid_t(p) : 0;
}

/// A process id no process has now, high in the range.
pid_t free_id() {
  long max = 32768;
  std::ifstream("/proc/sys/kernel/pid_max") >> max;
  for (pid_t id = pid_t(max - 1000 - (::getpid() % 1000)); id > 300; id -= 7)
    if (::access(("/proc/" + std::to_string(id)).c_str(), F_OK) != 0) return id;
  return 0;
}

/// Whether pid is gone (or a zombie) within the wait.
bool ends_within(pid_t pid, std::chrono::milliseconds wait) {
  const auto until = std::chrono::steady_clock::now() + wait;
  uint64_t t;
  while (cusnap::proto::proc_start_time(pid, &t, true)) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

std::string file_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

enum class End { kKilled, kKeptThenKilled, kDismissed };

struct Outcome {
  pid_t before = 0, after = 0;  ///< started before and after the watch
  std::string work;             ///< the first temporary directory
  std::string said;
  bool temps_left[2] = {};     ///< whether each temporary directory is there after
  bool others_intact = false;  ///< what the watch must not touch is all there
};

bool exists_nofollow(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

/// In a process of its own (the restoring one): a process started before the
/// watch, the watch over both ids, a process started after it; then that
/// process is killed (or dismisses the watch and exits). Both ids come back
/// through a pipe; the watch reports to a file (its report_fd, not stderr).
/// The restoring process gives the watch its two temporary directories
/// (files, a subdirectory, links out to files and a directory that must
/// stay), one named for another process, and a link named as its own; with
/// kKeptThenKilled it asks the watch to keep the first before it is killed.
Outcome run_restorer(End end) {
  const bool killed = end != End::kDismissed;
  char dir[] = "/tmp/cusnap-watch-XXXXXX";
  REQUIRE(::mkdtemp(dir));
  const std::string base = dir;
  const std::string log = base + "/stderr";
  const std::string outside = base + "/outside";
  REQUIRE(::mkdir(outside.c_str(), 0700) == 0);
  std::ofstream(outside + "/keep") << "keep";
  int ids[2];
  REQUIRE(::pipe(ids) == 0);
  const pid_t restorer = ::fork();
  REQUIRE(restorer >= 0);
  const std::string me = std::to_string(restorer == 0 ? ::getpid() : restorer);
  const std::string work = base + "/cusnap-restore-" + me + "-Ab12Cd";
  const std::string no_plugins = base + "/cusnap-noplugins-" + me + "-Ef34Gh";
  const std::string other = base + "/cusnap-restore-1-Ab12Cd";            // not the restorer's
  const std::string link = base + "/cusnap-noplugins-" + me + "-Zz99Zz";  // a link to outside
  if (restorer == 0) {
    bool made = ::mkdir(work.c_str(), 0700) == 0 && ::mkdir((work + "/sub").c_str(), 0700) == 0 &&
                ::mkdir((work + "/sub/deeper").c_str(), 0700) == 0 &&
                ::mkdir(no_plugins.c_str(), 0700) == 0 && ::mkdir(other.c_str(), 0700) == 0 &&
                ::symlink(outside.c_str(), link.c_str()) == 0 &&
                ::symlink(outside.c_str(), (work + "/sub/to-outside").c_str()) == 0 &&
                ::symlink((outside + "/keep").c_str(), (work + "/keep-link").c_str()) == 0;
    for (int i = 0; made && i < 300; ++i)  // more than one getdents buffer
      made = std::ofstream(work + "/f" + std::to_string(i)).put('x').good();
    made = made && std::ofstream(work + "/sub/deeper/restore.log").put('x').good();
    if (!made) ::_exit(5);
    const int report = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    pid_t p[2];
    p[0] = sleeper();
    std::this_thread::sleep_for(30ms);  // a clock tick or more before the watch
    RestoreWatch watch;
    std::string err;
    // The ids a checkpoint names: one in use since before, one to restore.
    const pid_t id = free_id();
    if (report < 0 ||
        !watch.start({p[0], id}, "/ck", report, &err, {work, no_plugins, other, link}))
      ::_exit(2);
    std::this_thread::sleep_for(30ms);
    p[1] = sleeper(id);
    if (p[1] != id) ::_exit(4);
    if (::write(ids[1], p, sizeof p) != sizeof p) ::_exit(3);
    if (end == End::kKeptThenKilled) watch.keep_temp_dir(work);
    if (killed) ::raise(SIGKILL);
    watch.dismiss();
    ::_exit(0);
  }
  ::close(ids[1]);
  Outcome o;
  o.work = work;
  pid_t p[2] = {0, 0};
  REQUIRE(::read(ids[0], p, sizeof p) == sizeof p);
  ::close(ids[0]);
  o.before = p[0];
  o.after = p[1];
  int st = 0;
  REQUIRE(::waitpid(restorer, &st, 0) == restorer);
  CHECK((killed ? WIFSIGNALED(st) : WIFEXITED(st) && WEXITSTATUS(st) == 0));
  if (killed) {
    CHECK(ends_within(o.after, 6000ms));
    // The watch has written by the time it is done; give it that long.
    for (int i = 0; i < 100 && file_text(log).empty(); ++i) std::this_thread::sleep_for(20ms);
  } else {
    std::this_thread::sleep_for(300ms);
  }
  o.said = file_text(log);
  o.temps_left[0] = exists_nofollow(work);
  o.temps_left[1] = exists_nofollow(no_plugins);
  o.others_intact = exists_nofollow(other) && exists_nofollow(link) &&
                    file_text(outside + "/keep") == "keep" && file_text(link + "/keep") == "keep";
  std::system(("rm -rf " + base).c_str());
  return o;
}

}  // namespace

TEST_CASE("restore watch: the start time of a live process, none for a zombie or none") {
  uint64_t t = 0;
  CHECK(cusnap::proto::proc_start_time(::getpid(), &t, true));
  CHECK(t > 0);
  const pid_t z = ::fork();
  if (z == 0) ::_exit(0);
  siginfo_t si{};  // waits for its exit, leaving it a zombie (WNOWAIT)
  REQUIRE(::waitid(P_PID, z, &si, WEXITED | WNOWAIT) == 0);
  CHECK_FALSE(cusnap::proto::proc_start_time(z, &t, true));  // a zombie until reaped
  ::waitpid(z, nullptr, 0);
  CHECK_FALSE(cusnap::proto::proc_start_time(z, &t, true));
  CHECK_FALSE(cusnap::proto::proc_start_time(0x3fffffff, &t, true));
}

TEST_CASE("restore watch: the restoring process killed, what it restored is ended" *
          doctest::test_suite("root")) {  // clone3's set_tid, as CRIU restores

  const Outcome o = run_restorer(End::kKilled);
  uint64_t t;
  // The one restored after the watch began is ended; the older one is not.
  CHECK_FALSE(cusnap::proto::proc_start_time(o.after, &t, true));
  CHECK(cusnap::proto::proc_start_time(o.before, &t, true));
  CHECK(o.said ==
        "cusnap: the restore of /ck ended before the job was back (the restoring "
        "process was killed): its restored process " +
            std::to_string(o.after) +
            " was ended; the checkpoint is unchanged and restores again\n");
  // Its two temporary directories are removed, every file under them, links
  // unlinked not followed; nothing else.
  CHECK_FALSE(o.temps_left[0]);
  CHECK_FALSE(o.temps_left[1]);
  CHECK(o.others_intact);
  ::kill(o.before, SIGKILL);
}

TEST_CASE("restore watch: dismissed, it ends nothing and says nothing" *
          doctest::test_suite("root")) {
  const Outcome o = run_restorer(End::kDismissed);
  uint64_t t;
  CHECK(cusnap::proto::proc_start_time(o.after, &t, true));
  CHECK(cusnap::proto::proc_start_time(o.before, &t, true));
  CHECK(o.said.empty());
  // The restoring process's destructors remove its directories, not the watch.
  CHECK(o.temps_left[0]);
  CHECK(o.temps_left[1]);
  CHECK(o.others_intact);
  ::kill(o.before, SIGKILL);
  ::kill(o.after, SIGKILL);
}

TEST_CASE("restore watch: a temporary directory the restore kept stays, named" *
          doctest::test_suite("root")) {
  const Outcome o = run_restorer(End::kKeptThenKilled);
  uint64_t t;
  CHECK_FALSE(cusnap::proto::proc_start_time(o.after, &t, true));
  CHECK(o.said ==
        "cusnap: the restore of /ck ended before the job was back (the restoring "
        "process was killed): its restored process " +
            std::to_string(o.after) +
            " was ended; the checkpoint is unchanged and restores again; its files are kept "
            "in " +
            o.work + "\n");
  CHECK(o.temps_left[0]);  // kept, as the failed restore's message says
  CHECK_FALSE(o.temps_left[1]);
  CHECK(o.others_intact);
  ::kill(o.before, SIGKILL);
}
