#include "proto/env_settings.h"

#include <cstdlib>
#include <cstring>

namespace cusnap::proto {

namespace {

/// The value as the user wrote it, shortened for a message.
std::string quoted(const char* name, const char* value) {
  std::string v(value);
  if (v.size() > 32) v = v.substr(0, 32) + "...";
  return std::string(name) + "=\"" + v + "\"";
}

}  // namespace

bool parse_whole(const char* text, uint64_t lo, uint64_t hi, uint64_t* out) noexcept {
  if (!text || !*text) return false;
  uint64_t v = 0;
  size_t n = 0;
  for (const char* p = text; *p; ++p, ++n) {
    if (*p < '0' || *p > '9' || n == 19) return false;  // 19 digits cannot overflow
    v = v * 10 + uint64_t(*p - '0');
  }
  if (v < lo || v > hi) return false;
  *out = v;
  return true;
}

uint64_t env_number(const NumberSetting& s) noexcept {
  uint64_t v = 0;
  return parse_whole(std::getenv(s.name), s.lo, s.hi, &v) ? v : s.fallback;
}

bool env_number_checked(const NumberSetting& s, uint64_t* out, std::string* err) {
  const char* e = std::getenv(s.name);
  if (!e || !*e) {
    *out = s.fallback;
    return true;
  }
  if (parse_whole(e, s.lo, s.hi, out)) return true;
  *err = quoted(s.name, e) + " is not a whole number of " + s.unit + " from " +
         std::to_string(s.lo) + " to " + std::to_string(s.hi) + " (unset it for the default)";
  return false;
}

bool shim_direct_io_valid(const char* v) noexcept {
  if (!v || !*v) return true;
  for (const char* ok : {"off", "0", "auto", "on", "1"})
    if (std::strcmp(v, ok) == 0) return true;
  return false;
}

bool check_env_settings(bool shim, bool supervisor, std::string* err) {
  uint64_t v = 0;
  if (shim) {
    for (const NumberSetting* s : kShimNumberSettings)
      if (!env_number_checked(*s, &v, err)) return false;
    if (const char* d = std::getenv("CUSNAP_SHIM_DIRECT_IO"); !shim_direct_io_valid(d)) {
      *err = quoted("CUSNAP_SHIM_DIRECT_IO", d) + " is none of off, auto and on";
      return false;
    }
  }
  if (supervisor)
    for (const NumberSetting* s : kSupervisorNumberSettings)
      if (!env_number_checked(*s, &v, err)) return false;
  return true;
}

bool parse_timeout_seconds(const char* text, int64_t* out_ms) noexcept {
  if (!text || !*text) return false;
  char* end = nullptr;
  const double s = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(s > 0) || s > 86400.0 * 365) return false;
  const int64_t ms = static_cast<int64_t>(s * 1000.0 + 0.5);
  *out_ms = ms < 1 ? 1 : ms;
  return true;
}

bool control_timeout_checked(int64_t* out_ms, std::string* err) {
  const char* v = std::getenv("CUSNAP_CONTROL_TIMEOUT");
  if (!v || !*v || parse_timeout_seconds(v, out_ms)) return true;
  *err = quoted("CUSNAP_CONTROL_TIMEOUT", v) +
         " is not a number of seconds greater than 0 and at most 31536000 (a year)";
  return false;
}

}  // namespace cusnap::proto
