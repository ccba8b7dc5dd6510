// Internal state of the tracker (track.h states the locking contract).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "proto/shim_messages.h"
#include "shim/entries.h"
#include "shim/held_fd.h"
#include "shim/real_driver.h"
#include "shim/rw_lock.h"

/// The real driver's function `name` (nullptr when the driver lacks it).
#define REAL(name) reinterpret_cast<decltype(&::name)>(real_entry(index_of(Entry::name)))

namespace cusnap::shim::track {

/// Logical handles: tag in the top 16 bits (a non-canonical address, above any
/// handle value the driver gives out), then a 48-bit serial that never repeats
/// within a process, so a stale handle is one absent from the table.
inline constexpr uint64_t kHandleTag = 0xC5A9ull << 48;
inline constexpr bool is_logical(uint64_t h) {
  return (h >> 48) == (kHandleTag >> 48);
}

/// Names an allocation across processes.
struct AllocKey {
  int64_t pid = 0;
  uint64_t start = 0;
  uint64_t id = 0;
  bool operator==(const AllocKey&) const = default;
};
struct AllocKeyHash {
  size_t operator()(const AllocKey& k) const noexcept {
    return std::hash<uint64_t>()(k.id * 0x9E3779B97F4A7C15ull ^ uint64_t(k.pid) << 20 ^ k.start);
  }
};

struct Alloc {
  enum class Origin { kCreated, kImported, kForeign } origin = Origin::kCreated;
  AllocKey key;  ///< creator's name for it (foreign: pid 0)
  uint64_t size = 0;
  int32_t device = 0;
  CUmemGenericAllocationHandle driver = 0;  ///< the one driver handle in this process
  bool driver_held = true;                  ///< false once the last logical handle released it
  uint32_t handles = 0;                     ///< logical handles alive
  uint32_t pins = 0;                        ///< internal owners: a cuMemAlloc block, IPC opens
  uint32_t mappings = 0;
  bool exported = false;
  bool legacy = false;  ///< backs a cuMemAlloc block or an IPC open
  CUmemAllocationProp prop{};  ///< as created (imported: as the driver reports it)
  // Checkpoint of shared memory (track_ckpt.cpp).
  bool saved = false;     ///< its bytes were saved (created here): it may be released
  bool released = false;  ///< unmapped and released; the reservations stay
  bool held_before = true;  ///< driver_held when it was released
  uint64_t generation = 0;  ///< proto::AllocationRecord::generation
};

/// What the application asked of a mapping the shim made for it: the
/// driver's answers for the block or open are these, not the mapping's
/// (the shim's mapping is whole granules).
struct BlockAsked {
  enum class Kind : uint8_t {
    kNone,    ///< no such mapping: a VMM mapping of the application's
    kServed,  ///< a cuMemAlloc block the shim serves (track_legacy.cpp)
    /// A legacy IPC open of the shim's of a block another process exported
    /// (track_ipc.cpp): on the driver only the bytes the exporter asked
    /// (measured on an H100: tests/gpu/probes/alloc_sizes.cpp ipc_tail).
    kOpened,
  };
  Kind kind = Kind::kNone;
  /// A served block: the context current when the shim served it (the
  /// driver frees a context's blocks when the context goes, the shim too).
  /// An open: the context it was opened in. The pointer queries name it
  /// (CU_POINTER_ATTRIBUTE_CONTEXT; alloc_sizes.cpp ipc_attrs: the
  /// mapping's own answer is none).
  CUcontext ctx = nullptr;
  uint64_t bytes = 0;  ///< the size asked (the mapping is rounded up): past it, its tail
  /// CU_POINTER_ATTRIBUTE_SYNC_MEMOPS as the application last set it: the
  /// block's own attribute on the driver, read the same whichever context
  /// is current (alloc_sizes.cpp ctx_attrs); the mapping's reads 0
  /// (track_queries.cpp, pointer_set_attr).
  bool sync_memops = false;
};

struct Mapping {
  uint64_t size = 0;
  uint64_t offset = 0;
  uint64_t alloc = 0;      ///< local allocation id, 0 for a multicast object
  uint64_t handle = 0;     ///< the logical handle it was mapped with (0: none)
  uint64_t multicast = 0;  ///< driver multicast handle mapped here, if any
  /// A block the shim serves or a legacy IPC open of the shim's: what was
  /// asked of it (kind kNone: neither, a VMM mapping of the application's).
  BlockAsked asked;
  /// The access set on the mapping. A served block's: its own device's, and
  /// each peer's granted through peer access (track_peers.cpp), the only way
  /// to a block, as the application cannot set a block's access.
  std::vector<proto::AccessRecord> access;
};

/// A cuCtxEnablePeerAccess in force: `ctx` (on device `from`) may access
/// memory allocated in `peer` (on device `to`).
struct PeerGrant {
  CUcontext ctx = nullptr;
  CUcontext peer = nullptr;
  int32_t from = 0;
  int32_t to = 0;
};

struct IpcOpen {
  CUcontext ctx = nullptr;
  uint64_t alloc = 0;
  uint64_t address = 0;
  uint64_t size = 0;
  uint32_t opens = 0;
  CUdevice dev = -1;  ///< ctx's device (the shim's opens): one live context of a device has it open
};

struct State {
  std::mutex mu;  ///< main lock: everything below except the export cache
  uint64_t next_alloc = 1;
  uint64_t next_handle = 1;
  std::unordered_map<uint64_t, Alloc> allocs;                   ///< local id -> allocation
  std::unordered_map<AllocKey, uint64_t, AllocKeyHash> by_key;  ///< creator name -> local id
  std::unordered_map<uint64_t, uint64_t> handles;               ///< logical handle -> local id
  /// References a logical handle holds beyond its first: each
  /// cuMemRetainAllocationHandle of a mapping returns the handle it was
  /// mapped with, as the driver's does, and adds one; each cuMemRelease
  /// takes one. Absent: one reference (track_vmm.cpp).
  std::unordered_map<uint64_t, uint32_t> handle_refs;
  std::map<uint64_t, Mapping> ranges;                    ///< sorted range index: address -> mapping
  std::unordered_map<uint64_t, uint64_t> legacy_blocks;  ///< cuMemAlloc address -> local id
  /// A block the shim serves or a legacy IPC open of the shim's
  /// (Mapping::asked) asked for fewer bytes than its
  /// mapping has: the tail, from the end of the bytes asked to the mapping's
  /// end, is memory the driver's block lacks.
  struct Tail {
    uint64_t asked_end = 0;  ///< address + bytes asked
    uint64_t end = 0;        ///< address + the mapping's size
  };
  /// The blocks with a tail, by address: what the range check of every copy
  /// and memset looks up (track_queries.cpp, past_block), under tails_mu
  /// alone (shared), so that copies on many threads neither wait for one
  /// another nor for s.mu. Changed only under s.mu and then tails_mu
  /// (exclusive), beside the block's or the open's record (set_tail and
  /// drop_tail); never s.mu under tails_mu. A writer waiting goes before
  /// readers after it.
  std::map<uint64_t, Tail> tails;
  WriterFirstLock tails_mu;
  /// tails.size(), read with no lock: while no block has a tail, a copy or
  /// memset is not looked up.
  std::atomic<size_t> tailed_blocks{0};
  /// Blocks of legacy_blocks the application freed during a stream capture,
  /// freed at its first cuMemFree or cuMemFreeAsync after the capture
  /// (track_legacy.cpp).
  std::vector<uint64_t> deferred_frees;
  /// Blocks of legacy_blocks freed with cuMemFreeAsync: each goes once its
  /// event (recorded on the free's stream) has completed, at a later
  /// cuMemAlloc or free (track_legacy.cpp, reap_pending).
  struct PendingFree {
    uint64_t addr = 0;
    uint64_t id = 0;
    CUevent event = nullptr;
    CUcontext ctx = nullptr;  ///< the event's (current at the free): it goes with it
  };
  std::vector<PendingFree> pending_frees;
  std::atomic<size_t> pending_count{0};  ///< pending_frees.size(), read without s.mu
  /// One reaper at a time queries and destroys the pending frees' events
  /// (track_legacy.cpp, reap_pending), and none while a context goes
  /// (ReapHold): an event is never queried after it was destroyed. Taken
  /// before s.mu, never while it is held.
  std::mutex reap_mu;
  /// Held across a peer grant's or revocation's cuMemSetAccess
  /// (track_peers.cpp) and across a dropped block's unmap and address free
  /// (drop_block): an address a grant or revocation names is not freed, and
  /// so not another block's, before the call is done. Taken before s.mu,
  /// never while it is held; after reap_mu.
  std::mutex access_mu;
  std::vector<IpcOpen> ipc;
  std::vector<PeerGrant> peers;  ///< peer access enabled through the shim
  std::vector<CUcontext> contexts;  ///< created by the application, alive
  std::unordered_map<uint64_t, proto::MulticastRecord> multicast;  ///< by the application's handle
  /// The application's multicast handle -> the driver's, for objects a
  /// checkpoint rebuilt (the application keeps using the handle it got).
  std::unordered_map<uint64_t, uint64_t> mc_driver;
  bool mc_released = false;  ///< multicast objects torn down by a checkpoint
  uint64_t foreign_alive = 0;
  uint64_t foreign_total = 0;
  /// cuMemAlloc blocks the shim could not serve and left to the driver
  /// (track_legacy.cpp's fall-back), alive: address -> size and the context
  /// it was allocated in (it goes with it: track_contexts.cpp). Untracked; an
  /// IPC handle of one is the driver's, and its opener counts it foreign.
  struct DriverBlock {
    uint64_t size = 0;
    CUcontext ctx = nullptr;
  };
  std::map<uint64_t, DriverBlock> driver_blocks;
  /// IPC handles of driver_blocks handed out (ShimRecords::driver_ipc_exports).
  uint64_t driver_ipc_exports = 0;
  /// Why the first block was left to the driver ("cuMemCreate gave 2").
  char driver_block_why[96] = "";
  /// ShimRecords::sharing_calls; bumped without the lock, before the driver call.
  std::atomic<uint64_t> sharing_calls{0};

  std::mutex cache_mu;  ///< export cache only; the peer listener takes nothing else
  std::unordered_map<uint64_t, HeldFd> cache;  ///< local id (created here) -> real descriptor
  /// What the peer listener tells an importer of a cached descriptor: the
  /// generation of the allocation it names, and its size.
  struct CachedExport {
    uint64_t generation = 0;
    uint64_t size = 0;
  };
  std::unordered_map<uint64_t, CachedExport> cache_meta;  ///< local id -> its cached descriptor's

  // Fixed once tracking starts in this process.
  std::string runtime_dir;
  std::string peer_path, ctl_path;
  int64_t pid = 0;
  uint64_t start_time = 0;
  uid_t uid = 0;
  int peer_listen = -1, ctl_listen = -1;  ///< checked with listener_is_ours before each use
};

State& state() noexcept;

/// Counts a sharing call the application began (ShimRecords::sharing_calls);
/// called before the call reaches the driver.
inline void note_sharing_call(State& s) noexcept { s.sharing_calls.fetch_add(1); }

/// Start time of this process (clock ticks after boot, /proc/self/stat field 22).
uint64_t process_start_time(pid_t pid) noexcept;

/// Listener threads (track_server.cpp). Binds both sockets and starts serving;
/// false when they cannot be set up (tracking then stays off in this process).
bool start_servers(State& s) noexcept;
/// Fork handlers for the listeners' connections (track.cpp calls them): the
/// table of their descriptors stays locked across fork; the child closes
/// each that still names the parent's socket, and starts with an empty table.
void conns_atfork_prepare() noexcept;
void conns_atfork_parent() noexcept;
void conns_atfork_child() noexcept;
/// Whether fd is still the shim's listening socket: listening, and bound to
/// path. An application may close it and reuse the number; checked by
/// address, not inode, because CRIU restores the socket as a new file.
bool listener_is_ours(int fd, const std::string& path) noexcept;
/// Closes the listening socket fd if it is still the shim's; sets it to -1.
void close_listener(int* fd, const std::string& path) noexcept;
/// Asks the creator named by t for the real descriptor, calls use(fd) with
/// it (use must not throw) and closes it; false and *err on failure, use not
/// called. *generation (when given) gets the generation of the allocation it
/// names. From its receipt to its close the descriptor is in the fork table
/// (fork_table.h), and so is the connection to the creator from its socket to
/// its close, so a child another thread forks meanwhile closes its copies (of
/// the export, which would keep the creator's memory alive, and of the
/// connection); that table's lock is taken alone, never across a wait (the
/// connect included) nor across use.
bool fetch_descriptor(const proto::Ticket& t, std::string* err, uint64_t* generation,
                      const std::function<void(int fd)>& use) noexcept;
/// The records, for inspection. Takes s.mu.
proto::ShimRecords snapshot(State& s);
/// The checkpoint of shared memory, on the control listener's thread with the
/// gate closed (track_ckpt.cpp). Each returns the reply to send.
/// drain: go_on (when given) is asked before each synchronize; false ends
/// the drain, ECANCELED.
proto::Done drain(State& s, const std::function<bool()>& go_on = nullptr) noexcept;
/// drain on a thread of its own, waited for timeout_ms at most (never
/// longer: 0 waits not at all; the caller picks a bound for a request that
/// names none); past it ETIMEDOUT, the drain given up: it ends after the
/// synchronize it is in (drain_thread.cpp). A drain
/// still running from an earlier request is waited for first, then a fresh
/// one runs: what the old one finds is not about now.
proto::Done drain_within(State& s, uint64_t timeout_ms) noexcept;
void drain_atfork_prepare() noexcept;
void drain_atfork_parent() noexcept;
void drain_atfork_child() noexcept;
proto::Done save_allocation(State& s, uint64_t id, const std::vector<int>& fds) noexcept;
proto::Done release_shared(State& s, const std::string& origin) noexcept;
/// Whether memory a release took away is still gone (an allocation not yet
/// loaded or reimported, or multicast objects not rebuilt). Takes s.mu.
bool shared_released(State& s) noexcept;
proto::Done load_allocation(State& s, uint64_t id, const std::vector<int>& fds) noexcept;
proto::Done reimport_shared(State& s) noexcept;
/// The driver's handle for a multicast handle the application holds.
CUmemGenericAllocationHandle mc_driver_handle(State& s, CUmemGenericAllocationHandle h) noexcept;
/// From now on multicast handles are translated (mc_driver has entries).
void note_mc_translation() noexcept;
/// Forgets a multicast object the application released (by its handle); s.mu held.
void mc_forget(State& s, CUmemGenericAllocationHandle h) noexcept;
/// "CALL failed: CUDA_ERROR_NAME", for replies and logs.
std::string driver_error(const char* call, CUresult r);
/// Shrinks a hash table whose load fell far below its bucket count.
template <class M>
void maybe_shrink(M& m) {
  if (m.bucket_count() > 64 && m.size() * 8 < m.bucket_count()) m.rehash(m.size() * 2);
}

}  // namespace cusnap::shim::track
