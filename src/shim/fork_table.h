// The fork table (fork_table.cpp): the descriptors the shim
// holds for a while in the application's process (the listeners'
// connections and the parts of a save or load; an importer's connection to
// the creator and the export it fetched; the direct path's reopened part
// files), with the identity (device, inode) of the file each names. A child
// the application forks closes each that still names that file in its fork
// handler (fstat and close only), so it keeps none of them: a copy would keep
// a connection open after the shim closed it, a file of a checkpoint (or a
// memory file's pages), or the creator's device memory alive. The table's
// lock, which the fork's prepare handler holds, covers what makes a
// descriptor with its entry and an entry's removal with the close, and is
// never held across a wait nor a driver call. Lock order: the main lock,
// then State::cache_mu, then the table's lock (an importer and the bulk
// copies take it alone).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <mutex>

#include "proto/unique_fd.h"
#include "shim/held_fd.h"

namespace cusnap::shim::track {

/// A descriptor in the fork table while it is held. Closed, out of the
/// table, only while its number still names the file it was; let go
/// otherwise (the application closed it and may have reused the number).
class ListedFd {
 public:
  ListedFd() = default;
  ListedFd(ListedFd&& o) noexcept;
  ListedFd& operator=(ListedFd&& o) noexcept;
  ListedFd(const ListedFd&) = delete;
  ListedFd& operator=(const ListedFd&) = delete;
  ~ListedFd() { reset(); }

  /// Takes fd in (the table's lock held, in one step with what made fd);
  /// false, fd left with the caller, when the table has no room.
  bool take_locked(UniqueFd& fd);
  /// Takes fd as take_locked does, outside the table (no room there).
  void hold_unlisted_locked(UniqueFd& fd);
  int get() const { return fd_.get(); }
  explicit operator bool() const { return static_cast<bool>(fd_); }
  /// Whether the number still names the file taken in.
  bool ours() const { return fd_ && id_.ours(); }
  void reset();
  /// Out of the table, not closed: the number, now the caller's (-1 when
  /// empty).
  int release();

 private:
  void reset_locked();

  UniqueFd fd_;
  HeldFd id_;
  std::ptrdiff_t slot_ = -1;
};

/// Opens path (flags | O_CLOEXEC) into *out, entered in the fork table.
/// no_wait (an open that cannot wait: a file on tmpfs, opened again): the
/// open and the entry in one step as a fork sees it; otherwise the open
/// holds no lock and the entry follows it, so a fork between the two copies
/// the descriptor. With no room in the table the descriptor is held outside
/// it. false and errno when the open fails.
bool open_listed(const char* path, int flags, bool no_wait, ListedFd* out) noexcept;

/// A descriptor the driver just made (an export), into *out: close-on-exec,
/// moved to a high number (high_number) and entered in the fork table in
/// one step as a fork sees it, so that it is held in the table until it
/// enters the export cache. Before it is entered (from its making inside the
/// driver until the driver's call returns and this takes the table's lock) a
/// fork copies it: no lock is held across a driver call.
void list_new(int fd, ListedFd* out) noexcept;

/// The export cache's descriptor h, which the caller (State::cache_mu held)
/// takes out of the cache, into the fork table until it is closed (reset):
/// at a fork it is in the one or the other. Empty when h's number no longer
/// names its file (the application's since: left alone).
ListedFd list_held(const HeldFd& h) noexcept;

/// mmap(nullptr, len, prot, MAP_SHARED, fd, off) kept out of every child
/// (MADV_DONTFORK): a child the application forks gets no copy of the
/// mapping (which would keep the file's pages, or a checkpoint's file, in a
/// process that never saw it). no_wait (a file on tmpfs, whose mmap cannot
/// wait): the two in one step as a fork sees it; otherwise the mmap holds no
/// lock (a network file system may revalidate with its server) and a fork
/// between the two copies the mapping. MAP_FAILED and errno as mmap's, or
/// madvise's (nothing left mapped).
void* map_unforked(size_t len, int prot, int fd, off_t off, bool no_wait) noexcept;

/// Connections each of the shim's two listeners keeps open at once
/// (track_server.cpp); the table has room for all of them.
inline constexpr size_t kMaxListenerConnections = 8;

// The table itself, for the listeners' and importers' connections
// (track_server.cpp, Conn), which make a socket and enter it, or take one
// out and close it, in one step under the table's lock.

/// The table's lock (the fork's prepare handler holds it).
std::mutex& fork_table_mutex() noexcept;
/// Enters fd (the lock held): its slot, or -1 when the table is full (never
/// while the listeners keep to their limits) or fstat fails.
std::ptrdiff_t fork_table_enter_locked(int fd) noexcept;
/// The entry at slot, a slot fork_table_enter_locked gave (the lock held):
/// fd with the identity of the file it named then.
HeldFd fork_table_entry_locked(std::ptrdiff_t slot) noexcept;
/// Empties slot (the lock held); nothing for -1.
void fork_table_clear_locked(std::ptrdiff_t slot) noexcept;

}  // namespace cusnap::shim::track
