// The pair lists a process's driver restore is offered onto other GPUs, in
// the order to try them (driver_resume_all): a pure function, so that its
// order and its duplicates are tested apart from the driver.
#pragma once

#include <cuda.h>

#include <string>
#include <vector>

namespace cusnap::engine_detail {

/// The pair lists to give one process's driver restore, one after another
/// while the driver refuses them INVALID_VALUE: the pairs of each of its GPU
/// choices (gpu_choices: the GPUs recorded for it, then those it held memory
/// on) that names any old GPU of `pairs`, then every pair. Each list comes
/// once: two lists are one when they hold the pairs of the same set of old
/// GPUs. Without pairs (every GPU restores onto itself) it is one empty list.
std::vector<std::vector<CUcheckpointGpuPair>> restore_pair_tries(
    const std::vector<CUcheckpointGpuPair>& pairs,
    const std::vector<std::vector<std::string>>& choices);

}  // namespace cusnap::engine_detail
