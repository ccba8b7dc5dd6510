// The free-memory check of the driver's restore (gpu_memory.h) as the
// engine's operations use it: checkpoint and suspend note each CUDA
// process's use before they touch the job; every restore in place (resume,
// roll back, --leave-running, recovery) checks against it through
// driver_resume_all, and cusnap restore against the manifest's record before
// CRIU restores anything.
#include "coord/engine_internal.h"
#include "coord/manifest.h"

namespace cusnap::engine_detail {

namespace {

std::string gpu_use_path(const JobInfo& job) {
  return job.runtime_dir + "/" + kGpuUseFile;
}

}  // namespace

bool note_gpu_use(const JobInfo& job, const std::vector<pid_t>& cuda, const char* margin,
                  Driver* driver, std::string* err) {
  RestoreMemory& rm = driver->restore_memory();
  rm = RestoreMemory{};
  if (!restore_memory_policy(margin, &rm.policy, err)) return false;
  if (cuda.empty()) return true;
  std::vector<GpuMemory> gpus;
  ProcessGpuUse all;
  std::string why;
  if (rm.policy.enabled && !nvml_read(&gpus, &all, &why))
    rm.note = "free device memory will not be checked before a restore: " + why;
  for (pid_t pid : cuda)
    if (auto it = all.find(pid); it != all.end())
      rm.use[pid] = it->second;
    else if (!gpus.empty())
      rm.uncounted.push_back(pid);
  for (const GpuMemory& g : gpus) rm.free_before[g.uuid] = g.free;
  // A resume (perhaps in a guardian) reads it back; an older record must not
  // stand for this job's processes, so it is written even when empty.
  if (!job.runtime_dir.empty() && !write_gpu_use(gpu_use_path(job), rm.use, rm.free_before, &why) &&
      rm.note.empty())
    rm.note = "free device memory will not be checked before a resume: " + why;
  return true;
}

void complete_gpu_use(const JobInfo& job, Driver* driver) {
  RestoreMemory& rm = driver->restore_memory();
  if (rm.uncounted.empty()) return;
  std::vector<GpuMemory> gpus;
  ProcessGpuUse now;
  std::string why;
  if (!nvml_read(&gpus, &now, &why)) return;
  for (const GpuMemory& g : gpus) {
    auto before = rm.free_before.find(g.uuid);
    if (before == rm.free_before.end() || g.free <= before->second) continue;
    uint64_t rise = g.free - before->second, counted = 0;
    for (const auto& [pid, use] : rm.use)
      if (auto it = use.find(g.uuid); it != use.end()) counted += it->second;
    if (rise > counted) rm.use[rm.uncounted.front()][g.uuid] = rise - counted;
  }
  rm.uncounted.clear();
  if (!job.runtime_dir.empty()) write_gpu_use(gpu_use_path(job), rm.use, rm.free_before, &why);
}

bool load_gpu_use(const JobInfo& job, const char* margin, Driver* driver, std::string* err) {
  RestoreMemory& rm = driver->restore_memory();
  rm = RestoreMemory{};
  if (!restore_memory_policy(margin, &rm.policy, err)) return false;
  if (!job.runtime_dir.empty()) read_gpu_use(gpu_use_path(job), &rm.use, &rm.free_before);
  return true;
}

std::map<std::string, std::string> pair_uuid_map(const std::vector<CUcheckpointGpuPair>& pairs) {
  std::map<std::string, std::string> m;
  for (const CUcheckpointGpuPair& p : pairs)
    m[format_gpu_uuid(p.oldUuid)] = format_gpu_uuid(p.newUuid);
  return m;
}

ProcessGpuUse manifest_gpu_use(const Manifest& m) {
  ProcessGpuUse use;
  for (const ManifestProcess& p : m.processes)
    if (!p.gpu_memory.empty()) use[p.pid] = p.gpu_memory;
  return use;
}

}  // namespace cusnap::engine_detail
