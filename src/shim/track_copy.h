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
#include <vector>

#include "shim/entries.h"

namespace cusnap::shim::track {

/// The bytes are split into fds.size() parts, in order: part
/// k holds [k * per, (k + 1) * per) of the allocation from its file's offset
/// 0 (per: part_bytes, ceil(size / parts) rounded up to 2 MiB). Separate files let the workers write in parallel
/// (a file system serializes writes to one file).
uint64_t part_bytes(uint64_t size, size_t parts) noexcept;
/// Writes size bytes at device address src into the parts.
CUresult copy_to_fds(CUdeviceptr src, uint64_t size, const std::vector<int>& fds,
                     std::string* err) noexcept;
/// Reads size bytes from the parts into device address dst; a part shorter
/// than it should be is an error.
CUresult copy_from_fds(const std::vector<int>& fds, CUdeviceptr dst, uint64_t size,
                       std::string* err) noexcept;

}  // namespace cusnap::shim::track
