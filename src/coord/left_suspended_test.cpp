// The left-suspended marker (left_suspended.cpp): what a job left suspended
// by a failed roll back carries, what checkpoint and suspend refuse, what
// cusnap inspect and ps show of it.
#include <doctest/doctest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "coord/engine.h"
#include "coord/engine_internal.h"

using namespace cusnap;
namespace fs = std::filesystem;

TEST_CASE("left suspended: the marker names the saved state and refuses until cleared") {
  using namespace engine_detail;
  char tmpl[] = "/tmp/cusnap-left-XXXXXX";
  REQUIRE(mkdtemp(tmpl));
  const std::string base = tmpl;
  JobInfo job;
  job.name = "j";
  job.runtime_dir = base + "/run";
  REQUIRE(fs::create_directory(job.runtime_dir));
  std::string err;
  LeftSuspended left;
  CHECK_FALSE(read_left_suspended(job, &left));
  CHECK(left_suspended_details(job).empty());
  CHECK(left_suspended_state(job) == LeftSuspendedState::kNo);
  CHECK(refuse_when_left_suspended(job, "checkpoint", &err));

  SUBCASE("nothing saved: the suspend's own directory, nothing removed") {
    const std::string msg =
        leave_suspended(job, base + "/ckpt", true, "checkpoint", "\ndriver lock phase: timeout\n");
    CHECK(msg.find("run cusnap resume j to bring it back") != std::string::npos);
    CHECK(msg.find("shared memory") == std::string::npos);
    REQUIRE(read_left_suspended(job, &left));
    CHECK(left.operation == "checkpoint");
    CHECK(left.reason == "driver lock phase: timeout");  // trimmed
    CHECK(left.since.size() == 20);                      // 2026-12-02T09:15:12Z
    CHECK(left.since.back() == 'Z');
    CHECK_FALSE(left.restore_refused);
    CHECK(left_suspended_state(job) == LeftSuspendedState::kResumable);
    // What inspect shows of it.
    nlohmann::json shown = nlohmann::json::parse(left_suspended_details(job));
    CHECK(shown["operation"] == "checkpoint");
    CHECK(shown["reason"] == "driver lock phase: timeout");
    CHECK(shown["since"] == left.since);
    CHECK(shown["saved"] == false);
    CHECK(shown["state_dir"] == "");
    // A later restore refused by the driver: noted, the rest kept.
    const std::string since = left.since;
    note_restore_refused(job);
    REQUIRE(read_left_suspended(job, &left));
    CHECK(left.restore_refused);
    CHECK(left_suspended_state(job) == LeftSuspendedState::kRestoreRefused);
    CHECK(left.since == since);
    CHECK(left.reason == "driver lock phase: timeout");
    CHECK(left.operation == "checkpoint");
    const std::string refused =
        leave_suspended(job, base + "/ckpt", true, "checkpoint", std::string(10000, 'x'), true);
    CHECK(refused.find("the driver will not restore its GPU state: stop it") != std::string::npos);
    CHECK(refused.find("run cusnap resume") == std::string::npos);
    REQUIRE(read_left_suspended(job, &left));
    CHECK(left.restore_refused);
    CHECK(left.reason.size() == 4096 + 3);  // cut short, "..."
    CHECK(left.state_dir == suspend_state_dir(job));
    CHECK_FALSE(left.remove_dir);
    // Checkpoint and suspend refuse it without sending the user to resume.
    CHECK_FALSE(refuse_when_left_suspended(job, "checkpoint", &err));
    CHECK(err.find("job j cannot be checkpointed: the driver refused to restore its GPU state "
                   "after a failed checkpoint, and will not restore it again: stop it") !=
          std::string::npos);
    CHECK(err.find("cusnap resume") == std::string::npos);
  }
  SUBCASE("saved records: their directory, removed once empty") {
    const std::string dir = base + "/ckpt";
    REQUIRE(fs::create_directories(dir + "/shim"));
    REQUIRE(fs::create_directories(dir + "/shared"));
    { std::ofstream(dir + "/shim/42.records") << "x"; }
    { std::ofstream(dir + "/shared/42-1.bin") << "y"; }
    const std::string msg = leave_suspended(job, dir, true, "checkpoint", "dump failed");
    CHECK(msg.find("its shared memory saved in " + dir) != std::string::npos);
    CHECK(nlohmann::json::parse(left_suspended_details(job))["state_dir"] == dir);
    REQUIRE(read_left_suspended(job, &left));
    CHECK(left.state_dir == dir);
    CHECK(left.remove_dir);
    CHECK_FALSE(refuse_when_left_suspended(job, "suspend", &err));
    CHECK(err.find("cannot be suspended now: run cusnap resume j first") != std::string::npos);
    clear_left_suspended(job, left);
    CHECK_FALSE(fs::exists(dir));
    CHECK_FALSE(read_left_suspended(job, &left));
    CHECK(refuse_when_left_suspended(job, "checkpoint", &err));
  }
  SUBCASE("a directory the user made stays, and so does what else it holds") {
    const std::string dir = base + "/mine";
    REQUIRE(fs::create_directories(dir + "/shim"));
    { std::ofstream(dir + "/shim/7.records") << "x"; }
    { std::ofstream(dir + "/notes.txt") << "keep"; }
    leave_suspended(job, dir, false, "checkpoint", "");
    REQUIRE(read_left_suspended(job, &left));
    clear_left_suspended(job, left);
    CHECK_FALSE(fs::exists(dir + "/shim"));
    CHECK(fs::exists(dir + "/notes.txt"));
  }
  SUBCASE("a marker that is a link is not followed") {
    { std::ofstream(base + "/elsewhere") << "{\"state_dir\":\"/etc\"}"; }
    REQUIRE(symlink((base + "/elsewhere").c_str(), (job.runtime_dir + "/left-suspended").c_str()) ==
            0);
    CHECK_FALSE(read_left_suspended(job, &left));
  }
  SUBCASE("a marker that cannot be written is kept by this process") {
    // The temporary file cannot be made (a directory stands there), as on a
    // full disk. Before: resume then found nothing left suspended and
    // reported the job running, its gates closed over released memory.
    REQUIRE(fs::create_directory(job.runtime_dir + "/left-suspended.tmp"));
    const std::string dir = base + "/ckpt";
    REQUIRE(fs::create_directories(dir + "/shim"));
    { std::ofstream(dir + "/shim/42.records") << "x"; }
    const std::string msg = leave_suspended(job, dir, true, "checkpoint", "dump failed");
    CHECK(msg.find("run cusnap resume j to bring it back") != std::string::npos);
    CHECK(msg.find("cusnap could not note it on disk (writing " + job.runtime_dir +
                   "/left-suspended: ") != std::string::npos);
    CHECK_FALSE(fs::exists(job.runtime_dir + "/left-suspended"));
    REQUIRE(read_left_suspended(job, &left));
    CHECK(left.state_dir == dir);
    CHECK(left.saved);
    CHECK_FALSE(refuse_when_left_suspended(job, "checkpoint", &err));
    CHECK(left_suspended_state(job) == LeftSuspendedState::kResumable);
    note_restore_refused(job);  // written nowhere either: kept
    REQUIRE(read_left_suspended(job, &left));
    CHECK(left.restore_refused);
    // Kept in memory wins over an older file there.
    { std::ofstream(job.runtime_dir + "/left-suspended") << "{\"state_dir\":\"/elsewhere\"}"; }
    REQUIRE(read_left_suspended(job, &left));
    CHECK(left.restore_refused);
    CHECK(left.state_dir == dir);
    fs::remove(job.runtime_dir + "/left-suspended");
    clear_left_suspended(job, left);
    CHECK_FALSE(read_left_suspended(job, &left));
    // Once the file can be written, it is the file again.
    fs::remove(job.runtime_dir + "/left-suspended.tmp");
    leave_suspended(job, dir, true, "checkpoint", "dump failed");
    CHECK(fs::exists(job.runtime_dir + "/left-suspended"));
    CHECK_FALSE(fs::exists(job.runtime_dir + "/left-suspended.tmp"));
    REQUIRE(read_left_suspended(job, &left));
    clear_left_suspended(job, left);
    CHECK_FALSE(read_left_suspended(job, &left));
  }
  SUBCASE("an unreadable marker still refuses, pointing at the suspend's directory") {
    { std::ofstream(job.runtime_dir + "/left-suspended") << "not json"; }
    REQUIRE(read_left_suspended(job, &left));
    CHECK(left.state_dir == suspend_state_dir(job));
    CHECK_FALSE(refuse_when_left_suspended(job, "checkpoint", &err));
  }
  fs::remove_all(base);
}
