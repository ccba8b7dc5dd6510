// What goes with a context. The driver frees a context's cuMemAlloc blocks
// (the shim's records of those it left to the driver are dropped too) and
// closes the legacy IPC opens made in it when the context goes
// (cuCtxDestroy; a primary context's reset or last release), while VMM
// memory stays (measured on an H100: tests/gpu/probes/context_blocks.cpp,
// context_ipc.cpp; docs/gpu-runs/served-block-h100.log). The shim serves
// both from VMM memory, so it frees them itself.
// Contract and locks: track.h; state: track_state.h; helpers: track_internal.h.
#include <algorithm>
#include <cstdint>

#include "shim/real_driver.h"
#include "shim/track.h"
#include "shim/track_internal.h"

namespace cusnap::shim::track {

ContextGoing memory_of(CUcontext ctx) noexcept {
  ContextGoing out;
  out.ctx = ctx;
  if (!ctx || !tracking_on() || !active()) return out;
  try {
    State& s = state();
    Lock l(s.mu);
    auto& m = out.memory;
    for (const auto& [addr, id] : s.legacy_blocks) {
      auto r = s.ranges.find(addr);
      if (r != s.ranges.end() && r->second.asked.ctx == ctx)
        m.push_back({addr, id, ContextMemory::kServedBlock});
    }
    for (const IpcOpen& o : s.ipc)
      if (o.ctx == ctx) m.push_back({o.address, o.alloc, ContextMemory::kIpcOpen});
    for (const auto& [addr, b] : s.driver_blocks)
      if (b.ctx == ctx) m.push_back({addr, 0, ContextMemory::kDriverBlock});
    for (const State::PendingFree& f : s.pending_frees)
      if (f.ctx == ctx) m.push_back({f.addr, f.id, ContextMemory::kPendingFree});
  } catch (...) {
    out.memory.clear();
  }
  return out;
}

namespace {

/// Takes the pending frees of the block at addr out of pending_frees (s.mu
/// held): the events of those made in another context than ctx go to
/// *destroy (ctx's went with it).
void drop_pending(State& s, uint64_t addr, CUcontext ctx, std::vector<CUevent>* destroy) {
  auto& p = s.pending_frees;
  auto gone = std::remove_if(p.begin(), p.end(), [&](const State::PendingFree& f) {
    if (f.addr != addr) return false;
    if (f.ctx != ctx) destroy->push_back(f.event);
    return true;
  });
  p.erase(gone, p.end());
  s.pending_count.store(p.size(), std::memory_order_release);
}

/// Takes the served block m out of the tables (s.mu held), with the frees of
/// it that wait: false when it is not there any more.
bool take_gone_block(State& s, const ContextMemory& m, CUcontext ctx, uint64_t* size,
                     std::vector<CUevent>* destroy) {
  // Only the block taken before the context went: another thread's new
  // block at a reused address (or in a context that got the same handle
  // back) is not the context's.
  if (!take_if_same(s, m.addr, m.id, size)) return false;
  auto& d = s.deferred_frees;
  d.erase(std::remove(d.begin(), d.end(), m.addr), d.end());
  drop_pending(s, m.addr, ctx, destroy);
  return true;
}

/// Takes the legacy IPC open m of ctx out of the tables (s.mu held): true,
/// with its record, for an open of the shim's, which the caller unmaps; a
/// foreign open (the driver's own mapping, closed by the driver) is
/// forgotten here.
bool take_gone_open(State& s, const ContextMemory& m, CUcontext ctx, IpcOpen* out) {
  auto it = std::find_if(s.ipc.begin(), s.ipc.end(), [&](const IpcOpen& o) {
    return o.address == m.addr && o.alloc == m.id && o.ctx == ctx;
  });
  if (it == s.ipc.end()) return false;  // closed meanwhile
  const bool ours = it->alloc != 0;
  *out = *it;
  s.ipc.erase(it);
  if (ours) {
    s.ranges.erase(out->address);
    drop_tail(s, out->address);
  } else if (s.foreign_alive)
    s.foreign_alive--;
  return ours;
}

}  // namespace

void context_gone(const ContextGoing& going) noexcept {
  const NoCancel no_cancel;  // drop_block closes descriptors (track_internal.h)
  if (going.empty()) return;
  try {
    State& s = state();
    const CUcontext ctx = going.ctx;
    std::vector<IpcOpen> gone;  // a block as an open of its own allocation
    std::vector<CUevent> destroy;
    {
      Lock l(s.mu);
      for (const ContextMemory& m : going.memory) {
        IpcOpen o{nullptr, m.id, m.addr, 0, 0};
        switch (m.kind) {
          case ContextMemory::kServedBlock:
          case ContextMemory::kPendingFree:  // its event went with the context, and the
                                             // stream's work with it: the block goes now
            if (take_gone_block(s, m, ctx, &o.size, &destroy)) gone.push_back(o);
            break;
          case ContextMemory::kIpcOpen:
            if (take_gone_open(s, m, ctx, &o)) gone.push_back(o);
            break;
          case ContextMemory::kDriverBlock:  // the driver freed it: no longer counted
            if (auto b = s.driver_blocks.find(m.addr);
                b != s.driver_blocks.end() && b->second.ctx == ctx)
              s.driver_blocks.erase(b);
            break;
        }
      }
    }
    // No synchronize: the context's work went with it.
    for (const IpcOpen& o : gone) drop_block(s, o.address, o.alloc, o.size);
    if (auto destroy_event = REAL(cuEventDestroy_v2))
      for (CUevent e : destroy) destroy_event(e);
  } catch (...) {
  }
}

ReapHold::ReapHold() noexcept {
  // Nothing is pending where the shim tracks nothing (memory_of asks the
  // same): its state is neither built nor locked there.
  if (!tracking_on() || !active()) return;
  try {
    state().reap_mu.lock();
    held_ = true;
  } catch (...) {  // a lock that failed holds nothing
  }
}

ReapHold::~ReapHold() {
  if (held_) state().reap_mu.unlock();
}

CUcontext active_primary(CUdevice dev) noexcept {
  auto state_of = REAL(cuDevicePrimaryCtxGetState);
  auto retain = REAL(cuDevicePrimaryCtxRetain);
  auto release = REAL(cuDevicePrimaryCtxRelease_v2);
  if (!tracking_on() || !state_of || !retain || !release) return nullptr;
  unsigned flags = 0;
  int on = 0;
  CUcontext ctx = nullptr;
  if (state_of(dev, &flags, &on) != CUDA_SUCCESS || !on) return nullptr;
  if (retain(&ctx, dev) != CUDA_SUCCESS) return nullptr;
  release(dev);  // active before the retain: this release does not destroy it
  return ctx;
}

}  // namespace cusnap::shim::track
