// The client side of a job's control socket, for the CLI: connect (checking
// that the supervisor runs as root or as us), send one request, follow its
// progress, return its result.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>

#include "coord/runtime_dir.h"
#include "proto/control.h"
#include "proto/wire.h"

namespace cusnap {

using ProgressHandler = std::function<void(const proto::ProgressEvent&)>;

/// Connects to the control socket of the job found as job.
bool connect_job(const JobEntry& job, std::chrono::milliseconds timeout, proto::Channel* out,
                 std::string* err);

/// Asks the supervisor for its job's status.
bool job_hello(const JobEntry& job, std::chrono::milliseconds timeout, proto::JobStatus* out,
               std::string* err);

/// Reads progress events until the result arrives.
bool await_result(proto::Channel& ch, std::chrono::milliseconds wait,
                  const ProgressHandler& on_progress, proto::Result* out, std::string* err);

/// Sends a request whose answer is progress events and then a result.
/// Waiting for each message is bounded by wait (the operation's own timeout
/// plus the control timeout). A refusal by the supervisor is a Result with
/// ok=false, not an error; false + *err only when the exchange failed.
template <class T>
bool job_request(const JobEntry& job, std::chrono::milliseconds timeout,
                 std::chrono::milliseconds wait, std::string_view type, const T& payload,
                 const ProgressHandler& on_progress, proto::Result* out, std::string* err) {
  proto::Channel ch;
  if (!connect_job(job, timeout, &ch, err)) return false;
  if (!ch.send(type, payload, err)) return false;
  return await_result(ch, wait, on_progress, out, err);
}

}  // namespace cusnap
