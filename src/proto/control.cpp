#include "proto/control.h"
#include "proto/utf8.h"

#include <iterator>

namespace cusnap::proto {
namespace {

bool validate_timeout(int64_t ms, std::string* err) {
  if (ms <= 0 || ms > kMaxTimeoutMs) {
    *err = "timeout of " + std::to_string(ms) + " ms is out of range";
    return false;
  }
  return true;
}

bool validate_settings(const Settings& settings, std::string* err) {
  if (settings.size() > std::size(kClientSettings)) {
    *err = "too many settings";
    return false;
  }
  for (const auto& [name, value] : settings) {
    bool known = false;
    for (const char* k : kClientSettings) known = known || name == k;
    if (!known) {
      *err = "unknown setting '" + name.substr(0, 64) + "'";
      return false;
    }
    if (value.size() > kMaxSettingBytes || value.find('\0') != std::string::npos) {
      *err = "the value of " + name + " is longer than " + std::to_string(kMaxSettingBytes) +
             " bytes or holds a NUL";
      return false;
    }
  }
  return true;
}
}  // namespace

bool validate(const CheckpointRequest& r, std::string* err) {
  if (r.dir.empty() || r.dir[0] != '/' || r.dir.size() > 4096 ||
      r.dir.find('\0') != std::string::npos) {
    *err = "checkpoint directory must be an absolute path";
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

}  // namespace cusnap::proto
