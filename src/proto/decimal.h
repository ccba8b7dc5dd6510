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

}  // namespace cusnap::proto
