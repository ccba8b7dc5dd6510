// Control messages between the CLI and a job's supervisor, carried by the
// wire format of wire.h over the job's control socket.
//
// Every exchange is one request from the client, then zero or more
// "progress" messages, then exactly one "result" (or, for "hello", one
// "hello"). The supervisor refuses a peer that is neither root nor the job's
// owner with a result (ok=false, exit_code=kExitRefused) and closes.
//
//   client -> supervisor           supervisor -> client
//   hello      {}                  hello    JobStatus
//   checkpoint CheckpointRequest   progress ProgressEvent ... then result
//   suspend    TimeoutRequest      result
//   resume     TimeoutRequest      result
//   inspect    {}                  result (details: JSON {"job":..., "processes": [...]})
//   cancel     CancelRequest       result (details: JSON {"job", "operation", "cancel"})
//
// A cancel comes on a connection of its own while a checkpoint or a suspend
// runs: it is served only for a peer of the uid that started the operation
// (with own, only for the very process that started it), and asks the
// supervisor's engine to stop at its next phase boundary and roll back.
// "cancel" in its reply is "requested" or "too late" (the operation passed
// the point after which it completes: the checkpoint is complete, the job
// suspended); the operation's own result then says how it ended.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <msgpack.hpp>
#include <string>
#include <vector>

namespace cusnap::proto {

inline constexpr const char* kMsgHello = "hello";
inline constexpr const char* kMsgCheckpoint = "checkpoint";
inline constexpr const char* kMsgSuspend = "suspend";
inline constexpr const char* kMsgResume = "resume";
inline constexpr const char* kMsgInspect = "inspect";
inline constexpr const char* kMsgCancel = "cancel";
inline constexpr const char* kMsgProgress = "progress";
inline constexpr const char* kMsgResult = "result";

/// A request without arguments ("hello", "inspect").
struct Empty {
  template <class Packer>
  void msgpack_pack(Packer& pk) const {
    pk.pack_map(0);
  }
  void msgpack_unpack(const msgpack::object& o) {
    if (o.type != msgpack::type::MAP) throw msgpack::type_error();
  }
};

/// What a supervisor says about its job.
struct JobStatus {
  std::string name;
  int64_t root_pid = 0;
  int64_t supervisor_pid = 0;
  std::vector<std::string> argv;
  std::string cwd;
  int64_t owner_uid = 0;
  int64_t started = 0;  ///< Unix time the job started (or was restored)
  std::string state;  ///< running, checkpointing, suspending, suspended, resuming, stopped, exited
  std::string runtime_dir;
  std::string restored_from;  ///< checkpoint directory, empty for a launched job
  MSGPACK_DEFINE_MAP(name, root_pid, supervisor_pid, argv, cwd, owner_uid, started, state,
                     runtime_dir, restored_from);
};

/// Settings of the client's environment that count for a checkpoint or a
/// suspend in the job's supervisor, which otherwise reads its own
/// environment: only these names, each value at most kMaxSettingBytes
/// (validate).
inline constexpr const char* kClientSettings[] = {
    "CUSNAP_CRIU_GHOST_LIMIT", "CUSNAP_CRIU_NETWORK_LOCK", "CUSNAP_CRIU_BREAKPOINTS",
    "CUSNAP_HASH_THREADS", "CUSNAP_ALLOW_RANKS_SHARING_GPU", "CUSNAP_RESTORE_MEMORY_MARGIN"};
inline constexpr size_t kMaxSettingBytes = 64;
using Settings = std::map<std::string, std::string>;

/// The longest checkpoint directory a request may name (PATH_MAX).
inline constexpr size_t kMaxCheckpointDirBytes = 4096;

struct CheckpointRequest {
  std::string dir;  ///< absolute path, at most kMaxCheckpointDirBytes
  bool leave_running = false;
  int64_t timeout_ms = 60000;
  Settings settings;  ///< from the client's environment (kClientSettings)
  MSGPACK_DEFINE_MAP(dir, leave_running, timeout_ms, settings);
};

struct TimeoutRequest {
  int64_t timeout_ms = 60000;
  Settings settings;  ///< from the client's environment (kClientSettings)
  MSGPACK_DEFINE_MAP(timeout_ms, settings);
};

/// Asks to cancel the running operation op ("checkpoint" or "suspend"; a
/// resume cannot be cancelled). own: only when the peer sending this is the
/// process that started it (a client cancelling its own request on an
/// interrupt); else any peer of the uid that started it.
struct CancelRequest {
  std::string op;
  bool own = true;
  MSGPACK_DEFINE_MAP(op, own);
};

/// What the "cancel" field of a cancel's reply says.
inline constexpr const char* kCancelRequested = "requested";
inline constexpr const char* kCancelTooLate = "too late";

/// Progress of a long operation; one with an empty phase is the supervisor's
/// heartbeat (sent every quarter of its control timeout, at most 1 s, while
/// an operation runs) and carries nothing else.
struct ProgressEvent {
  std::string phase;
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
  MSGPACK_DEFINE_MAP(phase, bytes_done, bytes_total);
};

/// The end of every exchange but hello. details is JSON text whose shape
/// depends on the request (see each command's --json in its man page).
struct Result {
  bool ok = false;
  int32_t exit_code = 1;
  std::string message;
  std::string details;
  MSGPACK_DEFINE_MAP(ok, exit_code, message, details);
};

/// Checks the values of a request beyond their types; false + *err when one
/// is out of range.
/// The longest timeout a request may carry (a week).
constexpr int64_t kMaxTimeoutMs = int64_t(7) * 24 * 3600 * 1000;

bool validate(const CheckpointRequest& r, std::string* err);
bool validate(const TimeoutRequest& r, std::string* err);
bool validate(const CancelRequest& r, std::string* err);

}  // namespace cusnap::proto
