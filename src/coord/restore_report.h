// What `cusnap restore` reports of a restore that went well: the object its
// --json prints once the job runs, and what it reports when a background
// restore (--detach) said it succeeded but its summary could not be decoded;
// and how the command waiting for a background restore reads what it sends,
// saying that the outcome is not known when no result comes.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "coord/supervisor.h"

namespace cusnap {

/// The object `cusnap restore --json` prints once the job runs (man
/// cusnap-restore, --json): ok (true), name, dir, pid (null when not known,
/// 0), runtime_dir, phases, gpu_moves ({from, to} GPU UUIDs) and detached.
nlohmann::json restored_json(const RestoreSummary& s, bool detached);

/// One line per GPU of the checkpoint restored onto another ("cusnap: the
/// job's GPU OLD is now GPU NEW\n"); "" when none moved.
std::string gpu_moves_text(const RestoreSummary& s);

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

/// The summary as the background supervisor of restore --detach sends it
/// (the details of its result), and back; false when text is not one.
std::string summary_to_json(const RestoreSummary& s);
bool summary_from_json(const std::string& text, RestoreSummary* s);

/// The error of restore --detach when its background supervisor ended, or
/// closed its end, before it sent the restore's result (why: what the wait
/// saw). The restore may have failed, or the job may run on: it says that
/// whether job name (empty: not known) was restored from dir is not known,
/// and how to find out (cusnap ps, cusnap inspect NAME).
std::string detached_outcome_unknown(const std::string& name, const std::string& dir,
                                     const std::string& why);

/// The waiting command's side of restore --detach: reads progress (to
/// progress, when set) and then the one result the background supervisor
/// sends over ch. A success calls on_restored with its summary (when it
/// decodes) and returns detached; a failure returns its code and message;
/// no result (the supervisor ended, or sent something else) returns
/// kExitFailure with detached_outcome_unknown (name, dir: as there), the
/// failure that man cusnap documents for an outcome not known.
SuperviseOutcome await_detached_restore(
    proto::Channel& ch, const ProgressSink& progress,
    const std::function<void(const RestoreSummary&)>& on_restored, const std::string& name,
    const std::string& dir);

}  // namespace cusnap
