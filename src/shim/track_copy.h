// Bulk copies between device memory and a file, for the checkpoint of shared
// memory. Two paths, one file layout (part_bytes below): the files are
// byte-identical whichever path wrote them.
//
// Direct: each part file is mapped (save: MAP_SHARED read-write, after the
// ftruncate; load: MAP_SHARED read-only) window by window, each window
// registered with cuMemHostRegister (load: CU_MEMHOSTREGISTER_READ_ONLY where
// the device supports it) and copied by DMA straight between the device and
// the page cache, on one stream per worker; a worker maps and registers its
// next window while the DMA of its current one runs. No CPU copy.
//
// Staging: the bytes go through pinned staging buffers, reused chunk after
// chunk, by several workers on their own streams, so the copy of one chunk
// overlaps the write (or read) of another.
//
// $CUSNAP_SHIM_DIRECT_IO picks: off (default, and any value but auto/on):
// staging only. auto: tries the direct path and, where a window cannot be
// mapped or registered (the kernel refuses long-term pins of writable file
// mappings outside tmpfs/shmem; a driver may refuse file mappings), copies
// that window and every later one through the staging buffers instead, with
// one $CUSNAP_SHIM_DEBUG line; in auto a save uses the direct path only into
// files on tmpfs/shmem/hugetlbfs. on: the direct path only (any file system;
// a refusal is an error). Either way nothing stays mapped or registered when
// a copy returns.
//
// Why off by default: measured on an H200 (driver 580.159.04, kernel 6.18,
// 8 GiB, 8 workers, 128 MiB windows), cuMemHostRegister is the bound of the
// direct path and does not scale with threads: into /dev/shm save 1.8 GB/s
// (5.3 with the pages faulted in first by MADV_POPULATE_WRITE, as here)
// against 12.5 through staging, load 10.6-11.4 against 14.7; on a tmpfs
// mounted huge=always save 10.5 against 17.2, load 24-25 against 20.9. The
// DMA itself into registered file pages runs at 55 GB/s.
//
// The calling thread must have a context current that can reach the device
// address.
//
// Tuning: $CUSNAP_SHIM_STAGING_MIB MiB per staging buffer (default 32,
// 1..1024), $CUSNAP_SHIM_DIRECT_MIB MiB per direct window (default 128,
// 1..4096) and $CUSNAP_SHIM_COPY_THREADS workers (default: 8 on 16 or more
// CPUs, else half the CPUs; 1..64), one buffer or one stream each. Where
// pinned memory cannot be had, a staging worker uses a pageable buffer and
// synchronous copies (slower, same result). $CUSNAP_SHIM_COPY_LOG, a path:
// one line appended per save or load (bytes, parts, the path taken, windows
// direct and staged, seconds, GB/s, why it fell back) for benchmarks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shim/entries.h"

namespace cusnap::shim::track {

/// The bytes are split into fds.size() parts, in order: part k holds
/// [k * per, (k + 1) * per) of the allocation from its file's offset 0 (per:
/// part_bytes, ceil(size / parts) rounded up to 2 MiB). Separate files let
/// the workers write in parallel (a file system serializes writes to one
/// file).
uint64_t part_bytes(uint64_t size, size_t parts) noexcept;
/// Writes size bytes at device address src into the parts (each sized to
/// its length first). A descriptor opened write-only is reopened read-write
/// through /proc/self/fd for the direct path (mmap needs read access); where
/// that fails the part goes through the staging buffers (auto).
CUresult copy_to_fds(CUdeviceptr src, uint64_t size, const std::vector<int>& fds,
                     std::string* err) noexcept;
/// Reads size bytes from the parts into device address dst; a part shorter
/// than it should be is an error.
CUresult copy_from_fds(const std::vector<int>& fds, CUdeviceptr dst, uint64_t size,
                       std::string* err) noexcept;

}  // namespace cusnap::shim::track
