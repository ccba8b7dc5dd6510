// DIR/manifest.json, the record of a checkpoint. Format (version 4):
//
//   { "format": "cusnap-checkpoint", "version": 4, "created": "<UTC ISO 8601>",
//     "cusnap_version": "0.1.0",
//     "job": { "name", "argv": [..], "cwd", "owner_uid", "root_pid",
//              "stdout_pipe": "pipe:[N]", "stderr_pipe": "pipe:[N]",
//              "shim_dir" },          the runtime directory the shims bound
//                                     their sockets in ("": the job's own)
//     "processes": [ { "pid", "ppid", "exe", "cmdline": [..], "uses_cuda",
//                      "gpus": ["GPU-..."],
//                      "gpu_memory": {"GPU-...": bytes} } ],   root first;
//                                     gpu_memory optional (NVML's count)
//     "driver": { "version": 13000, "path" },
//     "gpus": [ { "index", "name", "uuid", "total_mem" } ],   devices at checkpoint
//     "criu": { "version": "4.1.1", "path",
//               "run_id": "<UUID>", optional: the dump's run id (criu_leftovers.h)
//               "network_lock": "nftables" },  optional: its lock of tcp_established
//                                     connections, left until a restore lifts it
//     "files": [ { "path": "criu/pages-1.img", "size", "chunk_size",
//                  "sha256", "chunks": ["<sha256 of each chunk>", ..] } ],
//     "phases": [ { "name", "seconds" } ],
//     "leave_running": bool,
//     "tcp_established": true,        optional: CRIU saved established TCP connections
//     "tcp_listeners": [ { "family": 4|6, "addr": "127.0.0.1", "port": 1..65535,
//                          "reuseport": bool, "reuseaddr": bool,
//                          "v6only": bool (family 6 only, optional) } ],
//                                     optional: the job's listening TCP sockets,
//                                     checked free before a restore (ports.h)
//     "gpu_free": {"GPU-...": bytes}, optional: free device memory before
//     "shim_processes": [pid, ..],    processes whose shims released shared
//                                     memory (of those using CUDA): their records
//                                     are shim/<pid>.records, the bytes
//                                     shared/<pid>-<allocation>.<k>.bin, k from 0
//     "manifest_sha256": "<hex>" }    the manifest's own SHA-256 (below)
//
// manifest_sha256, added by write_manifest, is the SHA-256 of the manifest's
// text without that field as manifest_to_json writes it: keys sorted,
// indented by 2, a newline at the end (the file less that one line). The
// reader checks it first, on what it parsed serialized again that way
// (whitespace and key order in the file do not count), so that nothing
// changed in the manifest after it was written (a digit of a pid, of a GPU's
// free memory, job.shim_dir) is trusted: a mismatch is refused as a manifest
// altered or corrupted. A version 4 manifest without it is refused as
// incomplete. manifest_from_json (the parser of the text alone) does not
// check it.
//
// The version changes when a field becomes required or changes meaning, so
// that a reader that does not know it refuses the manifest rather than
// misreading it; a field added as optional, which earlier readers ignore,
// keeps it. Versions 2 and 3, written without manifest_sha256, are still read
// (unchecked; one there is checked all the same). Version 3 is version 4
// without manifest_sha256. Version 2 has no shim_processes (nothing shared);
// its job.shim_dir is optional, as the first version 2 manifests were
// written without it.
//
// files[].sha256 is the chunked SHA-256 of sha256_chunked.h: chunk_size is a
// power of two from 4 KiB to 1 GiB (cusnap writes 64 MiB), chunks holds
// ceil(size / chunk_size) digests, and sha256 is the SHA-256 of their
// concatenation. Version 1 (one SHA-256 per file, no chunks) is refused with
// a message naming the cusnap that wrote it: restore with that one.
//
// Written last, atomically, so a directory without it is never restorable.
// The loader rejects anything it does not fully understand.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "coord/driver.h"
#include "coord/engine.h"
#include "coord/ports.h"
#include "coord/sha256_chunked.h"

namespace cusnap {

inline constexpr int kManifestVersion = 4;
inline constexpr const char* kManifestName = "manifest.json";
/// The field of a manifest's own SHA-256 (format above).
inline constexpr const char* kManifestSha256Field = "manifest_sha256";
/// CRIU writes its restore statistics into the image directory; the only
/// file that may appear in a checkpoint after it was written.
inline constexpr const char* kCriuRestoreStats = "criu/stats-restore";

struct ManifestProcess {
  pid_t pid = 0, ppid = 0;
  std::string exe;
  std::vector<std::string> cmdline;
  bool uses_cuda = false;
  std::vector<std::string> gpus;
  /// Device memory the process used on each GPU (UUID -> bytes) as NVML
  /// counted it before the checkpoint; the restore checks that much is free
  /// (gpu_memory.h). Optional in the file (absent: not counted).
  GpuUse gpu_memory;
};

struct ManifestFile {
  std::string path;  ///< relative to the checkpoint directory
  uint64_t size = 0;
  uint64_t chunk_size = 0;
  std::string sha256;               ///< chunked SHA-256 (sha256_chunked.h), hex
  std::vector<std::string> chunks;  ///< SHA-256 of each chunk, hex
};

struct Manifest {
  int version = kManifestVersion;
  std::string created;
  std::string cusnap_version;
  JobInfo job;
  std::vector<ManifestProcess> processes;
  int driver_version = 0;
  std::string driver_path;
  std::vector<GpuDevice> gpus;
  std::string criu_version, criu_path;
  /// The dump's CRIU run id (from its log), which names its network lock;
  /// and that lock's method (--network-lock) where the dump saved
  /// established TCP connections and stopped the job: CRIU leaves the lock
  /// in place until a restore removes it. Optional in the file (absent:
  /// empty).
  std::string criu_run_id, criu_network_lock;
  std::vector<ManifestFile> files;
  PhaseTimes phases;
  bool leave_running = false;
  /// CRIU saved established TCP connections (--tcp-established); the restore
  /// must say so too. Optional in the file (absent: false).
  bool tcp_established = false;
  /// The job's listening TCP sockets, at most kMaxTcpListeners. Optional in
  /// the file (absent: none, as in checkpoints written before it; nothing is
  /// checked then).
  std::vector<TcpListener> tcp_listeners;
  std::vector<pid_t> shim_processes;
  /// Each GPU's free device memory before the checkpoint (UUID -> bytes):
  /// the cap of the restore's margin (gpu_memory.h). Optional in the file.
  GpuUse gpu_free;
};

/// Bounds of a manifest's text, checked by its parser. A path (job.cwd,
/// job.shim_dir, an exe, driver.path, criu.path, a file's path): PATH_MAX.
/// An argument of job.argv: what exec takes (MAX_ARG_STRLEN, its NUL
/// included). A process's command line (with a NUL after each argument):
/// what exec takes for arguments and environment together (6 MiB). Any other
/// string: kMaxManifestTextBytes.
inline constexpr size_t kMaxManifestPathBytes = 4096;
inline constexpr size_t kMaxManifestTextBytes = 4096;
inline constexpr size_t kMaxArgumentBytes = (size_t(32) << 12) - 1;
inline constexpr size_t kMaxCommandLineBytes = size_t(6) << 20;
/// The job's argv and cwd as the job's record, job.json, holds them (JSON
/// text) are at most this: with the rest of job.json (a name, the runtime
/// and checkpoint directories, each a path) it stays within the 1 MiB that
/// ps, inspect and the name's reservation read of it (kMaxJobJsonBytes), so
/// that a restored job is listed.
inline constexpr size_t kMaxJobRecordBytes = size_t(896) << 10;

/// Whether a job of these argv and cwd fits its record (kMaxJobRecordBytes);
/// false with *err saying how big it would be.
bool job_record_fits(const std::vector<std::string>& argv, const std::string& cwd,
                     std::string* err);

/// The UUIDs of the GPUs the checkpoint's CUDA processes used, in the order
/// they first appear: those a --device-map may move (Manifest::gpus lists
/// every GPU the supervisor saw).
std::vector<std::string> used_gpus(const Manifest& m);

/// The names, relative to the checkpoint directory, that the restore reads
/// for a shim process: its records, and part k of the saved bytes of its
/// shared allocation id (shared_memory_files.cpp writes them).
std::string shim_records_file(pid_t pid);
std::string shared_memory_file(pid_t pid, uint64_t id, uint32_t k);

/// JSON text of a manifest, as write_manifest writes it less its
/// manifest_sha256 (the line write_manifest adds).
std::string manifest_to_json(const Manifest& m);
/// The SHA-256 (hex) that manifest_sha256 holds for a manifest of this text:
/// that of the text manifest_to_json writes for its JSON without
/// manifest_sha256. "" when text is not a JSON object.
std::string manifest_content_sha256(const std::string& text);
/// Parses and validates the text alone (its manifest_sha256 is not checked:
/// read_manifest does that); errors say which field is wrong. Besides each
/// field's type and range (strings within the bounds above, device memory
/// within kMaxGpuMemoryBytes, alone and added up per GPU), what the restore
/// reads by name must be listed in files: each shim process's records; and
/// every file under shim/ and shared/ must be one it reads (of a shim
/// process, parts of an allocation from 0 on).
bool manifest_from_json(const std::string& text, Manifest* m, std::string* err);

/// Writes dir/manifest.json atomically: temp file, fsync, rename, fsync dir.
bool write_manifest(const std::string& dir, const Manifest& m, std::string* err);
/// Reads dir/manifest.json, checks its own SHA-256 (manifest_sha256: a
/// mismatch says the manifest was altered or corrupted; missing from a
/// version 4 manifest, it is incomplete) before anything else, then parses
/// and validates it as manifest_from_json (not the files it lists).
bool read_manifest(const std::string& dir, Manifest* m, std::string* err);
/// Same; on failure *code says whose it is: kExitFailure when this process
/// could not read dir or its manifest (permission denied, an I/O error:
/// another user, or a later try, may well read it), kExitBadCheckpoint when
/// the checkpoint is wrong (no manifest, not a directory, a manifest that is
/// not a regular file, does not match its own SHA-256, or does not parse or
/// validate); *error_number (when given) is the errno of the failed stat,
/// open or read, else 0.
bool read_manifest_coded(const std::string& dir, Manifest* m, ExitCode* code, std::string* err,
                         int* error_number = nullptr);

/// "" when path (not followed) is owned by uid owner and no other user may
/// write to it (no group or other write bit); else why not, in words.
/// (manifest_files.cpp)
std::string not_private(const std::string& path, uid_t owner);

/// "" when no user but root can rename dir or put another directory in its
/// place: every directory above it (to /) is root's and writable by no one
/// else, or sticky; else which one is not, and why. dir is absolute and
/// resolved (no link in it). (manifest_files.cpp)
std::string path_not_held(const std::string& dir);

/// The refusal of a checkpoint directory dir that path_not_held refused for
/// why, with what to do: for a checkpoint about to be written (writing:
/// give -o another directory) or one to be restored (copy it as root).
/// (manifest_files.cpp)
std::string not_held_refusal(const std::string& dir, const std::string& why, bool writing);

/// Whether dir (resolved: the directory a link names) and every directory
/// and file under it pass not_private for root, who restores (whoever asks,
/// inspect included), and its path passes path_not_held: the images of a
/// checkpoint decide which processes a restore runs, as which user, so root
/// restores only what root wrote and no one else can change or replace
/// (meanwhile, between the verification and CRIU's reading, too). false with
/// *err naming the first that does not and what to do. (manifest_files.cpp)
bool checkpoint_dir_private(const std::string& dir, std::string* err);

/// Checks that every listed file is there with its size, chunk digests and
/// SHA-256, that no other file is (but kCriuRestoreStats), and that the
/// shared memory each shim's records hold is saved whole. Hashes on
/// hash_thread_count() threads; progress gets phase "verify" with bytes
/// hashed of the listed total. A mismatch names the file and the byte range
/// of its first bad chunk. cancelled, looked at before the hashing and about
/// every 200 ms of it, ends it early (false, *err "cancelled").
/// (manifest_files.cpp)
bool verify_manifest_files(const std::string& dir, const Manifest& m, const ProgressSink& progress,
                           std::string* err, const std::function<bool()>& cancelled = {});

/// Lists every regular file under dir (relative paths, sorted) except the
/// manifest, with size and chunked SHA-256 in chunks of chunk_size, hashed on
/// threads threads (0: hash_thread_count(), from this process's
/// environment); progress gets phase "checksum". A file that changes size
/// meanwhile is an error. cancelled (may be empty) is asked about every
/// 200 ms: true ends the hashing with *err "cancelled". (manifest_files.cpp)
bool hash_directory(const std::string& dir, std::vector<ManifestFile>* out,
                    const ProgressSink& progress, std::string* err,
                    uint64_t chunk_size = kHashChunkSize,
                    const std::function<bool()>& cancelled = {}, unsigned threads = 0);

/// Makes the files (as hash_directory lists them) under dir durable before a
/// manifest vouches for them: a syncfs of dir's file system, then an fsync of
/// each file and of each directory holding one. Writers such as CRIU do not
/// sync their files, and the checksums read the page cache: a write-back
/// error (EIO, or ENOSPC on a thin or network volume) shows only here. false
/// with *err naming what could not be written. (manifest_files.cpp)
bool flush_to_disk(const std::string& dir, const std::vector<ManifestFile>& files,
                   std::string* err);

/// The cusnap version compiled in.
std::string cusnap_version();

}  // namespace cusnap
