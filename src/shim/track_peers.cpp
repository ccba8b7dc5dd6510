// Peer access for cuMemAlloc blocks: cuCtxEnablePeerAccess and
// cuCtxDisablePeerAccess, and the access they grant and revoke on the blocks.
// Contract and locks: track.h; state: track_state.h; helpers: track_internal.h.
#include "shim/track.h"

#include <algorithm>

#include "shim/real_driver.h"
#include "shim/track_internal.h"

namespace cusnap::shim::track {

// Peer access. The driver's cuCtxEnablePeerAccess lets the current context
// reach cuMemAlloc memory of the peer context, but not VMM mappings, so a
// cuMemAlloc block served by a mapping gets explicit access (read-write) for
// every device whose context enabled peer access to the block's device: the
// existing blocks when peer access is enabled, a new block when it is made.
// It is revoked (PROT_NONE) when the last grant between the two devices is
// disabled. The application cannot set a block's access itself (the driver
// refuses cuMemSetAccess of its own block, and the shim of a served one), so
// every other device's access to a block came from peer access.

namespace {

bool has_rw(const std::vector<proto::AccessRecord>& set, int32_t dev) {
  for (auto& a : set)
    if (a.type == CU_MEM_LOCATION_TYPE_DEVICE && a.id == dev)
      return (a.flags & CU_MEM_ACCESS_FLAGS_PROT_READWRITE) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return false;
}

bool has_record(const std::vector<proto::AccessRecord>& set, int32_t dev) {
  for (auto& a : set)
    if (a.type == CU_MEM_LOCATION_TYPE_DEVICE && a.id == dev && a.flags != 0) return true;
  return false;
}

bool granted(const State& s, int32_t from, int32_t to) {
  for (auto& g : s.peers)
    if (g.from == from && g.to == to) return true;
  return false;
}

/// The device of a context (cuCtxGetDevice_v2, or a push, cuCtxGetDevice, pop).
CUresult device_of(CUcontext ctx, CUdevice* dev) {
  if (auto v2 = REAL(cuCtxGetDevice_v2)) return v2(dev, ctx);
  auto push = REAL(cuCtxPushCurrent_v2);
  auto pop = REAL(cuCtxPopCurrent_v2);
  auto get = REAL(cuCtxGetDevice);
  if (!push || !pop || !get) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = push(ctx);
  if (r != CUDA_SUCCESS) return r;
  r = get(dev);
  CUcontext out = nullptr;
  pop(&out);
  return r;
}

}  // namespace

CUresult grant_peers(State& s, CUdeviceptr addr) {
  {
    // No peer access (the common case): no wait for a free's unmap. An
    // enable from now on grants the block itself (grant_device).
    Lock l(s.mu);
    if (s.peers.empty()) return CUDA_SUCCESS;
  }
  std::vector<CUmemAccessDesc> add;
  uint64_t size = 0;
  Lock busy(s.access_mu);  // the block stays at addr until the grant is made
  {
    Lock l(s.mu);
    auto m = s.ranges.find(addr);
    auto b = s.legacy_blocks.find(addr);
    if (m == s.ranges.end() || b == s.legacy_blocks.end()) return CUDA_SUCCESS;
    auto a = s.allocs.find(b->second);
    if (a == s.allocs.end()) return CUDA_SUCCESS;
    const int32_t owner = a->second.device;
    size = m->second.size;
    for (auto& g : s.peers) {
      if (g.to != owner || g.from == owner || has_rw(m->second.access, g.from)) continue;
      bool dup = false;
      for (auto& d : add) dup = dup || d.location.id == g.from;
      if (dup) continue;
      CUmemAccessDesc d{};
      d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      d.location.id = g.from;
      d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      add.push_back(d);
    }
  }
  if (add.empty()) return CUDA_SUCCESS;
  CUresult r = REAL(cuMemSetAccess)(addr, size, add.data(), add.size());
  if (r != CUDA_SUCCESS) return r;
  Lock l(s.mu);
  auto m = s.ranges.find(addr);
  if (m == s.ranges.end() || !s.legacy_blocks.count(addr)) return CUDA_SUCCESS;
  for (auto& d : add) union_access(&m->second.access, d);
  return CUDA_SUCCESS;
}

namespace {

/// Grants every existing block on device `to` to its peers.
CUresult grant_device(State& s, int32_t to) {
  std::vector<uint64_t> blocks;
  {
    Lock l(s.mu);
    for (auto& [addr, id] : s.legacy_blocks) {
      auto a = s.allocs.find(id);
      if (a != s.allocs.end() && a->second.device == to) blocks.push_back(addr);
    }
  }
  for (uint64_t addr : blocks)
    if (CUresult r = grant_peers(s, addr); r != CUDA_SUCCESS) return r;
  return CUDA_SUCCESS;
}

/// Once no grant from `from` to `to` remains: revokes `from`'s access to the
/// blocks of device `to`. A revocation the driver refuses leaves that access
/// (and its record) in place.
void revoke_peers(State& s, int32_t from, int32_t to) {
  std::vector<std::pair<uint64_t, uint64_t>> blocks;
  if (from == to) return;  // a block's own device keeps its access
  {
    // The blocks collected stay at their addresses until the revocations
    // are made (a free waits: drop_block).
    Lock busy(s.access_mu);
    {
      Lock l(s.mu);
      if (granted(s, from, to)) return;
      for (auto& [addr, id] : s.legacy_blocks) {
        auto a = s.allocs.find(id);
        auto m = s.ranges.find(addr);
        if (a == s.allocs.end() || a->second.device != to || m == s.ranges.end()) continue;
        if (has_record(m->second.access, from)) blocks.emplace_back(addr, m->second.size);
      }
    }
    for (auto [addr, size] : blocks) {
      CUmemAccessDesc d{};
      d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      d.location.id = from;
      d.flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
      if (REAL(cuMemSetAccess)(addr, size, &d, 1) != CUDA_SUCCESS) continue;
      Lock l(s.mu);
      auto m = s.ranges.find(addr);
      if (m == s.ranges.end()) continue;  // taken by a free, its unmap waiting
      auto& acc = m->second.access;
      acc.erase(std::remove_if(acc.begin(), acc.end(),
                               [&](const proto::AccessRecord& a) {
                                 return a.type == CU_MEM_LOCATION_TYPE_DEVICE && a.id == from;
                               }),
                acc.end());
    }
  }
  // Enabled again meanwhile: grant once more what was just revoked.
  bool again;
  {
    Lock l(s.mu);
    again = granted(s, from, to);
  }
  if (again)
    for (auto [addr, size] : blocks) grant_peers(s, addr);
}

}  // namespace

CUresult ctx_enable_peer(decltype(&::cuCtxEnablePeerAccess) real, CUcontext peer,
                         unsigned int flags) noexcept {
  if (!active() || !legacy_vmm()) return real(peer, flags);
  CUcontext cur = nullptr;
  CUdevice from = 0, to = 0;
  auto get_cur = REAL(cuCtxGetCurrent);
  auto get_dev = REAL(cuCtxGetDevice);
  if (!get_cur || !get_dev || get_cur(&cur) != CUDA_SUCCESS || !cur ||
      get_dev(&from) != CUDA_SUCCESS || device_of(peer, &to) != CUDA_SUCCESS)
    return real(peer, flags);
  CUresult r = real(peer, flags);
  if (r != CUDA_SUCCESS) return r;
  State& s = state();
  try {
    {
      Lock l(s.mu);
      s.peers.push_back({cur, peer, from, to});
    }
    r = grant_device(s, to);
    if (r == CUDA_SUCCESS) return CUDA_SUCCESS;
  } catch (...) {
    r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  // The blocks could not be granted: peer access is not enabled after all.
  try {
    REAL(cuCtxDisablePeerAccess)(peer);
    {
      Lock l(s.mu);
      for (auto it = s.peers.begin(); it != s.peers.end(); ++it)
        if (it->ctx == cur && it->peer == peer) {
          s.peers.erase(it);
          break;
        }
    }
    revoke_peers(s, from, to);
  } catch (...) {
  }
  return r;
}

CUresult ctx_disable_peer(decltype(&::cuCtxDisablePeerAccess) real, CUcontext peer) noexcept {
  if (!active() || !legacy_vmm()) return real(peer);
  CUcontext cur = nullptr;
  auto get_cur = REAL(cuCtxGetCurrent);
  if (get_cur) get_cur(&cur);
  CUresult r = real(peer);
  if (r != CUDA_SUCCESS) return r;
  State& s = state();
  try {
    int32_t from = 0, to = 0;
    bool found = false;
    {
      Lock l(s.mu);
      for (auto it = s.peers.begin(); it != s.peers.end(); ++it)
        if (it->ctx == cur && it->peer == peer) {
          from = it->from;
          to = it->to;
          found = true;
          s.peers.erase(it);
          break;
        }
    }
    if (found) revoke_peers(s, from, to);
  } catch (...) {
  }
  return CUDA_SUCCESS;
}

}  // namespace cusnap::shim::track
