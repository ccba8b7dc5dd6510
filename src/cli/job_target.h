// Finding the job a command names (by name, pid or runtime
// directory) and asking its supervisor for something.
#pragma once

#include <string>

#include "common.h"
#include "coord/job_client.h"
#include "coord/runtime_dir.h"

namespace cusnap::cli {

/// The JOB argument of the commands that act on a running job.
void add_job_argument(CLI::App& app, std::string* job);

/// Finds job spec; on failure prints the error (and JSON when asked) and
/// returns the exit code, else -1.
int resolve_job(const std::string& spec, bool json, JobEntry* out);

/// Prints a failed exchange or a refused request; returns its exit code.
int report_result_failure(bool json, const proto::Result& r);

/// PhaseTimes-like JSON array [{"name","seconds"}] as text lines.
void print_phases(const nlohmann::json& phases);

/// A checkpoint's or suspend's details "collective_cut" and
/// "capture_retries" as text lines (nothing when absent).
void print_cut(const nlohmann::json& details);

}  // namespace cusnap::cli
