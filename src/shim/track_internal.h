// Helpers shared by the tracker's hook files (track.cpp, track_vmm.cpp,
// track_peers.cpp, track_legacy.cpp, track_multicast.cpp); locks: track.h,
// the tables they work on: track_state.h.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "shim/fork_table.h"
#include "shim/gate.h"
#include "shim/track_state.h"

namespace cusnap::shim::track {

using Lock = std::lock_guard<std::mutex>;

// Cancellation. A hook that may reach a cancellation point (read, pread,
// pwrite, close, connect, poll, recvmsg, nanosleep, stdio) holds a NoCancel
// (gate.h) from its entry: these hooks are noexcept and most catch (...)
// without rethrowing, so a pending pthread_cancel acted on inside would
// unwind into std::terminate or make the C library abort the process
// ("exception not rethrown"). The request stays pending and is acted on at
// the application's next cancellation point. Hooks that reach none (map,
// set-access, properties, the launches) go without, to stay cheap.

/// Whether tracking is on in this process; unlike active(), never starts it.
bool tracking_on() noexcept;
/// Whether cuMemAlloc is served by exportable VMM allocations
/// ($CUSNAP_SHIM_LEGACY_VMM, read when tracking starts).
bool legacy_vmm() noexcept;
/// One line on stderr when $CUSNAP_SHIM_DEBUG is set (say, stderr_line.h: no
/// lock of the shim's held).
void log(const char* what) noexcept;

// The tables (track.cpp).

/// Records an allocation this process created with driver handle d (s.mu
/// held); returns its local id.
uint64_t add_created(State& s, CUmemGenericAllocationHandle d, uint64_t size,
                     const CUmemAllocationProp& prop);
/// After a change of counts (s.mu held): releases the driver handle when
/// nothing logical or internal holds it, and forgets the allocation when
/// nothing maps it either. What is to be released or closed goes to finish;
/// an export-cache descriptor leaves the cache into the fork table
/// (list_held), so a child forked before it is closed holds no copy.
void settle(State& s, uint64_t id, std::vector<CUmemGenericAllocationHandle>* release,
            std::vector<ListedFd>* close_fds);
/// Releases the driver handles, then closes each descriptor (out of the fork
/// table) whose number still names its file (the application may have
/// closed and reused one while the driver released).
void finish(const std::vector<CUmemGenericAllocationHandle>& release,
            std::vector<ListedFd>* fds = nullptr);
/// The entry of ranges (start address -> V, sorted) whose range
/// [start, start + size_of(V)) contains address p, or ranges.end().
template <class V, class SizeOf>
typename std::map<uint64_t, V>::iterator range_containing(std::map<uint64_t, V>& ranges, uint64_t p,
                                                          SizeOf size_of) {
  auto it = ranges.upper_bound(p);
  if (it == ranges.begin()) return ranges.end();
  --it;
  return p - it->first < size_of(it->second) ? it : ranges.end();
}
/// The mapping that contains address p, or end() (s.mu held).
std::map<uint64_t, Mapping>::iterator containing(State& s, uint64_t p);
/// Fills the export cache for an allocation created here (calls the driver,
/// without holding any lock).
CUresult ensure_cached(State& s, uint64_t id, CUmemGenericAllocationHandle driver);
/// The peer socket of the creator that k names.
std::string peer_socket_of(const State& s, const AllocKey& k);
/// A driver handle for the allocation a ticket names: an alias of the one this
/// process holds, or a fresh import of the creator's descriptor. *id gets the
/// local id (created if new, with origin imported); the caller owns one
/// reference it must turn into a logical handle or a pin (under s.mu).
CUresult import_ticket(State& s, const proto::Ticket& t, bool as_pin, uint64_t* id_out);
/// Adds d to an access set (or its flags to the entry for d's location).
void union_access(std::vector<proto::AccessRecord>* set, const CUmemAccessDesc& d);

// The blocks the shim serves for cuMemAlloc (track_legacy.cpp).

/// Takes the cuMemAlloc block at dptr out of the tables (s.mu held): the id,
/// size and device of its allocation; false when the shim does not serve it.
bool take_block(State& s, CUdeviceptr dptr, uint64_t* id, uint64_t* size, int32_t* dev);
/// take_block of the block at dptr only while it is still allocation id (a
/// block taken before a wait: another thread may have freed it meanwhile,
/// and a new block got the address back) (s.mu held).
bool take_if_same(State& s, CUdeviceptr dptr, uint64_t id, uint64_t* size);
/// Unmaps a mapping of the shim's taken out of the tables (a block
/// take_block took, a legacy IPC open), frees its reservation and releases
/// its allocation once nothing else holds it (s.mu not held).
/// The first error of the driver's; what can be released is released all
/// the same.
CUresult drop_block(State& s, CUdeviceptr dptr, uint64_t id, uint64_t size);

/// Where an address lies against the blocks the shim serves.
enum class Served {
  kNo,      ///< in none
  kYes,     ///< in a block's asked bytes
  kOpened,  ///< in the bytes asked of a block another process exported, as
            ///< the shim opened it from its IPC handle
  kTail,    ///< past the bytes asked of either, in the rest of its mapping
};
/// The block an address lies in.
struct ServedBlock {
  uint64_t alloc = 0;       ///< its allocation's local id
  uint64_t offset = 0;      ///< the address's distance from the block's base
  BlockAsked asked;         ///< what was asked of it (an open: the context it is open in)
};
/// Where ptr lies (s.mu held); in a block (kYes, kOpened, kTail), *block
/// says which (track_queries.cpp).
Served served_at_locked(State& s, CUdeviceptr ptr, ServedBlock* block);
/// Records (s.mu held) that the block at addr, a mapping of size bytes, was
/// asked for fewer (a served block, or an open of one another process
/// exported): the copy check's table (State::tails). Throws (out of
/// memory), leaving it unrecorded. A block asked for its whole mapping is not recorded.
void set_tail(State& s, uint64_t addr, uint64_t asked, uint64_t size);
/// Forgets (s.mu held) the tail of the block at addr, if it has one.
void drop_tail(State& s, uint64_t addr) noexcept;

// Frees that wait (track_legacy.cpp).

/// Frees the blocks whose free waits: those freed in stream order
/// (cuMemFreeAsync) whose stream got there, and those a capture deferred (no
/// capture under way). A drain ends with it, so that a checkpoint does not
/// save blocks the application freed (they would otherwise go at its next
/// allocation or free only).
void settle_frees(State& s) noexcept;

// Peer access (track_peers.cpp).

/// Grants the cuMemAlloc block at addr read-write for every device with peer
/// access to its device that lacks it, and records what it granted.
CUresult grant_peers(State& s, CUdeviceptr addr);

}  // namespace cusnap::shim::track
