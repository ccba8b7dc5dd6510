// Helpers shared by the files of the bulk copies (track_copy.h):
// track_copy.cpp (the workers, the pieces they take, the two paths) and
// track_copy_files.cpp (the tuning settings, the reads and writes of the
// staging path, the part files and windows of the direct path).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>

#include "shim/entries.h"
#include "shim/fork_table.h"

namespace cusnap::shim::track {

// Settings, each read once from the environment (track_copy.h, "Tuning").

/// Bytes of one staging chunk: $CUSNAP_SHIM_STAGING_MIB MiB.
uint64_t chunk_bytes();
/// Bytes of one direct window: whole MiB, so every window starts on a page.
uint64_t window_bytes();

enum class DirectMode { kAuto, kOn, kOff };

/// $CUSNAP_SHIM_DIRECT_IO.
DirectMode direct_mode();
/// Workers of one copy: $CUSNAP_SHIM_COPY_THREADS, or from the number of CPUs.
unsigned worker_count();

// The staging path's file I/O.

/// Writes n bytes from p at offset off of fd; false and *err on failure.
bool write_all(int fd, const void* p, uint64_t n, uint64_t off, std::string* err);
/// Reads n bytes at offset off of fd into p; false and *err on failure
/// (a file that ends early included).
bool read_all(int fd, void* p, uint64_t n, uint64_t off, std::string* err);

// The direct path's part files.

/// One part file as the direct path sees it: a descriptor it can map (the
/// given one, or the same file reopened with read access), its size, and
/// why it cannot be mapped (empty when it can).
struct PartFile {
  int fd = -1;
  ListedFd reopened;  ///< in the fork table (fork_table.h)
  uint64_t size = 0;
  /// On tmpfs/shmem/hugetlbfs/ramfs: opening and mapping it cannot wait.
  bool shmem = false;
  std::string refused;
};

/// Readies fds[k] for mapping: save needs read-write access (mmap of a
/// shared writable mapping needs a readable descriptor), load read access.
/// A descriptor with too little access is reopened through /proc/self/fd
/// (the same file: checked by device and inode), into the fork table: a
/// child the application forks during the copy keeps no copy of it.
void prepare_part(int fd, bool save, bool shmem_only, PartFile* p);

/// One window of a part file, mapped (out of every child the application
/// forks: map_unforked) and registered; a DMA into or out of
/// it may be queued on a stream. The destructor waits for that DMA, then
/// unregisters and unmaps: nothing outlives it.
class Window {
 public:
  Window() = default;
  ~Window() { close(); }
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;

  /// Maps [off, off + len) of f and registers it. False and *why when the
  /// kernel or the driver refuses (nothing is left behind then).
  bool open(const PartFile& f, uint64_t off, uint64_t len, bool writable, bool read_only_flag,
            bool populate, std::string* why);

  void* addr() const { return addr_; }
  /// A DMA on s uses the window: the destructor waits for s.
  void queued_on(CUstream s) { pending_ = s; }
  /// Waits for the queued DMA.
  CUresult wait();

 private:
  void close();

  void* addr_ = nullptr;
  uint64_t len_ = 0;
  bool registered_ = false;
  CUstream pending_ = nullptr;
};

}  // namespace cusnap::shim::track
