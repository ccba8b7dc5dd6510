// Reading a whole small file, bounded: the one reader behind the manifest,
// the runtime directory's job.json and the /proc files the coordinator reads.
// It opens non-blocking (a FIFO put where a file is expected does not hang
// it), refuses what is not a regular file (a device such as /dev/zero would
// never end) and stops at a size limit, before reading where the size is
// known (/proc files report 0 and are limited as they are read).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>

namespace cusnap {

struct FileReadLimits {
  size_t max_bytes = size_t(1) << 20;
  bool no_follow = false;  ///< refuse a symbolic link (O_NOFOLLOW)
  /// What the file is, for the message of one too large: "... more than
  /// KIND can be (N bytes)".
  const char* kind = "such a file";
  /// Read only the first max_bytes of a larger file (a log's head) instead
  /// of refusing it.
  bool prefix = false;
};

/// Reads the whole file at path into *out. False when it cannot be opened or
/// read, is not a regular file, or holds more than limits.max_bytes; then
/// *err (when given) says so, naming the path, and *error_number (when given)
/// is the errno of a failed open or read (0 for the other cases).
bool read_file_bounded(const std::string& path, const FileReadLimits& limits, std::string* out,
                       std::string* err = nullptr, int* error_number = nullptr);

}  // namespace cusnap
