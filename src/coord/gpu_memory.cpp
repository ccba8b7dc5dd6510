#include "coord/gpu_memory.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>

#include "cudaapi/nvml_table.h"
#include "proto/env_settings.h"
#include "proto/unique_fd.h"

namespace cusnap {

namespace {

/// NVML's functions, resolved once per process; the library stays loaded
/// (nvmlInit and nvmlShutdown pair around each read).
struct NvmlApi : NvmlTable {
  std::string path, error;

  std::string name(nvmlReturn_t r) const {
    const char* s = error_string ? error_string(r) : nullptr;
    return std::string(s && *s ? s : "NVML error") + " (" + std::to_string(r) + ")";
  }
};

const NvmlApi& nvml_api() {
  static NvmlApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = std::getenv("CUSNAP_LIBNVML");
    api.path = env && *env ? env : "libnvidia-ml.so.1";
    void* h = dlopen(api.path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = dlerror();
      api.error = "cannot load NVML (" + api.path + "): " + (e ? e : "unknown error");
      return;
    }
    if (const char* missing = api.resolve(h))
      api.error = "NVML (" + api.path + ") lacks " + missing;
  });
  return api;
}

/// Bytes in MiB, rounded to the nearest (up to 2^44 MiB for 2^64 - 1: no wrap).
std::string mib(uint64_t b) {
  return std::to_string((b >> 20) + ((b >> 19) & 1)) + " MiB";
}

/// a + b, at most 2^64 - 1.
uint64_t saturated_sum(uint64_t a, uint64_t b) {
  return b > ~a ? ~uint64_t(0) : a + b;
}

}  // namespace

bool nvml_read(std::vector<GpuMemory>* gpus, ProcessGpuUse* use, std::string* err) {
  const NvmlApi& api = nvml_api();
  if (!api.init) {
    *err = api.error;
    return false;
  }
  nvmlReturn_t r = api.init();
  if (r != NVML_SUCCESS) {
    *err = "nvmlInit_v2 failed: " + api.name(r);
    return false;
  }
  gpus->clear();
  use->clear();
  unsigned n = 0;
  r = api.count(&n);
  for (unsigned i = 0; r == NVML_SUCCESS && i < n; ++i) {
    nvmlDevice_t dev = nullptr;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
    nvmlMemory_t mem{};
    if ((r = api.by_index(i, &dev)) != NVML_SUCCESS ||
        (r = api.uuid(dev, uuid, sizeof uuid)) != NVML_SUCCESS ||
        (r = api.memory(dev, &mem)) != NVML_SUCCESS) {
      *err = "NVML, GPU " + std::to_string(i) + ": " + api.name(r);
      break;
    }
    uuid[sizeof uuid - 1] = 0;
    gpus->push_back({i, uuid, mem.total, mem.free});
    // The list can grow between the two calls: ask again while it is short.
    // A GPU whose processes cannot be listed gives no counts.
    std::vector<nvmlProcessInfo_t> procs(16);
    unsigned count = 0;
    nvmlReturn_t pr = NVML_ERROR_INSUFFICIENT_SIZE;
    for (int tries = 0; tries < 4 && pr == NVML_ERROR_INSUFFICIENT_SIZE; ++tries) {
      count = unsigned(procs.size());
      pr = api.processes(dev, &count, procs.data());
      if (pr == NVML_ERROR_INSUFFICIENT_SIZE) procs.resize(size_t(count) + 16);
    }
    if (pr != NVML_SUCCESS) count = 0;
    for (size_t k = 0; k < std::min<size_t>(count, procs.size()); ++k) {
      const nvmlProcessInfo_t& p = procs[k];
      if (p.pid > 0 && p.usedGpuMemory != NVML_VALUE_NOT_AVAILABLE)
        (*use)[pid_t(p.pid)][uuid] = saturated_sum((*use)[pid_t(p.pid)][uuid], p.usedGpuMemory);
    }
  }
  if (r != NVML_SUCCESS && err->empty()) *err = "nvmlDeviceGetCount_v2 failed: " + api.name(r);
  api.shutdown();
  return r == NVML_SUCCESS;
}

bool restore_memory_policy(const char* value, RestoreMemoryPolicy* out, std::string* err) {
  *out = RestoreMemoryPolicy{};
  if (!value || !*value) return true;
  // The grammar launch and restore check it by (proto/env_settings.h).
  bool off = false;
  uint64_t margin = 0;
  if (!proto::parse_memory_margin(value, &off, &margin))
    return proto::text_setting_checked(proto::kRestoreMemoryMargin, value, err);
  out->enabled = !off;
  if (!off) out->margin = margin;
  return true;
}

GpuUse restore_need(const ProcessGpuUse& use, const std::vector<pid_t>& pids,
                    const std::map<std::string, std::string>& uuid_map) {
  GpuUse need;
  for (pid_t pid : pids) {
    auto it = use.find(pid);
    if (it == use.end()) continue;
    for (const auto& [uuid, bytes] : it->second) {
      auto m = uuid_map.find(uuid);
      uint64_t& sum = need[m == uuid_map.end() ? uuid : m->second];
      sum = saturated_sum(sum, bytes);
    }
  }
  return need;
}

GpuUse map_gpus(const GpuUse& v, const std::map<std::string, std::string>& uuid_map) {
  GpuUse out;
  // The GPUs the map moves first: a GPU it moves one onto carries that one's
  // value, not the value its own entry had (a GPU the job did not use, which
  // the map leaves out), whichever UUID sorts first.
  for (const auto& [uuid, bytes] : v)
    if (auto m = uuid_map.find(uuid); m != uuid_map.end()) out[m->second] = bytes;
  for (const auto& [uuid, bytes] : v)
    if (!uuid_map.count(uuid)) out.emplace(uuid, bytes);
  return out;
}

bool restore_memory_fits(const GpuUse& need, const RestoreMemoryPolicy& policy,
                         const GpuUse& margin_cap, std::string* why, std::string* note) {
  if (!policy.enabled || need.empty()) return true;
  std::vector<GpuMemory> gpus;
  ProcessGpuUse now;
  std::string err;
  if (!nvml_read(&gpus, &now, &err)) {
    if (note) *note = "free device memory not checked before the restore: " + err;
    return true;
  }
  std::string shortfall;
  for (const auto& [uuid, bytes] : need) {
    const GpuMemory* g = nullptr;
    for (const GpuMemory& x : gpus)
      if (x.uuid == uuid) g = &x;
    if (!g) continue;  // the restore itself names a missing GPU
    uint64_t margin = policy.margin;
    if (auto cap = margin_cap.find(uuid); cap != margin_cap.end())
      margin = std::min(margin, cap->second);
    if (g->free >= bytes && g->free - bytes >= margin) continue;
    if (!shortfall.empty()) shortfall += "; ";
    shortfall += "GPU " + std::to_string(g->index) + " (" + uuid + ") has " + mib(g->free) +
                 " free, the job needs " + mib(bytes) + " there and a margin of " + mib(margin);
  }
  if (shortfall.empty()) return true;
  *why = "not enough free device memory for the driver's restore: " + shortfall +
         ". A restore tried without it loses the job's GPU state for good, so it was not "
         "tried. Free memory on the GPU (nvidia-smi lists its processes), or set " +
         kRestoreMarginSetting + " lower" + policy.origin + ".";
  return false;
}

namespace {

bool gpu_values(const nlohmann::json& j, GpuUse* out) {
  if (!j.is_object()) return false;
  for (const auto& [uuid, bytes] : j.items()) {
    if (!uuid.starts_with("GPU-") || !bytes.is_number_unsigned()) return false;
    (*out)[uuid] = bytes.get<uint64_t>();
  }
  return true;
}

}  // namespace

bool write_gpu_use(const std::string& path, const ProcessGpuUse& use, const GpuUse& free,
                   std::string* err) {
  nlohmann::json procs = nlohmann::json::object();
  for (const auto& [pid, gpus] : use) procs[std::to_string(pid)] = gpus;
  const nlohmann::json j = {{"processes", procs}, {"free", free}};
  const std::string text = j.dump() + "\n", tmp = path + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (fd && ::write(fd.get(), text.data(), text.size()) == ssize_t(text.size()) &&
      ::fsync(fd.get()) == 0 && ::rename(tmp.c_str(), path.c_str()) == 0)
    return true;
  *err = "writing " + path + ": " + std::strerror(errno);
  ::unlink(tmp.c_str());
  return false;
}

bool read_gpu_use(const std::string& path, ProcessGpuUse* use, GpuUse* free) {
  use->clear();
  free->clear();
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return false;
  std::string text;
  char buf[4096];
  for (ssize_t r; (r = ::read(fd.get(), buf, sizeof buf)) != 0;) {
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 || text.size() > (1u << 20)) return false;
    text.append(buf, size_t(r));
  }
  bool ok = true;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    if (!j.is_object() || !j.contains("processes") || !j["processes"].is_object()) return false;
    ok = !j.contains("free") || gpu_values(j["free"], free);
    for (const auto& [key, gpus] : j["processes"].items()) {
      if (!ok) break;
      char* end = nullptr;
      const long pid = std::strtol(key.c_str(), &end, 10);
      GpuUse g;
      if (key.empty() || *end || pid <= 0 || pid > (1l << 22) || !gpu_values(gpus, &g)) {
        ok = false;
        break;
      }
      (*use)[pid_t(pid)] = g;
    }
  } catch (const std::exception&) {
    ok = false;
  }
  if (!ok) {
    use->clear();
    free->clear();
  }
  return ok;
}

}  // namespace cusnap
