// Collective ranks that share one GPU cannot come back from the driver's
// restore: measured on an H200 (driver 580.159.04), a restored context is no
// longer preempted for another process's context on the same GPU, so a rank's
// collective kernel that spins waiting for a rank on the same GPU is never
// switched out; the driver gives up with Xid 109 (CTX SWITCH TIMEOUT) and the
// kernel fails with CUDA_ERROR_LAUNCH_FAILED (docs/design.md "Ranks that share
// a GPU"). The bare driver (no cusnap) fails the same way after suspend and
// resume. So a checkpoint or suspend of such a job is refused before anything
// changes, unless CUSNAP_ALLOW_RANKS_SHARING_GPU=1 (in the environment of the
// command, or of the job's supervisor).
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace cusnap {

/// Whether two processes launched collectives on one GPU; *what then names
/// the GPU and two of the processes. devices: per process, the GPUs of its
/// collective launches.
bool ranks_share_gpu(const std::map<pid_t, std::vector<std::string>>& devices, std::string* what);

/// The value of CUSNAP_ALLOW_RANKS_SHARING_GPU: "1" lets such a job through;
/// nullptr, empty or "0" refuses it; anything else is an error (*err).
bool ranks_sharing_gpu_allowed(const char* value, bool* allowed, std::string* err);

}  // namespace cusnap
