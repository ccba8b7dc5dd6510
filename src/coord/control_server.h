// The coordinator thread: serves a job's control socket (proto/control.h).
//
// One thread accepts connections; each connection is served by a short-lived
// thread of its own, so `ps` keeps answering while a checkpoint runs. Engine
// calls (checkpoint, suspend, resume) run one at a time: a second one while
// one is running is refused (kExitRefused) without waiting, but a "cancel"
// of a running checkpoint or suspend is served at once (the engine looks at
// it at its next phase boundary). Every peer is checked with SO_PEERCRED:
// only root and the job's owner are served, and a cancel only from the uid
// that asked for the operation.
//
// Lock order: JobContext::mu is a leaf; it is never held across an engine
// call or a socket operation.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "coord/coordinator_ops.h"
#include "coord/engine.h"
#include "proto/control.h"
#include "proto/unique_fd.h"
#include "proto/wire.h"

namespace cusnap {

class RuntimeDir;

/// What the coordinator thread shares with the supervisor's main loop.
struct JobContext {
  std::mutex mu;               ///< guards every field below
  std::condition_variable cv;  ///< signalled when engine_busy clears
  JobInfo info;
  proto::JobStatus status;
  std::string engine_op;  ///< the engine call running ("checkpoint", ...), empty when idle
  /// The running engine call's cancel (checkpoint and suspend only, else
  /// null), and the peer that asked for the call (SO_PEERCRED): a cancel is
  /// taken from its uid only.
  std::shared_ptr<CancelToken> cancel;
  uid_t engine_uid = 0;
  pid_t engine_pid = 0;
  /// Engine calls whose result is not yet sent: the supervisor does not end
  /// before its client heard how the checkpoint that stopped the job went.
  int replies_pending = 0;
  std::string stopped_dir;       ///< set when a checkpoint stopped the job
  RuntimeDir* rundir = nullptr;  ///< job.json is rewritten on every state change
  int wake_fd = -1;              ///< eventfd the main loop polls: written when engine_op clears

  /// Sets status.state and rewrites job.json (false, and *err, when that
  /// failed: ps then shows the old state). Precondition: mu held.
  bool set_state_locked(const std::string& state, std::string* err = nullptr);
};

class ControlServer {
 public:
  ControlServer(JobContext* ctx, CoordinatorOps ops, UniqueFd listen_fd,
                std::chrono::milliseconds timeout);
  ~ControlServer();
  /// Starts the coordinator thread.
  bool start(std::string* err);
  /// Stops accepting, ends open connections and joins every thread.
  void stop();

 private:
  void accept_loop();
  void serve(UniqueFd conn);
  /// Marks op running for the peer cred; cancel: the token a cancel of it
  /// reaches (null for an operation that cannot be cancelled).
  bool begin_engine(const std::string& op, const ucred& cred, std::shared_ptr<CancelToken> cancel,
                    proto::Result* refusal);
  /// Serves a "cancel" from the peer cred (proto/control.h).
  void serve_cancel(proto::Channel& ch, const proto::Message& req, const ucred& cred,
                    const JobInfo& info);
  /// Marks the engine idle (so the client's next request is not refused),
  /// then sends the result.
  void end_engine(proto::Channel& ch, const proto::Result& result);

  JobContext* ctx_;
  CoordinatorOps ops_;
  UniqueFd listen_fd_, stop_fd_;
  std::chrono::milliseconds timeout_;
  std::thread thread_;
  std::mutex conns_mu_;  ///< guards conns_ and active_
  std::condition_variable conns_cv_;
  /// Sockets being served, each as our own duplicate (keyed by its number),
  /// shut down by stop(). The duplicate's number stays ours until its thread
  /// is done, so stop() never shuts down a descriptor closed and reused
  /// meanwhile.
  std::map<int, UniqueFd> conns_;
  int active_ = 0;  ///< connection threads (detached) still running
};

/// What the driver says of a job's CUDA processes (cuda_state, as
/// list_processes reads it): how many there are, how many it runs, and how
/// many it holds locked or checkpointed.
struct DriverView {
  int cuda = 0;
  int running = 0;
  int held = 0;
};
DriverView driver_view(const std::vector<ProcessInfo>& procs);

/// Whether the job's recorded state alone refuses a suspend (suspend true)
/// or a resume: a suspend of a job recorded "suspended", a resume of one
/// recorded otherwise. Only then is the driver asked (suspend_resume_refusal).
bool suspend_record_refuses(bool suspend, const std::string& recorded_state);

/// Why the control server refuses a suspend (suspend true) or a resume of
/// job (its name), given its recorded state, what the driver says of it
/// (view; read only where suspend_record_refuses) and whether a failed roll
/// back left it suspended (left_suspended: left_suspended_details, engine.h);
/// empty when the request goes ahead. The record may lag the driver (a
/// resume whose reply was lost, a tool that called the driver itself):
///  - a resume of a job recorded running that the driver holds (locked or
///    checkpointed) goes ahead: it restores what the driver holds;
///  - a suspend of a job recorded suspended stays refused even when the
///    driver runs every process (the shared memory that suspend saved may
///    not be back, and a new suspend would overwrite it); unless it was left
///    suspended, the message says that cusnap resume records it running
///    (and brings that memory back) first.
/// Each refusal names the command that helps.
std::string suspend_resume_refusal(bool suspend, const std::string& recorded_state,
                                   const DriverView& view, bool left_suspended,
                                   const std::string& job);

/// The JSON details of an inspect result: {"job": {...}, "processes": [...]},
/// and "left_suspended": {...} when left_suspended (left_suspended_details)
/// is not empty.
std::string inspect_details_json(const proto::JobStatus& status,
                                 const std::vector<ProcessInfo>& procs,
                                 const std::string& left_suspended = "");

}  // namespace cusnap
