// Bytes as lowercase hex text and back.
#pragma once

#include <string>
#include <string_view>

namespace cusnap {

/// Two lowercase hex digits per byte.
std::string hex_encode(std::string_view bytes);
/// The bytes of lowercase hex text; false, *out unchanged, for anything else
/// (an odd length, a character that is not 0-9 or a-f).
bool hex_decode(std::string_view hex, std::string* out);

}  // namespace cusnap
