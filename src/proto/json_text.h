// JSON as text without throwing on bytes that are not UTF-8. Job arguments,
// working directories and process command lines come from users and /proc
// as raw bytes; nlohmann's dump() throws on invalid UTF-8, which must never
// end a supervisor or lose a checkpoint. Text that is only shown (argv, cwd,
// a process's command line) has each invalid byte replaced by U+FFFD; paths
// cusnap uses again (runtime and checkpoint directories) are refused up
// front unless valid_utf8 (proto/utf8.h).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace cusnap {

/// j as text (indent as nlohmann's dump), invalid UTF-8 replaced, never throws
/// for that reason.
inline std::string json_text(const nlohmann::json& j, int indent = -1) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace cusnap
