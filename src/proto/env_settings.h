// The whole-number settings cusnap reads from the environment, with their
// bounds, in one list shared by the CLI (which refuses a bad value before it
// starts anything), the supervisor and the shim (which, living in the
// workload, never fails on one: it takes the default).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cusnap::proto {

/// A whole-number environment setting: decimal digits only, from lo to hi.
struct NumberSetting {
  const char* name;
  uint64_t lo;
  uint64_t hi;
  uint64_t fallback;  ///< when unset or empty (0 where the reader computes it)
  const char* unit;   ///< for messages: "a number of UNIT from LO to HI"
};

// Read in the job by the shim.
inline constexpr NumberSetting kShimStagingMib{"CUSNAP_SHIM_STAGING_MIB", 1, 1024, 32, "MiB"};
inline constexpr NumberSetting kShimCopyThreads{"CUSNAP_SHIM_COPY_THREADS", 1, 64, 0, "threads"};
inline constexpr NumberSetting kShimDirectMib{"CUSNAP_SHIM_DIRECT_MIB", 1, 4096, 128, "MiB"};
inline constexpr NumberSetting kCutHoldMs{"CUSNAP_CUT_HOLD_MS", 1, uint64_t(7) * 24 * 3600 * 1000,
                                          120000, "milliseconds"};
// Read by the supervisor.
inline constexpr NumberSetting kSaveParts{"CUSNAP_SAVE_PARTS", 1, 64, 8, "files"};
inline constexpr NumberSetting kGuardianCriuWaitMs{
    "CUSNAP_GUARDIAN_CRIU_WAIT_MS", 0, uint64_t(7) * 24 * 3600 * 1000, 60000, "milliseconds"};
/// How long CRIU, due to end (its timeout, a cancel, a dead supervisor's
/// CRIU the guardian ends), may go on while it drives a process by ptrace
/// alone, where a kill would end that process (coord/criu_interrupt.h).
inline constexpr NumberSetting kCriuKillGraceMs{"CUSNAP_CRIU_KILL_GRACE_MS", 0,
                                                uint64_t(3600) * 1000, 5000, "milliseconds"};
inline constexpr NumberSetting kOutputLogMib{"CUSNAP_OUTPUT_LOG_MIB", 0, uint64_t(1) << 20, 64,
                                             "MiB (0: no cap)"};
/// After the job's first process exited: how long the supervisor goes on
/// copying the output of its other processes, and how long each of those
/// still running has between SIGTERM and SIGKILL.
inline constexpr NumberSetting kExitGraceMs{"CUSNAP_EXIT_GRACE_MS", 0, uint64_t(3600) * 1000, 2000,
                                            "milliseconds"};
/// How long lifting CRIU's network lock may take: the answer of nf_tables
/// and each iptables command.
inline constexpr NumberSetting kNetworkUnlockMs{"CUSNAP_NETWORK_UNLOCK_TIMEOUT_MS", 100,
                                                uint64_t(3600) * 1000, 10000, "milliseconds"};

/// The settings the shim reads, checked by `cusnap launch` before the job starts.
inline constexpr const NumberSetting* kShimNumberSettings[] = {&kShimStagingMib, &kShimCopyThreads,
                                                               &kShimDirectMib, &kCutHoldMs};
/// The settings a supervisor reads, checked by `launch` and `restore`.
inline constexpr const NumberSetting* kSupervisorNumberSettings[] = {
    &kSaveParts,    &kGuardianCriuWaitMs, &kCriuKillGraceMs,
    &kOutputLogMib, &kNetworkUnlockMs,    &kExitGraceMs};

/// A setting the supervisor reads as text when its job is checkpointed,
/// suspended or resumed (kClientSettings of control.h: a value the command's
/// client sends counts before the supervisor's own environment, which
/// serves when it sends none): checked by `launch` and `restore` as the
/// supervisor reads it, so that a value their environment gave it cannot
/// fail those later commands. coord/settings_test.cpp holds each check to its
/// reader in the coordinator: the same values refused, in the same words.
struct TextSetting {
  const char* name;
  bool (*valid)(const char* value) noexcept;  ///< value: nullptr when unset
  const char* refusal;                        ///< the message after NAME="VALUE"
};

/// CUSNAP_HASH_THREADS: 1 to kMaxHashThreadsSetting, or empty, which is
/// unset (coord's hash_thread_count).
inline constexpr uint64_t kMaxHashThreadsSetting = 256;
/// CUSNAP_RESTORE_MEMORY_MARGIN's value (gpu_memory.h): "off", or a size,
/// decimal digits alone or followed by K, M or G (either case), below 2^63
/// bytes; *off says which, *bytes gets the size (untouched for off). False
/// for anything else, nullptr and "" included (where the default serves).
/// No allocation.
bool parse_memory_margin(const char* text, bool* off, uint64_t* bytes) noexcept;

/// Each setting's check of a value (nullptr: unset). No allocation.
bool hash_threads_valid(const char* value) noexcept;
bool memory_margin_valid(const char* value) noexcept;
bool criu_breakpoints_valid(const char* value) noexcept;
bool criu_ghost_limit_valid(const char* value) noexcept;
bool criu_network_lock_valid(const char* value) noexcept;
bool ranks_sharing_gpu_valid(const char* value) noexcept;

inline constexpr TextSetting kHashThreads{
    "CUSNAP_HASH_THREADS", hash_threads_valid,
    "is not a number of threads from 1 to 256 (unset it to use every core)"};
inline constexpr TextSetting kRestoreMemoryMargin{
    "CUSNAP_RESTORE_MEMORY_MARGIN", memory_margin_valid,
    "is not a size (bytes, or a number followed by K, M or G) or off (unset it for the default, "
    "256M)"};
inline constexpr TextSetting kCriuBreakpoints{
    "CUSNAP_CRIU_BREAKPOINTS", criu_breakpoints_valid,
    "is not auto, on or off: unset it to let cusnap find out whether this machine's hardware "
    "breakpoints work"};
inline constexpr TextSetting kCriuGhostLimit{
    "CUSNAP_CRIU_GHOST_LIMIT", criu_ghost_limit_valid,
    "is not a size (bytes, or a number followed by K, M or G, e.g. 4G): unset it to save deleted "
    "files of any size"};
inline constexpr TextSetting kCriuNetworkLock{
    "CUSNAP_CRIU_NETWORK_LOCK", criu_network_lock_valid,
    "is not nftables, iptables or skip (CRIU's network lock methods): unset it for nftables"};
inline constexpr TextSetting kAllowRanksSharingGpu{
    "CUSNAP_ALLOW_RANKS_SHARING_GPU", ranks_sharing_gpu_valid,
    "is neither 1 nor 0: set it to 1 to checkpoint ranks that share a GPU anyway, or unset it"};

/// The settings a supervisor reads as text, checked by `launch` and `restore`:
/// every one of kClientSettings.
inline constexpr const TextSetting* kSupervisorTextSettings[] = {
    &kHashThreads,    &kRestoreMemoryMargin, &kCriuBreakpoints,
    &kCriuGhostLimit, &kCriuNetworkLock,     &kAllowRanksSharingGpu};

/// Whether value (nullptr: unset) is one the setting takes; false with *err
/// naming the setting, the value and what it takes.
bool text_setting_checked(const TextSetting& s, const char* value, std::string* err);

/// A setting of kSupervisorTextSettings a command sends its job's
/// supervisor, checked before it is sent, so that checkpoint, suspend and
/// resume refuse a bad value as launch does (a bad command line): false with
/// *err giving the setting's refusal, in launch's words, when the value is
/// not one it takes, or saying that a value longer than max_bytes (which is
/// not sent) must be written shorter or unset for the default.
bool sent_setting_checked(const char* name, const char* value, size_t max_bytes, std::string* err);

/// text as a whole number from lo to hi: decimal digits only (no sign, blank
/// or suffix), at most 19 of them. No allocation; async-signal-safe.
bool parse_whole(const char* text, uint64_t lo, uint64_t hi, uint64_t* out) noexcept;

/// The setting's value: its fallback when unset, empty or invalid. No
/// allocation; for the shim.
uint64_t env_number(const NumberSetting& s) noexcept;

/// The setting's value into *out (its fallback when unset or empty); false
/// with *err naming the setting, the value and the bounds when invalid.
bool env_number_checked(const NumberSetting& s, uint64_t* out, std::string* err);

/// CUSNAP_SHIM_DIRECT_IO: unset, empty, off, 0, auto, on or 1.
bool shim_direct_io_valid(const char* value) noexcept;

/// The shim's switches, on unless 0 (as the shim reads them): tracking
/// (CUSNAP_SHIM_TRACK) and cuMemAlloc served as shareable memory
/// (CUSNAP_SHIM_LEGACY_VMM).
inline constexpr const char* kShimSwitches[] = {"CUSNAP_SHIM_TRACK", "CUSNAP_SHIM_LEGACY_VMM"};
/// A switch's value: unset, empty, 0 or 1. Anything else (false, off, no)
/// the shim would read as on, which is not what it says. No allocation.
bool shim_switch_valid(const char* value) noexcept;

/// CUSNAP_COLLECTIVE_KERNELS, the prefixes of the kernel names the shim
/// counts as collectives (shim/cut.h): at most this many, in at most this
/// many bytes (the shim keeps them in a buffer of its own).
inline constexpr unsigned kMaxCollectiveKernelPrefixes = 8;
inline constexpr size_t kMaxCollectiveKernelsBytes = 255;
/// The default, for an unset or empty value.
/// NCCL's kernels: ncclDevKernel_* (2.19 on), ncclKernel_* (earlier) and the
/// symmetric-memory kernels of registered windows, ncclSymDevKernel_* (2.27)
/// and ncclSymkDevKernel_* (2.28 on).
inline constexpr const char* kDefaultCollectiveKernels =
    "ncclDevKernel,ncclKernel,ncclSymDevKernel,ncclSymkDevKernel";
/// Unset, empty, or 1 to kMaxCollectiveKernelPrefixes prefixes (the
/// non-empty parts between commas, as the shim reads them), without blanks,
/// kMaxCollectiveKernelsBytes at most: a value the shim would cut short, or
/// read as no prefix at all, would count no collective and leave the ranks
/// uncut. No allocation.
bool collective_kernels_valid(const char* value) noexcept;

/// Checks, in the environment, every setting of kShimNumberSettings,
/// kShimSwitches, CUSNAP_SHIM_DIRECT_IO and CUSNAP_COLLECTIVE_KERNELS (shim) and/or of
/// kSupervisorNumberSettings and kSupervisorTextSettings (supervisor); the first bad one in *err.
bool check_env_settings(bool shim, bool supervisor, std::string* err);

/// text as seconds (a plain decimal such as 10 or 2.5: no sign, exponent,
/// hex or blank; greater than 0, at most a year) in
/// milliseconds, at least 1. No allocation.
bool parse_timeout_seconds(const char* text, int64_t* out_ms) noexcept;

/// CUSNAP_CONTROL_TIMEOUT as milliseconds: seconds, fractional allowed,
/// greater than 0 and at most a year; false with *err when set and invalid,
/// true with *out untouched when unset or empty.
bool control_timeout_checked(int64_t* out_ms, std::string* err);

}  // namespace cusnap::proto
