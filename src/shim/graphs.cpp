// Collective kernels inside CUDA graphs (graphs.h).
#include "shim/graphs.h"

#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "shim/cut.h"
#include "shim/pthread_lock.h"
#include "shim/real_driver.h"
#include "shim/stderr_line.h"

#define REAL(name) reinterpret_cast<decltype(&::name)>(real_entry(index_of(Entry::name)))

namespace cusnap::shim::graphs {

namespace {

// Instances with collective nodes, by handle: open addressing with
// tombstones, under a mutex (instantiation, update and destruction are rare;
// a launch looks up only while some instance has collectives).
constexpr unsigned kSlots = 8192;  // power of two
constexpr uintptr_t kTomb = 1;
struct Slot {
  uintptr_t key = 0;  // 0 free, kTomb deleted
  uint64_t count = 0;
};
Slot g_slots[kSlots];
Slot g_rehash[kSlots];  // scratch for dropping tombstones
unsigned g_tombs = 0;
pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
std::atomic<uint32_t> g_live{0};
std::atomic<bool> g_full_reported{false};

unsigned home(uintptr_t key) {
  return static_cast<unsigned>((key >> 4) * 0x9E3779B97F4A7C15ull >> 51) & (kSlots - 1);
}

/// The slot holding key, or nullptr. Under g_mu.
Slot* find_locked(uintptr_t key) {
  unsigned i = home(key);
  for (unsigned probe = 0; probe < kSlots; ++probe, i = (i + 1) & (kSlots - 1)) {
    if (g_slots[i].key == key) return &g_slots[i];
    if (g_slots[i].key == 0) return nullptr;
  }
  return nullptr;
}

/// Puts key (absent) into the first free or deleted slot of its probe
/// sequence; false when the table is full. g_live is the caller's: a launch
/// reads it without the lock, so it never drops while an instance is kept.
bool place_locked(uintptr_t key, uint64_t count) {
  unsigned i = home(key);
  for (unsigned probe = 0; probe < kSlots; ++probe, i = (i + 1) & (kSlots - 1)) {
    if (g_slots[i].key == 0 || g_slots[i].key == kTomb) {
      if (g_slots[i].key == kTomb) --g_tombs;
      g_slots[i].key = key;
      g_slots[i].count = count;
      return true;
    }
  }
  return false;
}

/// Rebuilds the table without tombstones, once they fill a quarter of it
/// (lookups of absent keys stop only at a free slot).
void drop_tombs_locked() {
  if (g_tombs < kSlots / 4) return;
  for (unsigned i = 0; i < kSlots; ++i) {
    g_rehash[i] = g_slots[i];
    g_slots[i] = Slot{};
  }
  g_tombs = 0;
  for (const Slot& s : g_rehash)
    if (s.key > kTomb) place_locked(s.key, s.count);
}

void erase_locked(uintptr_t key) {
  if (Slot* s = find_locked(key)) {
    s->key = kTomb;
    s->count = 0;
    ++g_tombs;
    g_live.fetch_sub(1, std::memory_order_acq_rel);
    drop_tombs_locked();
  }
}

/// Records key's count, in place when key is there already.
bool insert_locked(uintptr_t key, uint64_t count) {
  if (Slot* s = find_locked(key)) {
    s->count = count;
    return true;
  }
  if (!place_locked(key, count)) return false;
  g_live.fetch_add(1, std::memory_order_acq_rel);
  return true;
}

constexpr int kMaxDepth = 8;  // child graphs nested deeper are not walked

uint64_t count_in(CUgraph g, int depth) {
  auto get_nodes = REAL(cuGraphGetNodes);
  auto get_type = REAL(cuGraphNodeGetType);
  auto get_params = REAL(cuGraphKernelNodeGetParams_v2);
  auto get_child = REAL(cuGraphChildGraphNodeGetGraph);
  if (!g || !get_nodes || !get_type) return 0;
  size_t n = 0;
  if (get_nodes(g, nullptr, &n) != CUDA_SUCCESS || n == 0) return 0;
  auto* nodes = static_cast<CUgraphNode*>(std::calloc(n, sizeof(CUgraphNode)));
  if (!nodes) return 0;
  uint64_t c = 0;
  if (get_nodes(g, nodes, &n) == CUDA_SUCCESS) {
    for (size_t i = 0; i < n; ++i) {
      CUgraphNodeType t;
      if (get_type(nodes[i], &t) != CUDA_SUCCESS) continue;
      if (t == CU_GRAPH_NODE_TYPE_KERNEL && get_params) {
        CUDA_KERNEL_NODE_PARAMS_v2 p{};
        if (get_params(nodes[i], &p) != CUDA_SUCCESS) continue;
        // A node made from a library kernel names it in kern (cut::is_collective
        // asks cuKernelGetName for what cuFuncGetName does not know).
        CUfunction f = p.func ? p.func : reinterpret_cast<CUfunction>(p.kern);
        if (f && cut::is_collective(f)) ++c;
      } else if (t == CU_GRAPH_NODE_TYPE_GRAPH && get_child && depth < kMaxDepth) {
        CUgraph child = nullptr;
        if (get_child(nodes[i], &child) == CUDA_SUCCESS) c += count_in(child, depth + 1);
      }
    }
  }
  std::free(nodes);
  return c;
}

}  // namespace

bool capturing(CUstream s, bool ptsz) noexcept {
  auto is = ptsz ? REAL(cuStreamIsCapturing_ptsz) : REAL(cuStreamIsCapturing);
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  return is && is(s, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE;
}

uint64_t count_collectives(CUgraph g) noexcept {
  return count_in(g, 0);
}

void note_exec(CUgraphExec e, CUgraph g) noexcept {
  const auto key = reinterpret_cast<uintptr_t>(e);
  if (key <= kTomb) return;
  const uint64_t c = count_collectives(g);  // outside the lock: driver calls
  bool full = false;
  {
    PthreadLock l(&g_mu);
    if (c == 0) {
      erase_locked(key);
      return;
    }
    full = !insert_locked(key, c);
  }
  if (full && !g_full_reported.exchange(true))  // said with g_mu dropped (stderr_line.h)
    say("more than %u CUDA graph instances hold collective kernels; launches of the others are "
        "not counted at a checkpoint's cut",
        kSlots);
}

void forget_exec(CUgraphExec e) noexcept {
  const auto key = reinterpret_cast<uintptr_t>(e);
  if (key <= kTomb || g_live.load(std::memory_order_acquire) == 0) return;
  PthreadLock l(&g_mu);
  erase_locked(key);
}

uint64_t collectives_of(CUgraphExec e) noexcept {
  const auto key = reinterpret_cast<uintptr_t>(e);
  if (key <= kTomb || g_live.load(std::memory_order_acquire) == 0) return 0;
  PthreadLock l(&g_mu);
  const Slot* s = find_locked(key);
  return s ? s->count : 0;
}

void atfork_prepare() noexcept {
  pthread_mutex_lock(&g_mu);
}
void atfork_parent() noexcept {
  pthread_mutex_unlock(&g_mu);
}
void atfork_child() noexcept {
  new (&g_mu) pthread_mutex_t(PTHREAD_MUTEX_INITIALIZER);
  for (Slot& s : g_slots) s = Slot{};
  g_tombs = 0;
  g_live.store(0, std::memory_order_relaxed);
}

}  // namespace cusnap::shim::graphs
