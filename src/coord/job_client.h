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

/// An interrupt the wait for a result reacts to: once fd (a pipe's read
/// end, say) is readable, on_interrupt is called, once, and returns how much
/// longer the wait may go on, at most, from then (a cancel's bound).
struct InterruptHook {
  int fd = -1;
  std::function<std::chrono::milliseconds()> on_interrupt;
};

/// Reads progress events until the result arrives. Each message is waited
/// for at most wait; after the hook's interrupt, the whole rest of the wait
/// is bounded by what on_interrupt returned.
bool await_result(proto::Channel& ch, std::chrono::milliseconds wait,
                  const ProgressHandler& on_progress, proto::Result* out, std::string* err,
                  const InterruptHook& hook = {});

/// Asks the supervisor of job, on a connection of its own, to cancel its
/// running op ("checkpoint" or "suspend") that this process asked for
/// (proto::CancelRequest). *out: its reply, a refusal (nothing to cancel)
/// being ok=false; false + *err only when the exchange failed.
bool job_cancel(const JobEntry& job, std::chrono::milliseconds timeout, const std::string& op,
                proto::Result* out, std::string* err);

/// Sends a request whose answer is progress events and then a result.
/// Waiting for each message is bounded by wait (the operation's own timeout
/// plus the control timeout). A refusal by the supervisor is a Result with
/// ok=false, not an error; false + *err (naming the job) only when the
/// exchange failed. hook: an interrupt it reacts to while it waits
/// (await_result).
template <class T>
bool job_request(const JobEntry& job, std::chrono::milliseconds timeout,
                 std::chrono::milliseconds wait, std::string_view type, const T& payload,
                 const ProgressHandler& on_progress, proto::Result* out, std::string* err,
                 const InterruptHook& hook = {}) {
  proto::Channel ch;
  if (!connect_job(job, timeout, &ch, err)) return false;
  if (!ch.send(type, payload, err) || !await_result(ch, wait, on_progress, out, err, hook)) {
    *err = "job " + job.status.name + ": " + *err;
    return false;
  }
  return true;
}

}  // namespace cusnap
