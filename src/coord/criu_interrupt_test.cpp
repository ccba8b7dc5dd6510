#include "coord/criu_interrupt.h"

#include <doctest/doctest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "coord/criu.h"
#include "unit/fake_criu.h"

using namespace cusnap;
using cusnap::testing::FakeCriu;

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

TEST_CASE("criu interrupt: the log file followed as it grows, each byte read once") {
  const FakeCriu fake;
  const std::string path = fake.file("dump.log");
  CHECK(criu_dump_killable(path));  // none: nothing holds CRIU back
  std::string filler;
  for (int i = 0; i < 40000; ++i) filler += "(00.142533) Sent msg to daemon 66 0 0\n";
  REQUIRE(filler.size() > (1u << 20));
  // The last mark more than a MiB before the end: still found.
  std::ofstream(path) << kSeized << kInfect << filler;
  CHECK_FALSE(criu_dump_killable(path));
  std::ofstream(path) << kSeized << kInfect << kDaemon << filler;
  CHECK(criu_dump_killable(path));

  // Followed: each look reads what was added, a mark cut by a look's end
  // included.
  std::ofstream(path) << kSeized;
  CriuDumpLog log(path);
  CHECK(log.killable());
  auto append = [&](const std::string& text) { std::ofstream(path, std::ios::app) << text; };
  append(kInfect);
  CHECK_FALSE(log.killable());
  append("(00.137545) Parasite 30746 has been swit");
  CHECK_FALSE(log.killable());
  append("ched to daemon mode\n");
  CHECK(log.killable());
  append(filler);
  CHECK(log.killable());
  append(std::string(kCure) + "(00.165619) Dumping mm (pi");
  CHECK_FALSE(log.killable());
  append("d: 30746)\n");
  CHECK(log.killable());
  append(kInfect);
  CHECK_FALSE(log.killable());
  // Written anew (shorter): looked at from its start.
  std::ofstream(path) << kSeized;
  CHECK(log.killable());
}

namespace {

/// CRIU infecting a process for `infect` seconds (for ever: 0), then
/// dumping with the daemon; its log at fake's dump.log.
void infecting_criu(const FakeCriu& fake, int infect) {
  const std::string log = fake.file("dump.log");
  std::ostringstream script;
  script << "#!/bin/sh\nprintf '" << kSeized << kInfect << "' > " << log << "\n";
  if (infect == 0)
    script << "exec sleep 30\n";
  else
    script << "sleep " << infect << "\nprintf '" << kDaemon << "' >> " << log
           << "\nexec sleep 30\n";
  fake.set_script(script.str());
}

/// Whether the log at path says the infection has begun.
bool infecting(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str().find(kInfect) != std::string::npos;
}

/// A dump by fake asked to stop 100 ms after `start` once its log says it is
/// infecting (the fake's shell may start late on a loaded machine), whose
/// kill waits for its log (CriuDumpLog) to allow it, at most `grace`.
struct GatedDump {
  CriuRun run;
  CriuDumpLog log;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  GatedDump(const FakeCriu& fake, std::chrono::milliseconds grace) : log(fake.file("dump.log")) {
    run.args = {"dump"};
    run.log_path = fake.file("dump.log");
    run.killable = [this] { return log.killable(); };
    run.kill_grace = grace;
    run.stop_now = [this] {
      return std::chrono::steady_clock::now() - start > std::chrono::milliseconds(100) &&
             infecting(run.log_path);
    };
  }
  GatedDump(const GatedDump&) = delete;
  GatedDump& operator=(const GatedDump&) = delete;
  /// Runs it again from now; false with *err as run_criu.
  bool run_now(const FakeCriu& fake, std::string* err) {
    std::filesystem::remove(run.log_path);  // not the last run's
    log = CriuDumpLog(run.log_path);
    start = std::chrono::steady_clock::now();
    return run_criu(fake.info(), run, err);
  }
  std::chrono::steady_clock::duration took() const {
    return std::chrono::steady_clock::now() - start;
  }
};

}  // namespace

TEST_CASE("criu interrupt: a stop or timeout during an infection waits for the daemon") {
  const FakeCriu fake;
  infecting_criu(fake, 1);
  GatedDump d(fake, std::chrono::seconds(20));
  int before_kill = 0;
  d.run.before_kill = [&] { ++before_kill; };
  std::string err;
  CHECK_FALSE(d.run_now(fake, &err));
  CHECK_MESSAGE(err == "criu dump was stopped on request (killed)", err);
  CHECK(before_kill == 1);
  CHECK(d.took() >= std::chrono::milliseconds(900));
  CHECK(d.took() < std::chrono::seconds(10));

  // The same at the timeout (long enough for the fake's shell to have
  // started; the infection lasts 3 s from there).
  infecting_criu(fake, 3);
  d.run.stop_now = {};
  d.run.timeout = std::chrono::milliseconds(1500);
  CHECK_FALSE(d.run_now(fake, &err));
  CHECK_MESSAGE(err.find("criu dump failed (timed out after 1500 ms and was killed)") == 0, err);
  CHECK(before_kill == 2);
  CHECK(d.took() >= std::chrono::milliseconds(2900));
  CHECK(d.took() < std::chrono::seconds(10));
}

TEST_CASE("criu interrupt: a CRIU hung in an infection is killed once the grace has passed") {
  const FakeCriu fake;
  infecting_criu(fake, 0);
  GatedDump d(fake, std::chrono::milliseconds(600));
  std::string err;
  CHECK_FALSE(d.run_now(fake, &err));
  CHECK_MESSAGE(err == "criu dump was stopped on request (killed)", err);
  CHECK(d.took() >= std::chrono::milliseconds(700));
  CHECK(d.took() < std::chrono::seconds(10));  // not the script's 30 s
}
