// Making a path given on the command line absolute, as the kernel would
// take it: the checkpoint directory, the runtime directory and base, the
// shim's path are recorded absolute (the job and the supervisor may change
// directory), and must name what the user's path named.
#pragma once

#include <string>
#include <system_error>

namespace cusnap {

/// p from the current directory, without '.', repeated or trailing '/', and
/// with each '..' taken from where the path before it leads, symbolic links
/// followed, as the kernel takes it: "link/../x" names x beside the link's
/// target, where a lexical normal form (std::filesystem's) would name x
/// beside the link. A path without '..' is left as written otherwise (its
/// links are not resolved). false with *ec when the current directory
/// cannot be found (removed).
bool absolute_path(const std::string& p, std::string* out, std::error_code* ec);

}  // namespace cusnap
