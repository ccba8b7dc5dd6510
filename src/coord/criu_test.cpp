#include "coord/criu.h"

#include <doctest/doctest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>

#include "proto/proc_stat.h"
#include "unit/fake_criu.h"

using namespace cusnap;
using cusnap::testing::FakeCriu;

TEST_CASE("criu: version parsing") {
  CriuInfo c;
  REQUIRE(parse_criu_version("Version: 4.1.1\n", &c));
  CHECK(c.major == 4);
  CHECK(c.minor == 1);
  CHECK(c.patch == 1);
  REQUIRE(parse_criu_version("Version: 3.17\nGitID: v3.17\n", &c));
  CHECK(c.version == "3.17");
  CHECK(c.minor == 17);
  CHECK_FALSE(parse_criu_version("criu: unknown option\n", &c));
}

TEST_CASE("criu: too old and missing are refused with what to do") {
  const FakeCriu fake("#!/bin/sh\necho 'Version: 3.17'\n");
  setenv("CUSNAP_CRIU", fake.path().c_str(), 1);
  CriuInfo c;
  std::string err;
  CHECK_FALSE(find_criu(&c, &err, nullptr));
  CHECK(err.find("version 3.17") != std::string::npos);
  CHECK(err.find(">= 4.1") != std::string::npos);
  setenv("CUSNAP_CRIU", "/nonexistent/criu", 1);
  CHECK_FALSE(find_criu(&c, &err, nullptr));
  CHECK(err.find("not an executable") != std::string::npos);
  unsetenv("CUSNAP_CRIU");
}

TEST_CASE("criu: a `criu --version` that hangs is killed and refused") {
  const FakeCriu fake("#!/bin/sh\necho 'Version: 4.1.1'\nexec sleep 30\n");
  setenv("CUSNAP_CRIU", fake.path().c_str(), 1);
  CriuInfo c;
  std::string err;
  const auto start = std::chrono::steady_clock::now();
  CHECK_FALSE(find_criu(&c, &err, nullptr, std::chrono::milliseconds(300)));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  CHECK(err.find("did not finish within 300 ms") != std::string::npos);
  // One that answers in time is taken.
  fake.set_script("#!/bin/sh\necho 'Version: 4.1.1'\n");
  CHECK(find_criu(&c, &err, "0", std::chrono::milliseconds(5000)));
  CHECK(c.version == "4.1.1");
  unsetenv("CUSNAP_CRIU");
}

namespace {

/// Runs fake with the script text as CRIU's `action`, its log at the file
/// `log` of fake's directory; expects a failure and returns its message.
std::string failed_run(const FakeCriu& fake, const std::string& script, const char* action,
                       const char* log = "x.log") {
  fake.set_script(script);
  CriuRun run;
  run.args = {action};
  run.log_path = fake.file(log);
  std::string err;
  CHECK_FALSE(run_criu(fake.info(), run, &err));
  return err;
}

}  // namespace

TEST_CASE("criu: a failing run quotes the end of its log") {
  const FakeCriu fake;
  const std::string err =
      failed_run(fake,
                 "#!/bin/sh\necho 'Error (criu/cr-dump.c:1): something broke' > " +
                     fake.file("x.log") + "\nexit 1\n",
                 "dump");
  CHECK(err.find("criu dump failed (exit status 1)") != std::string::npos);
  CHECK(err.find("something broke") != std::string::npos);
}

TEST_CASE("criu: a run ended by SIGINT or SIGTERM is said to be interrupted") {
  const FakeCriu fake;
  // A test run in the background may have SIGINT ignored, which CRIU's
  // stand-in would inherit: the default for the test's length.
  struct sigaction dfl {
  }, old_int{}, old_term{};
  dfl.sa_handler = SIG_DFL;
  sigaction(SIGINT, &dfl, &old_int);
  sigaction(SIGTERM, &dfl, &old_term);
  for (const char* sig : {"INT", "TERM", "KILL"}) {
    const std::string err =
        failed_run(fake, "#!/bin/sh\nkill -" + std::string(sig) + " $$\nsleep 5\n", "restore");
    CHECK_MESSAGE(err.find("criu restore failed (killed by signal") != std::string::npos, err);
    CHECK_MESSAGE((err.find("interrupted, as by Ctrl-C") != std::string::npos) ==
                      (std::string(sig) != "KILL"),
                  err);
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
}

TEST_CASE("criu: a run stop_now asks to end is killed after before_kill, and says so") {
  const FakeCriu fake("#!/bin/sh\nexec sleep 30\n");
  const CriuInfo c = fake.info();
  CriuRun run;
  run.args = {"dump"};
  run.log_path = fake.file("x.log");
  std::atomic<bool> stop{false};
  int asked = 0, before_kill = 0;
  run.stop_now = [&] {
    ++asked;
    return stop.load();
  };
  run.before_kill = [&] { ++before_kill; };
  const auto start = std::chrono::steady_clock::now();  // before the 300 ms begin
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stop = true;
  });
  std::string err;
  CHECK_FALSE(run_criu(c, run, &err));
  const auto took = std::chrono::steady_clock::now() - start;
  later.join();
  CHECK_MESSAGE(err == "criu dump was stopped on request (killed)", err);
  CHECK(before_kill == 1);
  CHECK(asked > 1);
  CHECK(took >= std::chrono::milliseconds(300));
  CHECK(took < std::chrono::seconds(10));
  // A process CRIU forked goes with it.
  fake.set_script("#!/bin/sh\nsleep 60 &\necho $! > " + fake.file("helper") + "\nexec sleep 30\n");
  stop = false;
  std::thread again([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stop = true;
  });
  CHECK_FALSE(run_criu(c, run, &err));
  again.join();
  pid_t helper = 0;
  std::ifstream(fake.file("helper")) >> helper;
  REQUIRE(helper > 0);
  uint64_t t = 0;
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = !cusnap::proto::proc_start_time(helper, &t, true);  // a zombie counts as gone
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK_MESSAGE(gone, "CRIU's helper " << helper << " outlived it");
  if (!gone) ::kill(helper, SIGKILL);
  // Not asked to stop, it runs to its end.
  fake.set_script("#!/bin/sh\nsleep 0.3\nexit 0\n");
  stop = false;
  before_kill = 0;
  CHECK(run_criu(c, run, &err));
  CHECK(before_kill == 0);
}

TEST_CASE("criu: a failing run quotes CRIU's first errors and what that process did before") {
  const FakeCriu fake;
  const std::string log = fake.file("restore.log");
  {
    std::ofstream l(log);
    l << "(00.010000)    650: inet: Restore: family AF_INET port 28028 state TCP_LISTEN\n"
         "(00.010001)    649: Opening 0x1000-0x2000 vma\n"
         "(00.010002)    650: inet: binding to 127.0.0.1:28028\n"
         "(00.010003)    650: Error (criu/sk-inet.c:1): inet: Can't bind inet socket (id 7): "
         "Address already in use\n"
         "(00.010004)    649: Error (criu/cr-restore.c:2): 650 exited, status=1\n";
    for (int i = 0; i < 40; ++i) l << "(00.020000)    649: Opening 0x3000-0x4000 vma\n";
    l << "(00.030000) Error (criu/cr-restore.c:3): Restoring FAILED.\n";
  }
  const std::string err = failed_run(fake, "#!/bin/sh\nexit 1\n", "restore", "restore.log");
  CHECK(err.find("criu restore failed (exit status 1); the errors in its log") !=
        std::string::npos);
  // The cause, the lines of that process before it, and the later errors.
  CHECK(err.find("Can't bind inet socket (id 7): Address already in use") != std::string::npos);
  CHECK(err.find("port 28028 state TCP_LISTEN") != std::string::npos);
  CHECK(err.find("binding to 127.0.0.1:28028") != std::string::npos);
  CHECK(err.find("Restoring FAILED") != std::string::npos);
  // Not another process's lines, nor the unwinding.
  CHECK(err.find("vma") == std::string::npos);
}

TEST_CASE("criu: the ghost limit comes from CUSNAP_CRIU_GHOST_LIMIT, unlimited when unset") {
  std::string arg, err;
  for (const char* unset : {static_cast<const char*>(nullptr), ""}) {
    REQUIRE(criu_ghost_limit(unset, &arg, &err));
    CHECK(arg == std::to_string(std::numeric_limits<long>::max()));
  }
  for (const char* ok : {"1048576", "64K", "512M", "4G", "1"}) {
    REQUIRE(criu_ghost_limit(ok, &arg, &err));
    CHECK(arg == ok);
  }
  for (const char* bad :
       {"0", "-1", "4g", "4GB", "G", "1.5G", " 4G", "99999999999999G", "9999999999999"}) {
    err.clear();
    CHECK_FALSE(criu_ghost_limit(bad, &arg, &err));
    CHECK(err.find(std::string("CUSNAP_CRIU_GHOST_LIMIT=\"") + bad + "\" is not a size") !=
          std::string::npos);
  }
}

TEST_CASE("criu: the network lock is nftables unless CUSNAP_CRIU_NETWORK_LOCK names another") {
  std::string m, err;
  REQUIRE(criu_network_lock(nullptr, &m, &err));
  CHECK(m == "nftables");
  for (const char* ok : {"nftables", "iptables", "skip"}) {
    REQUIRE(criu_network_lock(ok, &m, &err));
    CHECK(m == ok);
  }
  CHECK_FALSE(criu_network_lock("--inject", &m, &err));
  CHECK(err.find("CUSNAP_CRIU_NETWORK_LOCK=\"--inject\" is not nftables, iptables or skip") !=
        std::string::npos);
}

TEST_CASE("criu: a benign error line is not quoted as the cause") {
  const FakeCriu fake;
  const std::string log = fake.file("dump.log");
  std::ofstream(log) << "(00.040533) Error (criu/util.c:1533): rlimit: Can't setup RLIMIT_NOFILE "
                        "for self: Operation not permitted\n"
                        "(00.050000) Error (criu/cr-dump.c:1): the real cause\n";
  const std::string errors = log_errors(log, 6, 3);
  CHECK(errors.find("the real cause") != std::string::npos);
  CHECK(errors.find("RLIMIT_NOFILE") == std::string::npos);
}

TEST_CASE(
    "criu: breakpoints follow CUSNAP_CRIU_BREAKPOINTS, and CRIU gets CRIU_FAULT=130 without") {
  bool use = false;
  std::string err;
  CHECK(criu_breakpoints("on", &use, &err));
  CHECK(use);
  CHECK(criu_breakpoints("off", &use, &err));
  CHECK_FALSE(use);
  CHECK_FALSE(criu_breakpoints("sometimes", &use, &err));
  CHECK(err.find("CUSNAP_CRIU_BREAKPOINTS=\"sometimes\" is not auto, on or off") !=
        std::string::npos);
  // auto (or unset): the probe's answer, and it says what it saw.
  std::string why;
  const bool works = hw_breakpoints_work(&why);
  for (const char* automatic : {static_cast<const char*>(nullptr), "", "auto"}) {
    CHECK(criu_breakpoints(automatic, &use, &err));
    CHECK(use == works);
  }
  CHECK_FALSE(why.empty());
  MESSAGE("hardware breakpoints on this machine: " << why);

  // What CRIU's environment holds, through a stand-in that prints it.
  const FakeCriu fake("#!/bin/sh\necho \"fault=${CRIU_FAULT:-none}\"\n");
  const std::string out = fake.file("out");
  auto fault_seen = [&](bool no_breakpoints) {
    CriuInfo c = fake.info();
    c.no_breakpoints = no_breakpoints;
    CriuRun run;
    run.args = {"dump"};
    run.output_path = out;
    std::string e;
    REQUIRE(run_criu(c, run, &e));
    std::string text;
    std::getline(std::ifstream(out), text);
    return text;
  };
  CHECK(fault_seen(false) == "fault=none");
  CHECK(fault_seen(true) == "fault=130");
}

TEST_CASE("criu: a helper program's exit status; missing or hung ones say so") {
  std::string err;
  CHECK(run_program("true", {}, std::chrono::seconds(5), &err) == 0);
  CHECK(run_program("sh", {"-c", "echo noise; exit 3"}, std::chrono::seconds(5), &err) == 3);
  CHECK(run_program("cusnap-no-such-program", {}, std::chrono::seconds(5), &err) == -1);
  CHECK(err.find("cusnap-no-such-program is not installed") != std::string::npos);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(run_program("sleep", {"30"}, std::chrono::milliseconds(200), &err) == -1);
  CHECK(err.find("did not end within 200 ms and was killed") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}
