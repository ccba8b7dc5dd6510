#include "coord/restore_pairs.h"

#include <algorithm>
#include <set>

#include "coord/engine_internal.h"

namespace cusnap::engine_detail {

std::vector<std::vector<CUcheckpointGpuPair>> restore_pair_tries(
    const std::vector<CUcheckpointGpuPair>& pairs,
    const std::vector<std::vector<std::string>>& choices) {
  std::vector<std::vector<CUcheckpointGpuPair>> tries;
  std::vector<std::set<std::string>> tried;  // the old GPUs of each of tries
  auto add = [&](std::vector<CUcheckpointGpuPair> list) {
    std::set<std::string> olds;
    for (const CUcheckpointGpuPair& p : list) olds.insert(format_gpu_uuid(p.oldUuid));
    if (std::find(tried.begin(), tried.end(), olds) != tried.end()) return;
    tried.push_back(std::move(olds));
    tries.push_back(std::move(list));
  };
  if (!pairs.empty())
    for (const std::vector<std::string>& gpus : choices)
      if (auto mine = pairs_of(pairs, gpus); !mine.empty()) add(std::move(mine));
  add(pairs);
  return tries;
}

}  // namespace cusnap::engine_detail
