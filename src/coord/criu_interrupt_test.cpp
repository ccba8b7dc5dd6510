#include "coord/criu_interrupt.h"

#include <doctest/doctest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "coord/criu.h"

using namespace cusnap;

namespace {

// Lines of a real `criu dump -v4` log (CRIU 4.1.1) of one process.
constexpr const char* kSeized = "(00.116682) Seized task 30746, state 1\n";
constexpr const char* kInfect =
    "(00.129878) Parasite syscall_ip at 0x560f5ad4e000\n"
    "(00.135453) Set up parasite blob using memfd\n";
constexpr const char* kDaemon =
    "(00.137545) Parasite 30746 has been switched to daemon mode\n"
    "(00.138891) Sent msg to daemon 74 0 0\n";
constexpr const char* kCure =
    "(00.163009) Waiting for 30746 to trap\n"
    "(00.163039) Daemon 30746 exited trapping\n"
    "(00.163076) 30746 was trapped\n";
constexpr const char* kCured = "(00.165619) Dumping mm (pid: 30746)\n";

}  // namespace

TEST_CASE("criu interrupt: killable except while a process is infected or cured") {
  std::string log = kSeized;
  CHECK(criu_dump_killable_text(""));
  CHECK(criu_dump_killable_text(log));  // no process infected yet
  log += kInfect;
  CHECK_FALSE(criu_dump_killable_text(log));
  log += kDaemon;
  CHECK(criu_dump_killable_text(log));
  log += kCure;
  CHECK_FALSE(criu_dump_killable_text(log));
  log += kCured;
  CHECK(criu_dump_killable_text(log));
  // The next process's infection.
  log += std::string(kInfect);
  CHECK_FALSE(criu_dump_killable_text(log));
  log += "(00.175048) Running post-dump scripts\n";
  CHECK_FALSE(criu_dump_killable_text(log));  // only the step's own end ends it
}

TEST_CASE("criu interrupt: the log file read from its end, the whole of it when needed") {
  char dir[] = "/tmp/cusnap-criu-int-XXXXXX";
  REQUIRE(mkdtemp(dir));
  const std::string path = std::string(dir) + "/dump.log";
  CHECK(criu_dump_killable(path));  // none: nothing holds CRIU back
  std::string filler;
  for (int i = 0; i < 40000; ++i) filler += "(00.142533) Sent msg to daemon 66 0 0\n";
  REQUIRE(filler.size() > (1u << 20));
  // The last mark more than a MiB before the end: still found.
  std::ofstream(path) << kSeized << kInfect << filler;
  CHECK_FALSE(criu_dump_killable(path));
  std::ofstream(path) << kSeized << kInfect << kDaemon << filler;
  CHECK(criu_dump_killable(path));
  std::filesystem::remove_all(dir);
}

TEST_CASE("criu interrupt: a stop asked during an infection waits for the daemon") {
  char dir[] = "/tmp/cusnap-criu-int-XXXXXX";
  REQUIRE(mkdtemp(dir));
  const std::string log = std::string(dir) + "/dump.log";
  const std::string fake = std::string(dir) + "/criu";
  // CRIU infecting a process for a second, then dumping with the daemon.
  std::ofstream(fake) << "#!/bin/sh\nprintf '" << kSeized << kInfect << "' > " << log
                      << "\nsleep 1\nprintf '" << kDaemon << "' >> " << log << "\nexec sleep 30\n";
  chmod(fake.c_str(), 0755);
  CriuInfo c;
  c.path = fake;
  CriuRun run;
  run.args = {"dump"};
  run.log_path = log;
  int before_kill = 0;
  run.before_kill = [&] { ++before_kill; };
  const auto start = std::chrono::steady_clock::now();
  // Asked from the start; granted once the log allows it.
  run.stop_now = [&] {
    return std::chrono::steady_clock::now() - start > std::chrono::milliseconds(100) &&
           criu_dump_killable(log);
  };
  std::string err;
  CHECK_FALSE(run_criu(c, run, &err));
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK_MESSAGE(err == "criu dump was stopped on request (killed)", err);
  CHECK(before_kill == 1);
  CHECK(took >= std::chrono::milliseconds(900));
  CHECK(took < std::chrono::seconds(10));
  std::filesystem::remove_all(dir);
}
