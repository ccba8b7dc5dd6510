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

std::vector<ContextMemory> memory_of(CUcontext ctx) noexcept {
  std::vector<ContextMemory> out;
  if (!ctx || !tracking_on() || !active()) return out;
  try {
    State& s = state();
    Lock l(s.mu);
    for (const auto& [addr, asked] : s.block_asked) {
      auto b = s.legacy_blocks.find(addr);
      if (asked.ctx == ctx && b != s.legacy_blocks.end())
        out.push_back({addr, b->second, ContextMemory::kServedBlock});
    }
    for (const IpcOpen& o : s.ipc)
      if (o.ctx == ctx) out.push_back({o.address, o.alloc, ContextMemory::kIpcOpen});
    for (const auto& [addr, b] : s.driver_blocks)
      if (b.ctx == ctx) out.push_back({addr, 0, ContextMemory::kDriverBlock});
  } catch (...) {
    out.clear();
  }
  return out;
}

namespace {

/// Takes the served block m out of the tables (s.mu held), with the frees of
/// it that wait: false when it is not there any more.
bool take_gone_block(State& s, const ContextMemory& m, uint64_t* size) {
  // Only the block taken before the context went: another thread's new
  // block at a reused address (or in a context that got the same handle
  // back) is not the context's.
  if (!take_if_same(s, m.addr, m.id, size)) return false;
  auto& d = s.deferred_frees;
  d.erase(std::remove(d.begin(), d.end(), m.addr), d.end());
  // A free in stream order of it waits no more: its event went with the
  // context (not destroyed here).
  auto& p = s.pending_frees;
  p.erase(std::remove_if(p.begin(), p.end(),
                         [&](const State::PendingFree& f) { return f.addr == m.addr; }),
          p.end());
  s.pending_count.store(p.size(), std::memory_order_release);
  return true;
}

/// Takes the legacy IPC open m out of the tables (s.mu held): true, with its
/// record, for an open of the shim's, which the caller unmaps; a foreign
/// open (the driver's own mapping, closed by the driver) is forgotten here.
bool take_gone_open(State& s, const ContextMemory& m, IpcOpen* out) {
  auto it = std::find_if(s.ipc.begin(), s.ipc.end(),
                         [&](const IpcOpen& o) { return o.address == m.addr && o.alloc == m.id; });
  if (it == s.ipc.end()) return false;  // closed meanwhile
  const bool ours = it->alloc != 0;
  *out = *it;
  s.ipc.erase(it);
  if (ours)
    s.ranges.erase(out->address);
  else if (s.foreign_alive)
    s.foreign_alive--;
  return ours;
}

}  // namespace

void context_gone(const std::vector<ContextMemory>& memory) noexcept {
  const NoCancel no_cancel;  // drop_block closes descriptors (track_internal.h)
  if (memory.empty()) return;
  try {
    State& s = state();
    std::vector<IpcOpen> gone;  // a block as an open of its own allocation
    {
      Lock l(s.mu);
      for (const ContextMemory& m : memory) {
        IpcOpen o{nullptr, m.id, m.addr, 0, 0};
        switch (m.kind) {
          case ContextMemory::kServedBlock:
            if (take_gone_block(s, m, &o.size)) gone.push_back(o);
            break;
          case ContextMemory::kIpcOpen:
            if (take_gone_open(s, m, &o)) gone.push_back(o);
            break;
          case ContextMemory::kDriverBlock:  // the driver freed it: no longer counted
            s.driver_blocks.erase(m.addr);
            break;
        }
      }
    }
    // No synchronize: the context's work went with it.
    for (const IpcOpen& o : gone) drop_block(s, o.address, o.alloc, o.size);
  } catch (...) {
  }
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
