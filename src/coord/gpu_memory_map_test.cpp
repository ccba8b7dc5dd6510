// The margin's cap (each GPU's free memory before the checkpoint) through a
// device map that moves a GPU onto one the job did not use.
#include <doctest/doctest.h>

#include "coord/gpu_memory.h"

using namespace cusnap;

namespace {
const std::string kUsed = "GPU-00000000-0000-0000-0000-00000000000a";
const std::string kOther = "GPU-00000000-0000-0000-0000-00000000000b";
}  // namespace

TEST_CASE("gpu memory: a GPU the map moves one onto carries the moved GPU's value") {
  // The job ran on one GPU with 5 bytes to spare; the machine's other GPU,
  // unused by the job, had 6000 free. Restored onto that other GPU, the cap
  // is the job's own 5, whichever UUID sorts first.
  for (const auto& [from, to] : {std::pair{kUsed, kOther}, std::pair{kOther, kUsed}}) {
    CAPTURE(from);
    const GpuUse free_before = {{from, 5}, {to, 6000}};
    const GpuUse cap = map_gpus(free_before, {{from, to}});
    CHECK(cap.size() == 1);
    CHECK(cap.at(to) == 5);
  }
  // A GPU neither moved nor moved onto keeps its value.
  const GpuUse cap = map_gpus({{kUsed, 5}, {kOther, 6}}, {});
  CHECK(cap.at(kUsed) == 5);
  CHECK(cap.at(kOther) == 6);
}
