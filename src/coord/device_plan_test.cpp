// What plan_device_pairs tells a user whose device map or machine does not
// fit the checkpoint: the GPUs that are here, and no map where none helps.
#include <doctest/doctest.h>

#include "coord/engine_internal.h"
#include "coord/restore_pairs.h"

using namespace cusnap;

namespace {
const char* kA = "GPU-00000000-0000-0000-0000-0000000000a1";
const char* kB = "GPU-00000000-0000-0000-0000-0000000000b1";
const char* kX = "GPU-00000000-0000-0000-0000-0000000000c1";
const char* kY = "GPU-00000000-0000-0000-0000-0000000000d1";
const char* kC = "GPU-00000000-0000-0000-0000-0000000000e1";
}  // namespace

TEST_CASE("device plan: a NEW that is not a GPU here is refused naming this machine's GPUs") {
  using engine_detail::plan_device_pairs;
  const std::vector<GpuDevice> recorded = {{0, "H200", kA, 1}, {1, "H200", kB, 1}};
  // Another machine: its GPUs are not the checkpoint's.
  const std::vector<GpuDevice> here = {{0, "H200", kX, 1}, {1, "H200", kY, 1}};
  std::vector<CUcheckpointGpuPair> pairs;
  std::string err;
  bool gpus_here = false;
  CHECK_FALSE(plan_device_pairs(recorded, {kA, kB}, here, {{"0", "1"}, {"1", "5"}}, &pairs, &err,
                                &gpus_here));
  CHECK(gpus_here);  // the command may see too few GPUs (CUDA_VISIBLE_DEVICES)
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
    bool gpus_here = false;
    CHECK_FALSE(plan_device_pairs(recorded, {kA, kB}, here, map, &pairs, &err, &gpus_here));
    CHECK(gpus_here);
    CHECK(err.find("every one is taken") != std::string::npos);
    CHECK(err.find("--device-map") == std::string::npos);
    CHECK(err.find("used 2 H200 GPUs, this machine has 1") != std::string::npos);
    CHECK(err.find("at least 2 H200 GPUs") != std::string::npos);
  }
}

TEST_CASE("device plan: a GPU of unknown model that is not here must be mapped by the user") {
  using engine_detail::plan_device_pairs;
  // GPU kC was used by a process but not seen by the supervisor: no model.
  const std::vector<GpuDevice> recorded = {{0, "H200", kA, 1}};
  const std::vector<GpuDevice> here = {{0, "H200", kA, 1}, {1, "L4", kX, 1}};
  std::vector<CUcheckpointGpuPair> pairs;
  std::string err;
  bool gpus_here = true;
  CHECK_FALSE(plan_device_pairs(recorded, {kA, kC}, here, {}, &pairs, &err, &gpus_here));
  INFO(err);
  CHECK_FALSE(gpus_here);  // not for want of GPUs here: for want of the model
  CHECK(err.find(std::string("the checkpoint ran on GPU ") + kC +
                 ", which is not here, and does "
                 "not record its model") != std::string::npos);
  CHECK(err.find(std::string("--device-map ") + kC + "=NEW") != std::string::npos);
  // Named by the user: taken as given.
  CHECK(plan_device_pairs(recorded, {kA, kC}, here, {{kC, "1"}}, &pairs, &err, nullptr));
  CHECK(pairs.size() == 2);
  // Here by its UUID: the same GPU, no model needed.
  const std::vector<GpuDevice> with_c = {{0, "H200", kA, 1}, {1, "L4", kC, 1}};
  CHECK(plan_device_pairs(recorded, {kA, kC}, with_c, {}, &pairs, &err, nullptr));
  CHECK(pairs.empty());  // the identity
}

TEST_CASE("device plan: a wrong map is not put down to the GPUs here") {
  using engine_detail::plan_device_pairs;
  const std::vector<GpuDevice> recorded = {{0, "H200", kA, 1}, {1, "H200", kB, 1}};
  const std::vector<GpuDevice> here = {{0, "H200", kA, 1}, {1, "H200", kB, 1}, {2, "A100", kC, 1}};
  std::vector<CUcheckpointGpuPair> pairs;
  using Map = std::map<std::string, std::string>;
  // An OLD the job did not use, two GPUs onto one, another model, one GPU
  // twice; whether NEW sent a GPU where it cannot go (the numbering of this
  // command's GPUs may be why): the second and third.
  const std::vector<std::pair<Map, bool>> cases = {
      {Map{{"7", "0"}}, false},
      {Map{{"0", "1"}}, true},
      {Map{{"0", "2"}}, true},
      {Map{{"0", "1"}, {std::string(kA), "0"}}, false}};
  for (const auto& [map, about_new] : cases) {
    CAPTURE(map.begin()->first);
    std::string err;
    bool gpus_here = true, new_side = !about_new;
    CHECK_FALSE(
        plan_device_pairs(recorded, {kA, kB}, here, map, &pairs, &err, &gpus_here, &new_side));
    CHECK_FALSE(gpus_here);
    CHECK(new_side == about_new);
    CHECK(err.find("this machine has") == std::string::npos);
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

TEST_CASE("device plan: the pair lists each process's restore tries, in order, each once") {
  using namespace engine_detail;
  using Map = std::vector<std::pair<const char*, const char*>>;  // old -> new
  const Map rotate = {{kA, kB}, {kB, kC}, {kC, kA}};
  const Map swap = {{kA, kB}, {kB, kA}};
  struct Row {
    const char* name;
    std::vector<std::string> recorded;      // ManifestProcess::gpus
    GpuUse memory;                          // ManifestProcess::gpu_memory
    Map map;                                // the job's pairs (plan_device_pairs)
    std::vector<std::vector<size_t>> want;  // each try: indexes into map, in order
  };
  // clang-format off
  const Row rows[] = {
      {"one GPU: recorded, memory and the whole map are one list",
       {kA}, {{kA, 4096}}, {{kA, kX}}, {{0}}},
      {"recorded == memory set: that list, then the whole map",
       {kB, kA}, {{kA, 1}, {kB, 1}}, rotate, {{0, 1}, {0, 1, 2}}},
      {"recorded within memory: recorded, memory, whole map",
       {kA}, {{kA, 1}, {kB, 1}}, rotate, {{0}, {0, 1}, {0, 1, 2}}},
      {"memory within recorded: recorded, memory, whole map",
       {kA, kB}, {{kA, 1}, {kB, 0}}, rotate, {{0, 1}, {0}, {0, 1, 2}}},
      {"empty recorded: memory, whole map",
       {}, {{kB, 1}}, rotate, {{1}, {0, 1, 2}}},
      {"nothing recorded, no memory: the whole map",
       {}, {}, rotate, {{0, 1, 2}}},
      {"whole map identical to memory's list: not tried twice",
       {kA}, {{kA, 1}, {kB, 1}}, swap, {{0}, {0, 1}}},
      {"whole map identical to recorded: not tried twice",
       {kB, kA}, {{kB, 1}}, swap, {{0, 1}, {1}}},
      {"a choice naming no paired GPU is skipped",
       {kX}, {{kY, 1}, {kB, 1}}, rotate, {{1}, {0, 1, 2}}},
      {"identity map (no pairs): one restore without pairs",
       {kA, kB}, {{kA, 1}}, {}, {{}}},
      {"a GPU onto itself is a pair like the others",
       {kA}, {{kA, 1}, {kB, 1}}, {{kA, kA}, {kB, kC}}, {{0}, {0, 1}}},
  };
  // clang-format on
  for (const Row& r : rows) {
    CAPTURE(r.name);
    Manifest m;
    ManifestProcess p;
    p.pid = 10;
    p.uses_cuda = true;
    p.gpus = r.recorded;
    p.gpu_memory = r.memory;
    m.processes = {p};
    std::vector<CUcheckpointGpuPair> pairs(r.map.size());
    for (size_t i = 0; i < r.map.size(); ++i) {
      REQUIRE(parse_gpu_uuid(r.map[i].first, &pairs[i].oldUuid));
      REQUIRE(parse_gpu_uuid(r.map[i].second, &pairs[i].newUuid));
    }
    const GpuChoices c = gpu_choices(m);
    const auto tries =
        restore_pair_tries(pairs, c.count(10) ? c.at(10) : GpuChoices::mapped_type{});
    REQUIRE(tries.size() == r.want.size());
    for (size_t t = 0; t < tries.size(); ++t) {
      CAPTURE(t);
      REQUIRE(tries[t].size() == r.want[t].size());
      for (size_t k = 0; k < tries[t].size(); ++k) {
        CAPTURE(k);
        const CUcheckpointGpuPair& want = pairs[r.want[t][k]];
        CHECK(format_gpu_uuid(tries[t][k].oldUuid) == format_gpu_uuid(want.oldUuid));
        CHECK(format_gpu_uuid(tries[t][k].newUuid) == format_gpu_uuid(want.newUuid));
      }
    }
  }
  // A process without choices (not in the manifest's CUDA processes) is
  // given every pair, once.
  std::vector<CUcheckpointGpuPair> pairs(2);
  REQUIRE(parse_gpu_uuid(kA, &pairs[0].oldUuid));
  REQUIRE(parse_gpu_uuid(kB, &pairs[0].newUuid));
  REQUIRE(parse_gpu_uuid(kB, &pairs[1].oldUuid));
  REQUIRE(parse_gpu_uuid(kA, &pairs[1].newUuid));
  const auto all = restore_pair_tries(pairs, {});
  REQUIRE(all.size() == 1);
  CHECK(all[0].size() == 2);
}
