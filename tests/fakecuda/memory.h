// Device memory primitives shared by plain, VMM, IPC and multicast memory.
// Every physical allocation is a memfd named "fakecuda:<creator-pid>:<id>:dev<N>"
// mapped MAP_SHARED at its device address, so device pointers are readable by
// the host and two processes that map one memfd share bytes. Unmapped
// reserved ranges are PROT_NONE anonymous mappings.
//
// Precondition for every function here: Driver::mu is held.
#pragma once

#include "state.h"

namespace fc {

constexpr size_t round_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

/// Creates the memfd of allocation `id` owned by `creator` on the machine's
/// device `machine_dev` (Device::ledger_index), named
/// "fakecuda:<creator>:<id>:dev<machine_dev>" (an importer learns the device
/// from the name, the ledger counts it there); -1 on failure.
int make_memfd(pid_t creator, uint64_t id, size_t size, int machine_dev);

/// Creates a new allocation of this process with its memfd; charges the device.
CUresult new_allocation(AllocKind kind, size_t size, CUdevice dev, uint64_t* id);

/// Adds an allocation backed by an existing descriptor (dup'ed here), found
/// by its memfd name; reuses the record when this process already has it.
CUresult adopt_allocation(int fd, AllocKind kind, uint64_t* id, bool* reused);

/// Drops the record once neither handles nor mappings refer to it.
void maybe_destroy(uint64_t id);

/// Reserves [*out, *out+size); hint is honoured when free; low32 keeps the
/// range below 4 GiB (for the 32-bit legacy entry points).
CUresult reserve_va(size_t size, size_t align, uintptr_t hint, bool low32, bool internal,
                    uintptr_t* out);
/// Frees a whole reservation with no mappings inside.
CUresult free_va(uintptr_t va, size_t size);

/// Maps [offset, offset+size) of allocation `id` at va, inside one reservation,
/// overlapping no mapping. The new mapping has no access (PROT_NONE).
CUresult map_range(uintptr_t va, size_t size, size_t offset, uint64_t id);
/// Unmaps whole mappings exactly covering [va, va+size).
CUresult unmap_range(uintptr_t va, size_t size);
/// Re-applies a mapping's host protection from its access flags.
void apply_access(uintptr_t va, Mapping& m);

/// The mapping containing p, or nullptr (sets *base).
Mapping* find_mapping(uintptr_t p, uintptr_t* base);
/// The mapping containing p as the driver's queries see it (address range,
/// pointer attributes), or nullptr; sets *base and *size (either may be
/// NULL). A cuMemAlloc block, and a legacy IPC open of one, is the size
/// asked for (Allocation::requested), not its mapping's: the tail of its
/// mapping is an address the driver does not know, as on the real driver
/// (measured on an H200, driver 580.159.04, tests/gpu/probes/alloc_sizes.cpp;
/// for an open on an H100, its ipc_tail).
Mapping* find_known(uintptr_t p, uintptr_t* base, size_t* size);
/// True when p lies inside a reservation (a device address).
bool is_device_address(uintptr_t p);
/// Checks that [p, p+n) is mapped device memory (with the access needed) or
/// host memory the driver knows of. Past a cuMemAlloc block's bytes (or an
/// open's of one) it is not: the driver refuses a copy or memset at or
/// across a block's end (INVALID_VALUE; measured on an H100, driver
/// 580.159.04, tests/gpu/probes/alloc_sizes.cpp tail, ipc_tail).
CUresult check_range(uintptr_t p, size_t n, bool write);

/// Allocation by handle, or nullptr.
Allocation* find_alloc(uint64_t id);

/// Frees the cuMemAlloc blocks of context `owner` and closes the legacy IPC
/// opens made in it (Driver::mu held), as the driver does when the context
/// goes (cuCtxDestroy, a primary context's reset or last release; measured
/// on an H100, docs/gpu-runs/served-block-h100.log: the opened address is
/// unknown after, its close INVALID_VALUE, a new open succeeds); VMM memory
/// stays.
void free_context_blocks(const void* owner);

}  // namespace fc
