#include "coord/rank_gpus.h"

namespace cusnap {

bool ranks_share_gpu(const std::map<pid_t, std::vector<std::string>>& devices, std::string* what) {
  std::map<std::string, pid_t> first;  // GPU -> the first process seen on it
  for (const auto& [pid, gpus] : devices)
    for (const std::string& gpu : gpus) {
      auto [it, fresh] = first.emplace(gpu, pid);
      if (fresh || it->second == pid) continue;
      *what = "processes " + std::to_string(it->second) + " and " + std::to_string(pid) +
              " both run collective kernels (NCCL ranks) on GPU " + gpu;
      return true;
    }
  return false;
}

bool ranks_sharing_gpu_allowed(const char* value, bool* allowed, std::string* err) {
  const std::string v = value ? value : "";
  if (v.empty() || v == "0") {
    *allowed = false;
    return true;
  }
  if (v == "1") {
    *allowed = true;
    return true;
  }
  *err =
      "CUSNAP_ALLOW_RANKS_SHARING_GPU=\"" + v +
      "\" is neither 1 nor 0: set it to 1 to checkpoint ranks that share a GPU anyway, or unset it";
  return false;
}

}  // namespace cusnap
