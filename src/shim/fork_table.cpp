// The fork table (fork_table.h): its room, its lock and its entries; the
// descriptors held in it (ListedFd, open_listed, list_new, list_held), the
// mappings kept out of children (map_unforked), and the fork handlers that
// close a child's copies.
#include "shim/fork_table.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <iterator>
#include <utility>

#include "proto/shim_messages.h"
#include "shim/track_state.h"

namespace cusnap::shim::track {

namespace {

/// Fetched exports g_conn_fds keeps room for: application threads importing
/// at once (and the control listener's reimport). One fetched beyond that is
/// held outside the table: the import goes on, a child forked meanwhile
/// keeps a copy.
constexpr size_t kFetchedFds = 32;
/// Importers' connections to creators g_conn_fds keeps room for (as many);
/// one beyond that is held outside the table.
constexpr size_t kImportConns = kFetchedFds;
/// The direct path's part files reopened (one save or load at a time).
constexpr size_t kReopenedParts = proto::kMaxParts;
/// Entries g_conn_fds has room for: both listeners' connections; the parts
/// of a save or load a control connection holds while they arrive (at most
/// proto::kMaxParts, the one a request just brought included); on the peer
/// listener, a descriptor a request brought and the export being sent; the
/// exports importers fetched and their connections to the creators; the
/// part files the direct path reopened.
constexpr size_t kHeldFds = 2 * kMaxListenerConnections +
                            kMaxListenerConnections * proto::kMaxParts + 2 + kFetchedFds +
                            kImportConns + kReopenedParts;

/// The fork table (fork_table.h): the descriptors both listeners hold, the
/// exports importers fetched and their connections to the creators
/// (fetch_descriptor, in application threads), and the part files the direct
/// path reopened (open_listed), with the identity of the file
/// each names, for a child the application forks to close (the fork handlers
/// below): descriptors the child did not make. A copy there would keep a
/// connection the listener closed open, so its client would not see the end;
/// keep a part file of a checkpoint open, or a memory file's pages, in a
/// process that never saw it; or keep the creator's device memory alive
/// through a copy of its export. g_conn_mu is held only around what makes a
/// descriptor (an accept, a socket, the receipt of a request or a fetch's
/// reply whose bytes have all arrived, a dup, an open that cannot wait) and
/// its entry, and around the direct path's mmap with its MADV_DONTFORK, and around an entry's
/// removal and the close (a regular file's close, which may write back its
/// pages, holds no lock and comes before its entry's removal:
/// ListedFd::reset), never across a wait nor a driver call, and by the
/// fork's prepare handler: at a fork every descriptor a listener or an import
/// holds is in the table, and none in it was closed by the shim but such a
/// file whose close is under way. Lock order:
/// State::cache_mu, then g_conn_mu (an importer and the bulk copies take
/// g_conn_mu alone). One a
/// channel closed itself (a request the stream cannot recover from) stays in
/// the table until the listener drops it; the child checks the identity
/// first, so a number the application reused meanwhile is left alone.
std::mutex g_conn_mu;
HeldFd g_conn_fds[kHeldFds];

}  // namespace

std::mutex& fork_table_mutex() noexcept {
  return g_conn_mu;
}

std::ptrdiff_t fork_table_enter_locked(int fd) noexcept {
  auto* free = std::find_if(std::begin(g_conn_fds), std::end(g_conn_fds),
                            [](const HeldFd& h) { return h.fd < 0; });
  if (free == std::end(g_conn_fds)) return -1;
  *free = HeldFd::of(fd);
  return free->fd < 0 ? -1 : free - std::begin(g_conn_fds);
}

HeldFd fork_table_entry_locked(std::ptrdiff_t slot) noexcept {
  return g_conn_fds[slot];
}

void fork_table_clear_locked(std::ptrdiff_t slot) noexcept {
  if (slot >= 0) g_conn_fds[slot] = HeldFd{};
}

ListedFd::ListedFd(ListedFd&& o) noexcept
    : fd_(std::move(o.fd_)), id_(o.id_), slot_(std::exchange(o.slot_, -1)) {}

ListedFd& ListedFd::operator=(ListedFd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = std::move(o.fd_);
    id_ = o.id_;
    slot_ = std::exchange(o.slot_, -1);
  }
  return *this;
}

bool ListedFd::take_locked(UniqueFd& fd) {
  const std::ptrdiff_t slot = fork_table_enter_locked(fd.get());
  if (slot < 0) return false;
  reset_locked();
  fd_ = std::move(fd);
  id_ = g_conn_fds[slot];
  slot_ = slot;
  return true;
}

void ListedFd::hold_unlisted_locked(UniqueFd& fd) {
  reset_locked();
  id_ = HeldFd::of(fd.get());
  fd_ = std::move(fd);
}

int ListedFd::release() {
  std::lock_guard<std::mutex> l(g_conn_mu);
  if (slot_ >= 0) g_conn_fds[slot_] = HeldFd{};
  slot_ = -1;
  return fd_.release();
}

void list_new(int fd, ListedFd* out) noexcept {
  out->reset();
  if (fd < 0) return;
  std::lock_guard<std::mutex> l(g_conn_mu);
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  UniqueFd u(high_number(fd));
  if (!out->take_locked(u)) out->hold_unlisted_locked(u);  // no room: held outside it
}

ListedFd list_held(const HeldFd& h) noexcept {
  ListedFd out;
  if (!h.ours()) return out;
  std::lock_guard<std::mutex> l(g_conn_mu);
  UniqueFd u(h.fd);
  if (!out.take_locked(u)) out.hold_unlisted_locked(u);  // no room: held outside it
  return out;
}

void ListedFd::reset() {
  if (!fd_ && slot_ < 0) return;
  // A regular file's close may write its dirty pages back (NFS, FUSE: a part
  // file the direct path wrote through its mapping), for as long as that
  // takes; under g_conn_mu it would hold up every fork of the application
  // (the prepare handler takes it), every import and both listeners. So it
  // is closed holding no lock, its entry removed only after the close: a
  // fork before the close copies it and the child closes its copy (the
  // entry is there); after it, the child has no copy, and a number reused
  // meanwhile names another file, which the child's identity check leaves
  // alone (only the shim itself could have opened the same file there, and
  // then its own entry asks the child to close it too). Taking the entry
  // out first instead would let a fork in between copy the file into a
  // child that never closes it. Other descriptors (sockets, the driver's
  // device files, whose numbers the driver reopens with the same identity)
  // are closed under the lock, as before.
  struct stat st {};
  if (fd_ && ::fstat(fd_.get(), &st) == 0 && S_ISREG(st.st_mode) && st.st_dev == id_.dev &&
      st.st_ino == id_.ino) {
    fd_.reset();
    if (slot_ < 0) return;  // held outside the table (it had no room)
    std::lock_guard<std::mutex> l(g_conn_mu);
    g_conn_fds[slot_] = HeldFd{};
    slot_ = -1;
    return;
  }
  std::lock_guard<std::mutex> l(g_conn_mu);
  reset_locked();
}

void ListedFd::reset_locked() {
  if (slot_ >= 0) g_conn_fds[slot_] = HeldFd{};
  slot_ = -1;
  if (!ours()) fd_.release();  // the application's number now: left alone
  fd_.reset();
}

bool open_listed(const char* path, int flags, bool no_wait, ListedFd* out) noexcept {
  out->reset();
  std::unique_lock<std::mutex> l(g_conn_mu, std::defer_lock);
  if (no_wait) l.lock();
  UniqueFd fd(::open(path, flags | O_CLOEXEC));
  if (!fd) return false;
  if (!no_wait) l.lock();
  if (!out->take_locked(fd)) out->hold_unlisted_locked(fd);  // no room: the open goes on
  return true;
}

void* map_unforked(size_t len, int prot, int fd, off_t off, bool no_wait) noexcept {
  std::unique_lock<std::mutex> l(g_conn_mu, std::defer_lock);
  if (no_wait) l.lock();
  void* p = ::mmap(nullptr, len, prot, MAP_SHARED, fd, off);
  if (p == MAP_FAILED) return p;
  if (!no_wait) l.lock();
  if (::madvise(p, len, MADV_DONTFORK) != 0) {
    const int saved = errno;
    ::munmap(p, len);
    errno = saved;
    return MAP_FAILED;
  }
  return p;
}

void conns_atfork_prepare() noexcept {
  g_conn_mu.lock();
}
void conns_atfork_parent() noexcept {
  g_conn_mu.unlock();
}
void conns_atfork_child() noexcept {
  for (auto& h : g_conn_fds) h.close_if_ours();  // fstat and close only
  g_conn_mu.unlock();
}

}  // namespace cusnap::shim::track
