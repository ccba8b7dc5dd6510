#include "coord/settings.h"

#include <cstdlib>

#include "coord/sha256_chunked.h"
#include "proto/env_settings.h"

namespace cusnap {

// launch and restore check CUSNAP_HASH_THREADS with the supervisor's bound.
static_assert(proto::kMaxHashThreadsSetting == kMaxHashThreadsEnv);

const char* setting(const proto::Settings& settings, const char* name) {
  const auto it = settings.find(name);
  return it != settings.end() ? it->second.c_str() : std::getenv(name);
}

std::string setting_origin(const proto::Settings& settings, const char* name) {
  const char* own = std::getenv(name);
  if (settings.count(name) || !own) return "";
  std::string v(own);
  if (v.size() > 64) v = v.substr(0, 64) + "...";
  return " (" + std::string(name) + "=\"" + v +
         "\" is from the environment of the job's supervisor, as the job was launched or "
         "restored: set " +
         name + " for this command to override it)";
}

bool refused_setting(const proto::Settings& settings, const char* name, std::string* err) {
  if (err->starts_with(std::string(name) + "=\"")) *err += setting_origin(settings, name);
  return false;
}

}  // namespace cusnap
