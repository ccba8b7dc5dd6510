// What plan_device_pairs tells a user whose device map or machine does not
// fit the checkpoint: the GPUs that are here, and no map where none helps.
#include <doctest/doctest.h>

#include "coord/engine_internal.h"

using namespace cusnap;

namespace {
const char* kA = "GPU-00000000-0000-0000-0000-0000000000a1";
const char* kB = "GPU-00000000-0000-0000-0000-0000000000b1";
const char* kX = "GPU-00000000-0000-0000-0000-0000000000c1";
const char* kY = "GPU-00000000-0000-0000-0000-0000000000d1";
}  // namespace

TEST_CASE("device plan: a NEW that is not a GPU here is refused naming this machine's GPUs") {
  using engine_detail::plan_device_pairs;
  const std::vector<GpuDevice> recorded = {{0, "H200", kA, 1}, {1, "H200", kB, 1}};
  // Another machine: its GPUs are not the checkpoint's.
  const std::vector<GpuDevice> here = {{0, "H200", kX, 1}, {1, "H200", kY, 1}};
  std::vector<CUcheckpointGpuPair> pairs;
  std::string err;
  CHECK_FALSE(plan_device_pairs(recorded, {kA, kB}, here, {{"0", "1"}, {"1", "5"}}, &pairs, &err));
  CHECK(err.find("not a GPU here") != std::string::npos);
  CHECK(err.find("'1=5'") != std::string::npos);
  // The GPUs NEW may name are this machine's, not those of the checkpoint
  // that cusnap inspect lists.
  CHECK(err.find(std::string("0 (") + kX + ", H200)") != std::string::npos);
  CHECK(err.find(std::string("1 (") + kY + ", H200)") != std::string::npos);
  CHECK(err.find("cusnap inspect") == std::string::npos);
}

TEST_CASE("device plan: more GPUs used than this machine has of the model: no map suggested") {
  using engine_detail::plan_device_pairs;
  const std::vector<GpuDevice> recorded = {{0, "H200", kA, 1}, {1, "H200", kB, 1}};
  const std::vector<GpuDevice> here = {{0, "H200", kX, 1}, {1, "A100", kY, 1}};
  std::vector<CUcheckpointGpuPair> pairs;
  std::string err;
  // Without a map and with one: two H200 used, one here. A map sends each
  // GPU onto a different one of the same model, so none can help.
  for (const std::map<std::string, std::string>& map :
       {std::map<std::string, std::string>{}, {{"0", "0"}}}) {
    CAPTURE(map.size());
    err.clear();
    CHECK_FALSE(plan_device_pairs(recorded, {kA, kB}, here, map, &pairs, &err));
    CHECK(err.find("every one is taken") != std::string::npos);
    CHECK(err.find("--device-map") == std::string::npos);
    CHECK(err.find("used 2 H200 GPUs, this machine has 1") != std::string::npos);
    CHECK(err.find("at least 2 H200 GPUs") != std::string::npos);
  }
}

TEST_CASE("device plan: each process is offered the pairs of its own GPUs first") {
  using namespace engine_detail;
  Manifest m;
  ManifestProcess sees_both, sees_one, no_cuda;
  sees_both.pid = 10;
  sees_both.uses_cuda = true;
  sees_both.gpus = {kB, kA};
  sees_both.gpu_memory = {{kA, 4096}, {kB, 0}};
  sees_one.pid = 11;
  sees_one.uses_cuda = true;
  sees_one.gpus = {kB};
  sees_one.gpu_memory = {{kB, 4096}};
  no_cuda.pid = 12;
  m.processes = {sees_both, sees_one, no_cuda};
  const GpuChoices c = gpu_choices(m);
  // The GPUs it has, then those it held memory on, each once.
  REQUIRE(c.count(10) == 1);
  CHECK(c.at(10) == std::vector<std::vector<std::string>>{{kA, kB}, {kA}});
  CHECK(c.at(11) == std::vector<std::vector<std::string>>{{kB}});
  CHECK(c.count(12) == 0);
  std::vector<CUcheckpointGpuPair> pairs(2);
  REQUIRE(parse_gpu_uuid(kA, &pairs[0].oldUuid));
  REQUIRE(parse_gpu_uuid(kB, &pairs[0].newUuid));
  REQUIRE(parse_gpu_uuid(kB, &pairs[1].oldUuid));
  REQUIRE(parse_gpu_uuid(kA, &pairs[1].newUuid));
  const auto mine = pairs_of(pairs, {kB});
  REQUIRE(mine.size() == 1);
  CHECK(format_gpu_uuid(mine[0].oldUuid) == kB);
  CHECK(format_gpu_uuid(mine[0].newUuid) == kA);
  CHECK(pairs_of(pairs, {kA, kB}).size() == 2);
  CHECK(pairs_of(pairs, {kX}).empty());
}
