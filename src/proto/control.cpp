#include "proto/control.h"
#include "proto/utf8.h"

#include <iterator>

namespace cusnap::proto {
namespace {

/// What a client that sent a value cusnap's own commands never send should
/// do: these commands check the values before they send them, so another
/// version of cusnap, or another program, sent it.
constexpr const char* kUseThisClient =
    "the cusnap command checks this before it sends a request, so the request came from another "
    "version of cusnap or another program: send it with the cusnap that started the job";

bool validate_timeout(int64_t ms, std::string* err) {
  if (ms <= 0 || ms > kMaxTimeoutMs) {
    *err = "the request's timeout of " + std::to_string(ms) + " ms is out of range (1 to " +
           std::to_string(kMaxTimeoutMs) +
           " ms, a week): give --timeout SECONDS from 0.001 to 604800; " + kUseThisClient;
    return false;
  }
  return true;
}

/// kClientSettings, comma-separated.
std::string client_setting_names() {
  std::string names;
  for (const char* k : kClientSettings) names += (names.empty() ? "" : ", ") + std::string(k);
  return names;
}

bool validate_settings(const Settings& settings, std::string* err) {
  if (settings.size() > std::size(kClientSettings)) {
    *err = "the request carries " + std::to_string(settings.size()) +
           " settings, more than the job's supervisor takes (" + client_setting_names() + "); " +
           kUseThisClient;
    return false;
  }
  for (const auto& [name, value] : settings) {
    bool known = false;
    for (const char* k : kClientSettings) known = known || name == k;
    if (!known) {
      *err = "unknown setting '" + name.substr(0, 64) +
             "' in the request (the job's supervisor takes " + client_setting_names() + "); " +
             kUseThisClient;
      return false;
    }
    if (value.find('\0') != std::string::npos) {
      *err = "the value of " + name + " in the request holds a NUL byte, which no environment " +
             "variable does; " + kUseThisClient;
      return false;
    }
    if (value.size() > kMaxSettingBytes) {
      *err = "the value of " + name + " in the request is " + std::to_string(value.size()) +
             " bytes long, more than the " + std::to_string(kMaxSettingBytes) +
             " the job's supervisor takes: write it shorter, or unset " + name +
             " for the default, in the environment of the command";
      return false;
    }
  }
  return true;
}
}  // namespace

bool validate(const CheckpointRequest& r, std::string* err) {
  if (r.dir.empty() || r.dir[0] != '/' || r.dir.size() > kMaxCheckpointDirBytes ||
      r.dir.find('\0') != std::string::npos) {
    *err = "the checkpoint directory in the request is not an absolute path of at most " +
           std::to_string(kMaxCheckpointDirBytes) +
           " bytes without a NUL byte: give -o a directory that is; " + std::string(kUseThisClient);
    return false;
  }
  // The manifest, the guardian and the results record it as JSON text.
  if (!valid_utf8(r.dir)) {
    *err = "the checkpoint directory " + r.dir +
           " is not valid UTF-8, which cusnap cannot record: choose another with -o";
    return false;
  }
  return validate_settings(r.settings, err) && validate_timeout(r.timeout_ms, err);
}

bool validate(const TimeoutRequest& r, std::string* err) {
  return validate_settings(r.settings, err) && validate_timeout(r.timeout_ms, err);
}

bool validate(const CancelRequest& r, std::string* err) {
  if (r.op == kMsgCheckpoint || r.op == kMsgSuspend) return true;
  *err = "the request asks to cancel '" + r.op.substr(0, 64) +
         "', which cannot be cancelled (only a checkpoint or a suspend can): " + kUseThisClient;
  if (!valid_utf8(*err))
    *err =
        "the request asks to cancel an operation that is not text; " + std::string(kUseThisClient);
  return false;
}

}  // namespace cusnap::proto
