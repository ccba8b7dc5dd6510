// Whether bytes are well-formed UTF-8: paths cusnap records as JSON and
// uses again (runtime and checkpoint directories) must be, or JSON would
// carry another path (proto/json_text.h). And text cut at a character.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string_view>

namespace cusnap {

/// The length in bytes of the well-formed UTF-8 character at s[i] (no
/// overlong forms, surrogates or code points above U+10FFFF), 0 when none
/// starts there. i < s.size().
inline size_t utf8_char_bytes(std::string_view s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n;
  unsigned cp;
  if (c < 0x80) {
    return 1;
  } else if (c >= 0xc2 && c <= 0xdf) {
    n = 1, cp = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 2, cp = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 3, cp = c & 0x07;
  } else {
    return 0;
  }
  if (s.size() - i <= n) return 0;
  for (size_t k = 1; k <= n; ++k) {
    const unsigned char d = static_cast<unsigned char>(s[i + k]);
    if ((d & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (d & 0x3f);
  }
  if ((n == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
      (n == 3 && (cp < 0x10000 || cp > 0x10ffff)))
    return 0;
  return n + 1;
}

/// True when s is well-formed UTF-8.
inline bool valid_utf8(std::string_view s) {
  for (size_t i = 0, n; i < s.size(); i += n)
    if ((n = utf8_char_bytes(s, i)) == 0) return false;
  return true;
}

/// The first chars characters of s, never a part of one: a byte that starts
/// no well-formed character counts as one (as a terminal shows it).
inline std::string_view utf8_prefix(std::string_view s, size_t chars) {
  size_t i = 0;
  for (; i < s.size() && chars > 0; --chars) i += std::max<size_t>(utf8_char_bytes(s, i), 1);
  return s.substr(0, i);
}

/// The number of characters of s, counted as utf8_prefix counts them.
inline size_t utf8_length(std::string_view s) {
  size_t chars = 0;
  for (size_t i = 0; i < s.size(); ++chars) i += std::max<size_t>(utf8_char_bytes(s, i), 1);
  return chars;
}

}  // namespace cusnap
