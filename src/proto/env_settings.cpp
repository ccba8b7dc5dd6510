#include "proto/env_settings.h"

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "proto/decimal.h"

namespace cusnap::proto {

namespace {

/// The value as the user wrote it, shortened for a message.
std::string quoted(const char* name, const char* value) {
  std::string v(value);
  if (v.size() > 32) v = v.substr(0, 32) + "...";
  return std::string(name) + "=\"" + v + "\"";
}

/// value is nullptr, empty or one of `taken`.
bool unset_or_one_of(const char* value, std::initializer_list<const char*> taken) noexcept {
  if (!value || !*value) return true;
  for (const char* t : taken)
    if (std::strcmp(value, t) == 0) return true;
  return false;
}

/// Decimal digits at the front of text into *v (saturating past 2^64 - 1);
/// their count.
size_t leading_digits(const char* text, uint64_t* v) noexcept {
  size_t n = 0;
  *v = 0;
  for (; text[n] >= '0' && text[n] <= '9'; ++n) {
    const uint64_t d = uint64_t(text[n] - '0');
    *v = *v > (UINT64_MAX - d) / 10 ? UINT64_MAX : *v * 10 + d;
  }
  return n;
}

}  // namespace

bool parse_memory_margin(const char* text, bool* off, uint64_t* bytes) noexcept {
  if (!text || !*text) return false;
  if (std::strcmp(text, "off") == 0) {
    *off = true;
    return true;
  }
  uint64_t n = 0;
  const size_t digits = leading_digits(text, &n);
  const char* unit = text + digits;
  int shift = 0;
  if (*unit && unit[1] == 0) {
    if (*unit == 'K' || *unit == 'k') shift = 10;
    if (*unit == 'M' || *unit == 'm') shift = 20;
    if (*unit == 'G' || *unit == 'g') shift = 30;
  }
  if (digits == 0 || (*unit && shift == 0) || (n >> (63 - shift)) != 0) return false;
  *off = false;
  *bytes = n << shift;
  return true;
}

bool hash_threads_valid(const char* value) noexcept {
  uint64_t n = 0;
  return !value || !*value || parse_whole(value, 1, kMaxHashThreadsSetting, &n);
}

bool memory_margin_valid(const char* value) noexcept {
  bool off = false;
  uint64_t bytes = 0;
  return !value || !*value || parse_memory_margin(value, &off, &bytes);
}

bool criu_breakpoints_valid(const char* value) noexcept {
  return unset_or_one_of(value, {"auto", "on", "1", "off", "0"});
}

bool criu_ghost_limit_valid(const char* value) noexcept {
  // As CRIU's --ghost-limit takes it (atol): at most 12 digits, K, M or G,
  // above 0 and within a long.
  if (!value || !*value) return true;
  uint64_t n = 0;
  const size_t digits = leading_digits(value, &n);
  const char* unit = value + digits;
  const int shift = *unit == 'K' ? 10 : *unit == 'M' ? 20 : *unit == 'G' ? 30 : 0;
  if (digits == 0 || digits > 12 || (*unit && (shift == 0 || unit[1] != 0)) || n == 0) return false;
  return (n << shift) >> shift == n && (n << shift) <= uint64_t(INT64_MAX);
}

bool criu_network_lock_valid(const char* value) noexcept {
  return unset_or_one_of(value, {"nftables", "iptables", "skip"});
}

bool ranks_sharing_gpu_valid(const char* value) noexcept {
  return unset_or_one_of(value, {"0", "1"});
}

bool text_setting_checked(const TextSetting& s, const char* value, std::string* err) {
  if (s.valid(value)) return true;
  *err = quoted(s.name, value) + " " + s.refusal;
  return false;
}

bool sent_setting_checked(const char* name, const char* value, size_t max_bytes, std::string* err) {
  if (!value) return true;
  for (const TextSetting* s : kSupervisorTextSettings)
    if (std::strcmp(s->name, name) == 0 && !text_setting_checked(*s, value, err)) return false;
  if (std::strlen(value) <= max_bytes) return true;
  // One it takes, written long (a size with leading zeros).
  *err = quoted(name, value) + " is longer than " + std::to_string(max_bytes) +
         " characters, the most a command sends to the job's supervisor: write it shorter, or "
         "unset it for the default";
  return false;
}

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

bool shim_switch_valid(const char* v) noexcept {
  return !v || !*v || std::strcmp(v, "0") == 0 || std::strcmp(v, "1") == 0;
}

bool collective_kernels_valid(const char* v) noexcept {
  if (!v || !*v) return true;
  if (std::strlen(v) > kMaxCollectiveKernelsBytes) return false;
  // As the shim reads it: the prefixes are the non-empty parts between commas.
  unsigned prefixes = 0;
  bool in_part = false;
  for (const char* p = v; *p; ++p) {
    if (*p == ',') {
      in_part = false;
    } else if (std::isspace(static_cast<unsigned char>(*p))) {
      return false;
    } else if (!in_part) {
      in_part = true;
      if (++prefixes > kMaxCollectiveKernelPrefixes) return false;
    }
  }
  return prefixes > 0;
}

bool check_env_settings(bool shim, bool supervisor, std::string* err) {
  uint64_t v = 0;
  if (shim) {
    for (const NumberSetting* s : kShimNumberSettings)
      if (!env_number_checked(*s, &v, err)) return false;
    for (const char* name : kShimSwitches)
      if (const char* v = std::getenv(name); !shim_switch_valid(v)) {
        *err = quoted(name, v) + " is neither 0 nor 1: set it to 0 to turn it off, or unset it " +
               "(on)";
        return false;
      }
    if (const char* d = std::getenv("CUSNAP_SHIM_DIRECT_IO"); !shim_direct_io_valid(d)) {
      *err = quoted("CUSNAP_SHIM_DIRECT_IO", d) +
             " is none of off, auto and on (unset it for the default, off)";
      return false;
    }
    if (const char* k = std::getenv("CUSNAP_COLLECTIVE_KERNELS"); !collective_kernels_valid(k)) {
      *err = quoted("CUSNAP_COLLECTIVE_KERNELS", k) + " is not 1 to " +
             std::to_string(kMaxCollectiveKernelPrefixes) +
             " kernel name prefixes separated by commas, without blanks, " +
             std::to_string(kMaxCollectiveKernelsBytes) + " characters at most (unset it for " +
             "the default, " + kDefaultCollectiveKernels + ")";
      return false;
    }
  }
  if (supervisor) {
    for (const NumberSetting* s : kSupervisorNumberSettings)
      if (!env_number_checked(*s, &v, err)) return false;
    for (const TextSetting* s : kSupervisorTextSettings)
      if (!text_setting_checked(*s, std::getenv(s->name), err)) return false;
  }
  return true;
}

bool parse_timeout_seconds(const char* text, int64_t* out_ms) noexcept {
  return decimal_seconds_ms(text, 86400 * 365, out_ms);
}

bool control_timeout_checked(int64_t* out_ms, std::string* err) {
  const char* v = std::getenv("CUSNAP_CONTROL_TIMEOUT");
  if (!v || !*v || parse_timeout_seconds(v, out_ms)) return true;
  *err = quoted("CUSNAP_CONTROL_TIMEOUT", v) +
         " is not a number of seconds greater than 0 and at most 31536000, a year (unset it for "
         "the default, 10)";
  return false;
}

}  // namespace cusnap::proto
