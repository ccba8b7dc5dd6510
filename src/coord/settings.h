// Settings a command reads: what the client sent from its environment
// (proto::kClientSettings, validated by proto::validate) counts before the
// supervisor's own environment, so `VAR=x cusnap checkpoint JOB` works for a
// job launched without VAR. `launch` and `restore` checked the supervisor's
// own values (proto::check_env_settings) before the job started.
#pragma once

#include <string>

#include "proto/control.h"

namespace cusnap {

/// The value of setting `name` (one of proto::kClientSettings) for a
/// command: what the client sent in `settings`, else this process's
/// environment; nullptr when neither has it.
const char* setting(const proto::Settings& settings, const char* name);

/// For a message that reports the value of setting `name` a command used:
/// where it came from when the client did not send it, but this
/// supervisor's environment had it (" (NAME=\"VALUE\" is from the environment
/// of the job's supervisor, as the job was launched or restored: set NAME for
/// this command to override it)"); empty when the client sent it or neither
/// had it (the default served).
std::string setting_origin(const proto::Settings& settings, const char* name);

/// After a reader of setting `name` failed with *err: when *err is its
/// refusal of the value (it starts with NAME="), adds setting_origin. Always
/// false, for `return refused_setting(...)`.
bool refused_setting(const proto::Settings& settings, const char* name, std::string* err);

}  // namespace cusnap
