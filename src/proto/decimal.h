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

}  // namespace cusnap::proto
