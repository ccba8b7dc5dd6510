// An unsigned number in decimal, without allocation (async-signal-safe): for
// code that runs where malloc may not (a forked child of a threaded process,
// the shim inside an application's fork).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cusnap::proto {

/// The most characters format_decimal writes (2^64 - 1 has 20 digits).
inline constexpr size_t kDecimalMax = 20;

/// Writes v's decimal digits to out (room for kDecimalMax characters, no
/// terminating NUL); returns how many.
inline size_t format_decimal(uint64_t v, char* out) noexcept {
  char reversed[kDecimalMax];
  size_t n = 0;
  do reversed[n++] = char('0' + v % 10);
  while ((v /= 10) != 0);
  for (size_t i = 0; i < n; ++i) out[i] = reversed[n - 1 - i];
  return n;
}

/// True when text is a plain decimal: digits, then a point and digits if any
/// ("10", "2.5"; not "0x10", "1e3", "+5", " 5", "inf", ".5" or "5.", all of
/// which strtod takes).
inline bool plain_decimal(const char* text) noexcept {
  const char* c = text;
  const auto digits = [&c] {
    const char* from = c;
    while (*c >= '0' && *c <= '9') ++c;
    return c > from;
  };
  return text && digits() && (*c != '.' || (++c, digits())) && *c == '\0';
}

/// A plain decimal number of seconds (plain_decimal) in milliseconds, to the
/// nearest (1 for a value above 0 that rounds to 0): false when text is not
/// one, or is 0, or is above max_seconds. Integer arithmetic, not strtod,
/// which reads the point by the locale's rules: the shim reads its settings
/// inside an application that may have set a locale with a decimal comma,
/// where strtod takes "2.5" for 2.
inline bool decimal_seconds_ms(const char* text, uint64_t max_seconds, int64_t* out_ms) noexcept {
  if (!plain_decimal(text)) return false;
  const char* c = text;
  uint64_t whole = 0;
  for (; *c >= '0' && *c <= '9'; ++c) {
    whole = whole * 10 + uint64_t(*c - '0');
    if (whole > max_seconds) return false;
  }
  uint64_t ms = 0;                          // the first three digits after the point
  bool fraction = false, round_up = false;  // a digit after the point above 0; the fourth's
  int place = 0;
  for (c += *c == '.'; *c; ++c, ++place) {
    const int d = *c - '0';
    fraction = fraction || d != 0;
    if (place < 3) ms = ms * 10 + uint64_t(d);
    if (place == 3) round_up = d >= 5;
  }
  for (; place < 3; ++place) ms *= 10;
  if ((whole == 0 && !fraction) || (whole == max_seconds && fraction)) return false;
  ms += whole * 1000 + (round_up ? 1 : 0);
  *out_ms = int64_t(ms < 1 ? 1 : ms);
  return true;
}

}  // namespace cusnap::proto
