// Settings a command reads: what the client sent from its environment
// (proto::kClientSettings, validated by proto::validate) counts before the
// supervisor's own environment, so `VAR=x cusnap checkpoint JOB` works for a
// job launched without VAR.
#pragma once

#include "proto/control.h"

namespace cusnap {

/// The value of setting `name` (one of proto::kClientSettings) for a
/// command: what the client sent in `settings`, else this process's
/// environment; nullptr when neither has it.
const char* setting(const proto::Settings& settings, const char* name);

}  // namespace cusnap
