// The cut across collective ranks (docs/design.md "Cut across collective
// ranks"). A collective kernel (NCCL's, recognised by its name) spins on the
// device until every peer rank has launched its part; a checkpoint that closes
// one rank's gate before its part is launched leaves the others' kernels
// spinning, so device work never drains (on the real driver the checkpoint
// hangs). The shim counts collective launches; the coordinator arms every
// process (later collective launches hold, outside the gate), reads the
// counts, sets one target for all (the largest), lets each process launch
// until it reaches it, and only then closes the gates: no collective is left
// half issued.
//
// A launch that holds waits outside the gate (it leaves and enters again), so
// gates can close while it waits. A hold lasts at most $CUSNAP_CUT_HOLD_MS
// (default 120000): past it the shim drops the cut by itself, so a coordinator
// that went away cannot stall the application.
#pragma once

#include <cstdint>

#include "shim/entries.h"

namespace cusnap::shim::cut {

/// Whether f is a collective kernel (name prefixes from
/// $CUSNAP_COLLECTIVE_KERNELS, comma-separated; default "ncclDevKernel,ncclKernel").
/// Caches the answer per handle. Called inside the gate.
bool is_collective(CUfunction f) noexcept;

/// Whether a kernel name (plain or mangled, as cuFuncGetName gives it)
/// starts with one of the collective prefixes.
bool name_is_collective(const char* name) noexcept;

/// Around the launch of a collective kernel: before() may hold (leaving the
/// gate while it waits) and counts the launch; after() records its outcome.
void before() noexcept;
void after(bool launched) noexcept;

/// Lets every held launch go (gate-open does this too).
void release() noexcept;

/// Fork: the child starts with no cut and zero counts.
void atfork_prepare() noexcept;
void atfork_parent() noexcept;
void atfork_child() noexcept;

/// Runs the launch through the cut when f is a collective kernel.
template <class Call>
CUresult launch(CUfunction f, Call&& call) noexcept {
  if (!is_collective(f)) return call();
  before();
  const CUresult r = call();
  after(r == CUDA_SUCCESS);
  return r;
}

}  // namespace cusnap::shim::cut
