// Free device memory before a driver restore. On the H200 a restore that
// finds the GPU's memory taken fails CUDA_ERROR_OUT_OF_MEMORY and the driver
// never restores that process again (docs/design.md section 1): one try
// without the memory loses the job. So before every restore the coordinator
// compares each GPU's free memory (NVML) with what the job's processes used
// there before their suspend (NVML's per-process count, noted while they
// ran), plus a margin, and does not try when it falls short.
//
// NVML (libnvidia-ml.so.1, or $CUSNAP_LIBNVML) is dlopen'ed like the driver;
// where it is missing, nothing is known and nothing is refused.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "proto/control.h"

namespace cusnap {

/// GPU UUID ("GPU-...") -> bytes.
using GpuUse = std::map<std::string, uint64_t>;
/// Each process's use, as NVML counted it while the process ran.
using ProcessGpuUse = std::map<pid_t, GpuUse>;
/// More device memory than any GPU has (1 PiB; the largest hold some
/// hundred GiB): a manifest's count beyond it, alone or added up over a
/// GPU's processes, is refused (manifest.h). Sums here saturate all the same.
inline constexpr uint64_t kMaxGpuMemoryBytes = uint64_t(1) << 50;

struct GpuMemory {
  unsigned index = 0;
  std::string uuid;
  uint64_t total = 0, free = 0;
};

/// What NVML says now: every GPU's memory, and each compute process's use
/// (processes NVML cannot count are left out). False with *err naming the
/// library or the call when NVML cannot be loaded or fails.
bool nvml_read(std::vector<GpuMemory>* gpus, ProcessGpuUse* use, std::string* err);

/// The check's setting, CUSNAP_RESTORE_MEMORY_MARGIN: a size (bytes, or a
/// number followed by K, M or G) kept free above the job's use; "off" turns
/// the check off. Default 256M (on the H200 a 4614 MiB process restored with
/// 64 MiB to spare and failed with 1 MiB short: docs/benchmarks.md).
inline constexpr const char* kRestoreMarginSetting = "CUSNAP_RESTORE_MEMORY_MARGIN";
inline constexpr uint64_t kDefaultRestoreMargin = 256ull << 20;
struct RestoreMemoryPolicy {
  bool enabled = true;
  uint64_t margin = kDefaultRestoreMargin;
  /// Where the setting's value came from, for the advice of a refusal: empty,
  /// or a clause after its name (settings.h, setting_origin).
  std::string origin;
};
/// Parses the setting's value (nullptr or empty: the default); false with
/// *err for anything else.
bool restore_memory_policy(const char* value, RestoreMemoryPolicy* out, std::string* err);

/// What the processes of `pids` need per GPU, their UUIDs mapped through
/// uuid_map (old -> new; absent: the same GPU). Processes without a count
/// add nothing; a sum beyond 2^64 - 1 bytes stays there.
GpuUse restore_need(const ProcessGpuUse& use, const std::vector<pid_t>& pids,
                    const std::map<std::string, std::string>& uuid_map = {});
/// The same GPUs' values under their mapped UUIDs. A GPU the map moves
/// another onto takes the moved one's value: its own (a GPU the map leaves
/// out) is dropped.
GpuUse map_gpus(const GpuUse& v, const std::map<std::string, std::string>& uuid_map);

/// True when every GPU of `need` has at least need + margin free, or when
/// nothing can be known (check off, nothing needed, NVML missing: *note
/// then says so when not null). The margin of a GPU is at most its
/// margin_cap entry, the free memory it had before the suspend: a job that
/// ran with less to spare needs no more to come back (it freed what it
/// needs). False: *why names each GPU that falls short, its free memory,
/// the need and the margin.
bool restore_memory_fits(const GpuUse& need, const RestoreMemoryPolicy& policy,
                         const GpuUse& margin_cap, std::string* why, std::string* note = nullptr);

/// The record a checkpoint or suspend leaves in the job's runtime directory
/// for a later resume of the job: JSON {"processes": {"<pid>": {"GPU-...":
/// bytes}}, "free": {"GPU-...": bytes}} (each GPU's free memory before).
inline constexpr const char* kGpuUseFile = "gpu-use.json";
bool write_gpu_use(const std::string& path, const ProcessGpuUse& use, const GpuUse& free,
                   std::string* err);
/// False when the file is missing or not such a record.
bool read_gpu_use(const std::string& path, ProcessGpuUse* use, GpuUse* free);

}  // namespace cusnap
