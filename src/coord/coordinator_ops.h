// The engine calls the coordinator thread makes, as a table so tests can put
// fakes behind it. default_coordinator_ops() names the real engine (engine.h).
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "coord/engine.h"

namespace cusnap {

struct CoordinatorOps {
  std::function<bool(const JobInfo&, const CheckpointOptions&, const ProgressSink&,
                     CheckpointResult*, std::string*)>
      checkpoint;
  /// On failure out->code says kExitRefused (nothing changed) or worse.
  /// settings: what the client sent (settings.h).
  std::function<bool(const JobInfo&, std::chrono::milliseconds, const proto::Settings&,
                     SuspendResult*, std::string*)>
      suspend;
  std::function<bool(const JobInfo&, std::chrono::milliseconds, const proto::Settings&, ExitCode*,
                     std::string*)>
      resume;
  std::function<std::vector<ProcessInfo>(pid_t)> list_processes;
};

/// The real engine.
CoordinatorOps default_coordinator_ops();

}  // namespace cusnap
