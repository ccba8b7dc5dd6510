// The cut's control request (cut.h), for the control socket's server. Kept
// apart from cut.h: the wrappers that include cut.h build without exceptions
// and without the wire format.
#pragma once

#include "proto/shim_messages.h"

namespace cusnap::shim::cut {

/// Serves a CutRequest (arm, target, status, release). Never throws.
proto::CutState handle(const proto::CutRequest& req) noexcept;

}  // namespace cusnap::shim::cut
