// What `cusnap restore` reports of a restore that went well: the object its
// --json prints once the job runs, and what it reports when a background
// restore (--detach) said it succeeded but its summary could not be decoded.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>

#include "coord/supervisor.h"

namespace cusnap {

/// The object `cusnap restore --json` prints once the job runs (man
/// cusnap-restore, --json): ok (true), name, dir, pid (null when not known,
/// 0), runtime_dir, phases and detached.
nlohmann::json restored_json(const RestoreSummary& s, bool detached);

/// After restore_and_supervise returned out, on_restored having reported
/// (reported) or not: the summary the command has still to report, `known`
/// (what it knows itself: the job's name, the checkpoint directory, and the
/// root pid and runtime directory where it found them), when the job runs on
/// in the background but no summary came with the success (one that could
/// not be decoded); else nothing (on_restored reported it, or the restore
/// failed, which the command reports as a failure). Every success is so
/// reported once: --json prints one object on every path.
std::optional<RestoreSummary> summary_left_to_report(const SuperviseOutcome& out, bool reported,
                                                     const RestoreSummary& known);

}  // namespace cusnap
