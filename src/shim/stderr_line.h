// The shim's lines on stderr. A write to stderr may wait for ever (a pipe
// whose reader stopped reading, a terminal held by Ctrl-S): no lock of the
// shim's is ever held across one, since every application thread that takes
// that lock (at the gate, a collective launch, a fork) would wait with it.
// These write each line with one write(2), and drop it rather than wait.
#pragma once

#include <cstddef>

namespace cusnap::shim {

/// Writes n bytes to stderr with one write (send on a socket), at once or
/// not at all: on a socket without room (MSG_DONTWAIT) or a pipe, FIFO or
/// terminal that poll says takes nothing now, the bytes are dropped, and so
/// they are when the reader is gone (no SIGPIPE). A pipe with room takes a
/// line of under PIPE_BUF bytes whole, without waiting. Never acts on a
/// cancellation. Precondition: no lock of the shim's held.
void write_stderr(const char* text, size_t n) noexcept;

/// Whether $CUSNAP_SHIM_DEBUG is set (and not "0"): the shim's diagnostic
/// lines are written. Read once (once.h: no guard a fork child could find held).
bool debug_enabled() noexcept;

/// "cusnap-shim[PID]: " followed by fmt's text and a newline, on stderr
/// through write_stderr (cut at 1 KiB). Precondition: no lock of the shim's
/// held; format what a lock guards under it, and call this after.
void say(const char* fmt, ...) noexcept __attribute__((format(printf, 1, 2)));

}  // namespace cusnap::shim
