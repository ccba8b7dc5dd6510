#include "coord/restore_report.h"

#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include "proto/control.h"
#include "proto/wire.h"

using namespace cusnap;

TEST_CASE("restore report: the --json object of a restore that went well") {
  RestoreSummary s{"job", "/ck", "/run/cusnap/job", 42, {{"criu-restore", 1.5}}, {}};
  const nlohmann::json j = restored_json(s, true);
  CHECK(j.at("ok") == true);
  CHECK(j.at("name") == "job");
  CHECK(j.at("dir") == "/ck");
  CHECK(j.at("pid") == 42);
  CHECK(j.at("runtime_dir") == "/run/cusnap/job");
  CHECK(j.at("phases").size() == 1);
  CHECK(j.at("phases")[0].at("seconds") == 1.5);
  CHECK(j.at("detached") == true);
  CHECK(j.at("gpu_moves").empty());
  CHECK(gpu_moves_text(s).empty());
  s.root_pid = 0;  // not known
  CHECK(restored_json(s, true).at("pid").is_null());
  s.gpu_moves = {{"GPU-a", "GPU-b"}};
  CHECK(restored_json(s, false).at("gpu_moves") ==
        nlohmann::json::parse(R"([{"from": "GPU-a", "to": "GPU-b"}])"));
  CHECK(gpu_moves_text(s) == "cusnap: the job's GPU GPU-a is now GPU GPU-b\n");
  s.gpu_moves_known = false;  // a summary the command made up: not known
  CHECK(restored_json(s, false).at("gpu_moves").is_null());
}

TEST_CASE("restore report: a detached success without a decoded summary is still reported") {
  const RestoreSummary known{"job", "/ck", "/run/cusnap/job", 42, {}, {}};
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

namespace {

/// The two ends of a restore --detach: the background supervisor's and the
/// waiting command's.
struct DetachPair {
  proto::Channel child, parent;
  DetachPair() {
    UniqueFd a, b;
    std::string err;
    REQUIRE(proto::socket_pair(&a, &b, &err));
    child = proto::Channel(std::move(a), std::chrono::seconds(2));
    parent = proto::Channel(std::move(b), std::chrono::seconds(2));
  }
};

}  // namespace

TEST_CASE("restore report: no result from the background restore is an outcome not known") {
  DetachPair p;
  std::string err;
  REQUIRE(p.child.send(proto::kMsgProgress, proto::ProgressEvent{"criu-restore", 1, 2}, &err));
  p.child = proto::Channel();  // the background supervisor ended (killed, or its sends failed)
  int progress = 0, restored = 0;
  const SuperviseOutcome out = await_detached_restore(
      p.parent, [&](const Progress&) { ++progress; }, [&](const RestoreSummary&) { ++restored; },
      "train", "/ck");
  CHECK(progress == 1);
  CHECK(restored == 0);
  CHECK_FALSE(out.detached);
  CHECK(out.exit_code == kExitFailure);  // man cusnap: 1, the outcome not known
  CHECK(out.name == "train");
  // Not a failure: what is known, and how to find out.
  CHECK(out.error.find("the background restore ended without a result") != std::string::npos);
  CHECK(out.error.find("whether job train was restored from /ck is not known") !=
        std::string::npos);
  CHECK(out.error.find("cusnap ps") != std::string::npos);
  CHECK(out.error.find("cusnap inspect train") != std::string::npos);
  // Without a name (a manifest that could not be read): said without one.
  const std::string nameless = detached_outcome_unknown("", "/ck", "closed");
  CHECK(nameless.find("whether the job was restored from /ck is not known") != std::string::npos);
  CHECK(nameless.find("cusnap inspect NAME") != std::string::npos);
}

TEST_CASE("restore report: a message that is no result is an outcome not known too") {
  DetachPair p;
  std::string err;
  REQUIRE(p.child.send(proto::kMsgHello, proto::Empty{}, &err));
  const SuperviseOutcome out = await_detached_restore(p.parent, nullptr, nullptr, "train", "/ck");
  CHECK(out.exit_code == kExitFailure);
  CHECK(out.error.find("is not known") != std::string::npos);
  CHECK(out.error.find("'hello'") != std::string::npos);
}

TEST_CASE("restore report: the background restore's failure and success reach the command") {
  std::string err;
  {
    DetachPair p;
    REQUIRE(p.child.send(proto::kMsgResult,
                         proto::Result{false, kExitBadCheckpoint, "bad checkpoint", ""}, &err));
    const SuperviseOutcome out = await_detached_restore(p.parent, nullptr, nullptr, "j", "/ck");
    CHECK(out.exit_code == kExitBadCheckpoint);
    CHECK(out.error == "bad checkpoint");
    CHECK_FALSE(out.detached);
  }
  {
    DetachPair p;
    const RestoreSummary sent{
        "j2", "/ck", "/run/cusnap/j2", 42, {{"criu-restore", 0.5}}, {{"GPU-a", "GPU-b"}}};
    REQUIRE(p.child.send(proto::kMsgResult, proto::Result{true, kExitOk, "", summary_to_json(sent)},
                         &err));
    RestoreSummary got;
    const SuperviseOutcome out = await_detached_restore(
        p.parent, nullptr, [&](const RestoreSummary& s) { got = s; }, "j", "/ck");
    CHECK(out.error.empty());
    CHECK(out.exit_code == kExitOk);
    CHECK(out.detached);
    CHECK(out.name == "j2");
    CHECK(got.root_pid == 42);
    CHECK(got.runtime_dir == "/run/cusnap/j2");
    REQUIRE(got.phases.size() == 1);
    CHECK(got.phases[0].first == "criu-restore");
    CHECK(got.gpu_moves == sent.gpu_moves);
  }
}
