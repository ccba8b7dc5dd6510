// Bulk copies between device memory and a file, for the checkpoint of shared
// memory: the bytes go through pinned staging buffers, reused chunk after
// chunk, on several streams, so the copy of one chunk overlaps the write (or
// read) of another. The calling thread must have a context current that can
// reach the device address.
//
// Staging: $CUSNAP_SHIM_STAGING_MIB MiB per buffer (default 64, 1..1024),
// four buffers. Where pinned memory cannot be had, pageable buffers and
// synchronous copies are used instead (slower, same result).
#pragma once

#include <cstdint>
#include <string>

#include "shim/entries.h"

namespace cusnap::shim::track {

/// Writes size bytes at device address src into fd, from file offset 0.
CUresult copy_to_fd(CUdeviceptr src, uint64_t size, int fd, std::string* err) noexcept;
/// Reads size bytes from fd (from offset 0) into device address dst; a file
/// shorter than size is an error.
CUresult copy_from_fd(int fd, CUdeviceptr dst, uint64_t size, std::string* err) noexcept;

}  // namespace cusnap::shim::track
