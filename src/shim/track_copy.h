// Bulk copies between device memory and a file, for the checkpoint of shared
// memory: the bytes go through pinned staging buffers, reused chunk after
// chunk, by several workers on their own streams, so the copy of one chunk
// overlaps the write (or read) of another. The calling thread must have a
// context current that can reach the device address.
//
// Tuning: $CUSNAP_SHIM_STAGING_MIB MiB per buffer (default 32, 1..1024) and
// $CUSNAP_SHIM_COPY_THREADS workers (default: 8 on 16 or more CPUs, else half
// the CPUs; 1..64), one buffer each. Where pinned memory cannot be had, a
// worker uses a pageable buffer and synchronous copies (slower, same result).
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
