// Collective kernels inside CUDA graphs, for the cut (cut.h; docs/design.md
// "Cut across collective ranks"). A collective launched on a stream that
// captures into a graph runs nothing then: it runs at every launch of the
// graph. So a captured launch is not counted, and each launch of an
// instantiated graph counts as many collective launches as the graph has
// collective kernel nodes (child graphs included), found by walking the graph
// when it is instantiated or an instance is updated.
//
// Not seen: collectives in the bodies of conditional nodes, and kernel nodes
// of an instance whose function is changed in place
// (cuGraphExecKernelNodeSetParams).
#pragma once

#include <cstdint>

#include "shim/entries.h"

namespace cusnap::shim::graphs {

/// Whether a launch on stream s would be captured rather than run (s as given
/// to the launch: ptsz picks the per-thread default stream for 0).
bool capturing(CUstream s, bool ptsz) noexcept;

/// The number of collective kernel nodes of g, child graphs included.
uint64_t count_collectives(CUgraph g) noexcept;

/// Records the collective count of instance e, instantiated from (or updated
/// to) graph g.
void note_exec(CUgraphExec e, CUgraph g) noexcept;

/// Forgets instance e (destroyed).
void forget_exec(CUgraphExec e) noexcept;

/// The collective count of instance e (0 when it has none or is unknown).
uint64_t collectives_of(CUgraphExec e) noexcept;

/// Fork: the child's driver has none of the parent's graphs.
void atfork_prepare() noexcept;
void atfork_parent() noexcept;
void atfork_child() noexcept;

}  // namespace cusnap::shim::graphs
