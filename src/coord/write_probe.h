// Whether a directory can take a file now: a full file system (a tmpfs in
// /run or /tmp, most often) is said before work that needs it starts, not as
// a missing log or a job nothing can find.
#pragma once

#include <string>

namespace cusnap {

/// Writes a page to path (a file name of the caller's, in the directory to
/// test), syncs it and removes it. false + *err ("cannot write DIR: No space
/// left on device"; out of descriptors, what to do) when any step fails,
/// and *error_number (when given) the errno of the step.
bool probe_write(const std::string& path, const std::string& what, std::string* err,
                 int* error_number = nullptr);

}  // namespace cusnap
