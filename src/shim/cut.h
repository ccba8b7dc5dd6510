// The cut across collective ranks (docs/design.md "Cut across collective
// ranks"). A collective kernel (NCCL's, recognised by its name) spins on the
// device until every peer rank has launched its part; a checkpoint that closes
// one rank's gate before its part is launched leaves the others' kernels
// spinning, so device work never drains (on the real driver the checkpoint
// hangs). The shim counts collective launches (a graph launch counts its
// graph's collective nodes: graphs.h); the coordinator arms every
// process (later collective launches hold, outside the gate), reads the
// counts, sets one target for all (the largest), lets each process launch
// on each GPU until it reaches it, and only then closes the gates: no
// collective is left half issued.
//
// A launch that holds waits outside the gate (it leaves and enters again), so
// gates can close while it waits. A hold lasts at most $CUSNAP_CUT_HOLD_MS
// (default 120000): past it the shim drops the cut by itself, so a coordinator
// that went away cannot stall the application.
#pragma once

#include <cstdint>

#include "shim/entries.h"
#include "shim/graphs.h"

namespace cusnap::shim::cut {

/// Whether f is a collective kernel (name prefixes from
/// $CUSNAP_COLLECTIVE_KERNELS, comma-separated; default
/// "ncclDevKernel,ncclKernel,ncclSymDevKernel,ncclSymkDevKernel"). Caches the answer per handle,
/// until kernels_unloaded(). Called inside the gate.
bool is_collective(CUfunction f) noexcept;

/// Forgets every cached answer of is_collective: kernels went (a module or
/// library unloaded, a context destroyed), and the driver may give their
/// handles' addresses to kernels loaded later. Called once the driver's call
/// returned.
void kernels_unloaded() noexcept;

/// Whether a kernel name (plain or mangled, as cuFuncGetName gives it)
/// starts with one of the collective prefixes.
bool name_is_collective(const char* name) noexcept;

/// Around the launch of n collective kernels (one kernel, or a graph's
/// collective nodes) in the current context: before() may hold (leaving the
/// gate while it waits) and counts the n launches on the context's device,
/// whose slot it returns for after(), which records their outcome. A launch
/// holds unless all n fit below the target on its device.
unsigned before(uint64_t n) noexcept;
void after(unsigned slot, bool launched, uint64_t n) noexcept;

/// $CUSNAP_CUT_HOLD_MS (default 120000), read once: how long a held launch
/// waits, and a gate a client closed stays closed, unless an "arm" asked for
/// longer.
uint64_t own_hold_ms() noexcept;

/// Lets every held launch go (gate-open does this too).
void release() noexcept;

/// Fork: the child starts with no cut and zero counts.
void atfork_prepare() noexcept;
void atfork_parent() noexcept;
void atfork_child() noexcept;

/// Runs a kernel launch on stream s through the cut when f is a collective
/// kernel and the launch runs (a launch captured into a graph runs at the
/// graph's launches, which count it: launch_graph).
template <class Call>
CUresult launch(CUfunction f, CUstream s, bool ptsz, Call&& call) noexcept {
  if (!is_collective(f) || graphs::capturing(s, ptsz)) return call();
  const unsigned slot = before(1);
  const CUresult r = call();
  after(slot, r == CUDA_SUCCESS, 1);
  return r;
}

/// Runs a graph launch on stream s through the cut when its graph holds
/// n > 0 collective kernel nodes and the launch runs (one captured into
/// another graph becomes a child graph node, which that graph's launches
/// count).
template <class Call>
CUresult launch_graph(uint64_t n, CUstream s, bool ptsz, Call&& call) noexcept {
  if (n == 0 || graphs::capturing(s, ptsz)) return call();
  const unsigned slot = before(n);
  const CUresult r = call();
  after(slot, r == CUDA_SUCCESS, n);
  return r;
}

}  // namespace cusnap::shim::cut
