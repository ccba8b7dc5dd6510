// The stream captures under way in this process, so that the shim never makes
// a call that the driver refuses during a capture on the workload's behalf.
// Measured on an H200 (docs/gpu-runs/capture-sync-h200.log): cuCtxSynchronize
// while any stream captures fails CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and
// invalidates the capture, in every capture mode, while cuMemFree in a
// RELAXED capture succeeds. The shim's cuMemFree of a block it serves from an
// exportable allocation synchronizes the context first, as cuMemFree does
// (track_legacy.cpp); during a capture it defers that free instead.
//
// A capture is recorded when cuStreamBeginCapture* succeeds on its origin
// stream and dropped by every cuStreamEndCapture on that stream that ends it
// (success, UNJOINED, INVALIDATED), when the stream is destroyed, or when the
// stream, asked again, no longer captures (any). Streams that joined a
// capture through an event are part of their origin's capture and need no
// record. The hooks make no driver call of their own, so each wrapper's last
// call stays the entry point it wraps.
#pragma once

#include "shim/entries.h"

namespace cusnap::shim::captures {

/// After a successful cuStreamBeginCapture* on s (ptsz: the per-thread
/// default stream for 0). On a thread's default stream, the capture is
/// dropped as the thread exits (a thread-specific value's destructor).
void began(CUstream s, bool ptsz) noexcept;
/// After cuStreamEndCapture* on s, which returned r.
void ended(CUstream s, bool ptsz, CUresult r) noexcept;
/// After cuStreamDestroy* of s.
void destroyed(CUstream s) noexcept;
/// Whether a capture may be under way in this process: the recorded ones,
/// each asked again (cuStreamIsCapturing) where this thread can, so that one
/// invalidated and never ended does not count for ever; one on the default
/// stream of a thread that has exited is dropped.
bool any() noexcept;

/// Fork: the child has no captures.
void atfork_prepare() noexcept;
void atfork_parent() noexcept;
void atfork_child() noexcept;

}  // namespace cusnap::shim::captures
