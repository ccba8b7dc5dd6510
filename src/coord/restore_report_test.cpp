#include "coord/restore_report.h"

#include <doctest/doctest.h>

using namespace cusnap;

TEST_CASE("restore report: the --json object of a restore that went well") {
  RestoreSummary s{"job", "/ck", "/run/cusnap/job", 42, {{"criu-restore", 1.5}}};
  const nlohmann::json j = restored_json(s, true);
  CHECK(j.at("ok") == true);
  CHECK(j.at("name") == "job");
  CHECK(j.at("dir") == "/ck");
  CHECK(j.at("pid") == 42);
  CHECK(j.at("runtime_dir") == "/run/cusnap/job");
  CHECK(j.at("phases").size() == 1);
  CHECK(j.at("phases")[0].at("seconds") == 1.5);
  CHECK(j.at("detached") == true);
  s.root_pid = 0;  // not known
  CHECK(restored_json(s, true).at("pid").is_null());
}

TEST_CASE("restore report: a detached success without a decoded summary is still reported") {
  const RestoreSummary known{"job", "/ck", "/run/cusnap/job", 42, {}};
  SuperviseOutcome detached;
  detached.detached = true;
  // on_restored reported it: nothing more.
  CHECK_FALSE(summary_left_to_report(detached, true, known).has_value());
  // The background restore succeeded, but its summary could not be decoded
  // (on_restored never ran): what the command knows is reported, once.
  const auto left = summary_left_to_report(detached, false, known);
  REQUIRE(left.has_value());
  CHECK(left->name == "job");
  CHECK(left->root_pid == 42);
  // A failure is reported as one, by the command.
  SuperviseOutcome failed;
  failed.exit_code = kExitFailure;
  failed.error = "the background restore ended without a result";
  CHECK_FALSE(summary_left_to_report(failed, false, known).has_value());
  // In the foreground the job's status ends the command; the summary came
  // before it ran.
  CHECK_FALSE(summary_left_to_report(SuperviseOutcome{}, false, known).has_value());
}
