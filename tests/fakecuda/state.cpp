// Process-wide driver state, context stacks and the fork rule: a forked child
// starts with an uninitialised driver; if its parent had called cuInit, the
// child's cuInit fails (the real driver's rule, measured on an H200), else it
// initialises afresh. The parent's device mappings stay mapped in the child
// but are not its records.
#include "state.h"
#include "gate.h"

#include <pthread.h>
#include <unistd.h>

#include <cstdlib>

namespace fc {

Driver& driver() {
  static Driver* d = new Driver;  // never destroyed: entry points may run at exit
  return *d;
}

std::vector<CUcontext>& ctx_stack() {
  thread_local std::vector<CUcontext> stack;
  return stack;
}

Context* current_ctx() {
  auto& st = ctx_stack();
  if (st.empty()) return nullptr;
  return reinterpret_cast<Context*>(st.back());
}

bool valid_device(CUdevice dev) {
  return dev >= 0 && static_cast<size_t>(dev) < driver().devices.size();
}

bool valid_ctx(CUcontext ctx) {
  return ctx && driver().contexts.count(reinterpret_cast<Context*>(ctx)) != 0;
}

bool valid_stream(CUstream s) {
  if (s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return true;
  return driver().streams.count(reinterpret_cast<Stream*>(s)) != 0;
}

namespace {

// Same order as the checkpoint handlers: Gate::mu, then Driver::mu.
void before_fork() {
  gate().mu.lock();
  driver().mu.lock();
  faults_before_fork();
}

void after_fork_parent() {
  faults_after_fork();
  driver().mu.unlock();
  gate().mu.unlock();
}

void after_fork_child() {
  Driver& d = driver();
  for (auto& [id, a] : d.allocs) {
    if (a.fd >= 0) close(a.fd);
  }
  d.allocs.clear();
  d.reservations.clear();
  d.mappings.clear();
  d.ipc_opens.clear();
  d.host_allocs.clear();
  d.peer_access.clear();
  d.captures.clear();
  d.graph_execs.clear();
  d.graph_nodes.clear();
  d.graphs.clear();
  d.streams.clear();
  d.events.clear();
  d.modules.clear();
  d.functions.clear();
  d.contexts.clear();
  d.primary.clear();
  d.devices.clear();
  d.forked_after_init = d.forked_after_init || d.initialized;
  d.initialized = false;
  d.init_failed_for_good = false;  // measured: such a child initialises
  ctx_stack().clear();
  Gate& g = gate();
  g.state = CU_PROCESS_STATE_RUNNING;
  g.locking = false;
  g.inflight = 0;
  control_server_after_fork();
  faults_after_fork();
  d.mu.unlock();
  g.mu.unlock();
  faults_reload();
}

__attribute__((constructor)) void register_fork_handlers() {
  pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

}  // namespace
}  // namespace fc
