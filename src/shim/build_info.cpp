// cusnap_shim_build_info, the gate's control table, and the shim's process
// hooks (fork handlers).
#include "shim/cusnap_shim.h"

#include <pthread.h>

#include "shim/entries.h"
#include "shim/captures.h"
#include "shim/cut.h"
#include "shim/gate.h"
#include "shim/graphs.h"
#include "shim/real_driver.h"
#include "shim/track.h"

#ifndef CUSNAP_VERSION
#define CUSNAP_VERSION "0.0.0"
#endif
#ifndef CUSNAP_SHIM_BUILD
#define CUSNAP_SHIM_BUILD "unknown"
#endif

namespace cusnap::shim {
namespace {

int control_close(uint64_t timeout_ms) {
  return gate().close(timeout_ms);
}
int control_open() {
  return gate().open();
}
void control_state(int* closed, uint64_t* in_flight, uint64_t* waiting) {
  if (closed) *closed = gate().is_closed() ? 1 : 0;
  if (in_flight) *in_flight = gate().in_flight();
  if (waiting) *waiting = gate().waiting();
}

constexpr cusnap_shim_control kControl = {sizeof(cusnap_shim_control), control_close, control_open,
                                          control_state};

// Fork: the gate's locks are held across fork() so the child never inherits
// one mid-update; the child starts with an open gate. The loaded driver stays
// (the mapping is inherited); a load under way starts again in the child.
void prepare() {
  track::atfork_prepare();
  cut::atfork_prepare();
  graphs::atfork_prepare();
  captures::atfork_prepare();
  gate().atfork_prepare();
}
void parent() {
  gate().atfork_parent();
  captures::atfork_parent();
  graphs::atfork_parent();
  cut::atfork_parent();
  track::atfork_parent();
}
void child() {
  gate_slots_atfork_child();
  gate().atfork_child();
  loader_atfork_child();
  cut::atfork_child();
  graphs::atfork_child();
  captures::atfork_child();
  track::atfork_child();
}

__attribute__((constructor)) void shim_init() {
  pthread_atfork(prepare, parent, child);
}

}  // namespace
}  // namespace cusnap::shim

extern "C" __attribute__((visibility("default"))) const cusnap_shim_info cusnap_shim_build_info = {
    CUSNAP_SHIM_ABI,
    CUSNAP_VERSION,
    CUSNAP_SHIM_BUILD,
    CUDA_VERSION,
    static_cast<uint32_t>(cusnap::shim::kEntryCount),
    &cusnap::shim::kControl,
};
