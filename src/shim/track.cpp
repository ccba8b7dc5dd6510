// Tracking of shared device memory, core: start and fork, contexts, the tables'
// shared helpers, tickets, inspection records; hooks: track_{vmm,legacy,peers,multicast}.cpp.
// Contract and locks: track.h; state: track_state.h, track_internal.h; format: docs/shim.md.
#include "shim/track.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "proto/proc_stat.h"
#include "shim/once.h"
#include "shim/real_driver.h"
#include "shim/stderr_line.h"
#include "shim/track_internal.h"

namespace cusnap::shim::track {

namespace {

constexpr int kModeUnknown = 0, kModeOff = 1, kModeOn = 2;
std::atomic<int> g_mode{kModeUnknown};
std::atomic<bool> g_reset{false};
std::mutex g_start_mu;
bool g_legacy_vmm = true;

void unlink_sockets() {
  State& s = state();
  if (s.pid != ::getpid()) return;
  if (!s.peer_path.empty()) ::unlink(s.peer_path.c_str());
  if (!s.ctl_path.empty()) ::unlink(s.ctl_path.c_str());
}

/// Drops what a forked child inherited (its driver is a fresh one).
void reset_inherited(State& s) {
  std::lock_guard<std::mutex> l(s.mu);
  std::lock_guard<std::mutex> c(s.cache_mu);
  for (auto& [id, held] : s.cache) held.close_if_ours();  // atfork_child did, mostly
  s.cache.clear();
  s.cache_meta.clear();
  s.allocs.clear();
  s.by_key.clear();
  s.handles.clear();
  s.handle_refs.clear();
  s.ranges.clear();
  s.legacy_blocks.clear();
  {
    std::unique_lock<WriterFirstLock> t(s.tails_mu);
    s.tails.clear();
    s.tailed_blocks.store(0);
  }
  s.deferred_frees.clear();
  s.pending_frees.clear();  // the parent's events: not the child's to query or destroy
  s.pending_count.store(0);
  s.ipc.clear();
  s.peers.clear();
  s.contexts.clear();
  s.multicast.clear();
  s.mc_driver.clear();
  s.mc_released = false;
  s.foreign_alive = s.foreign_total = 0;
  s.driver_blocks.clear();
  s.driver_ipc_exports = 0;
  s.driver_block_why[0] = '\0';
  s.sharing_calls = 0;
  close_listener(&s.peer_listen, s.peer_path);
  close_listener(&s.ctl_listen, s.ctl_path);
  s.peer_path.clear();
  s.ctl_path.clear();
}

void start_slow() noexcept {
  // Once per process, from whichever hook came first: opens, reads, binds and
  // waits for the listeners (nanosleep) inside the catch below.
  const NoCancel no_cancel;
  try {
    Lock l(g_start_mu);
    State& s = state();
    if (g_reset.load(std::memory_order_relaxed)) {
      reset_inherited(s);
      g_reset.store(false, std::memory_order_relaxed);
      g_mode.store(kModeUnknown, std::memory_order_release);
    }
    if (g_mode.load(std::memory_order_relaxed) != kModeUnknown) return;
    const char* dir = std::getenv("CUSNAP_RUNTIME_DIR");
    const char* track = std::getenv("CUSNAP_SHIM_TRACK");
    if (!dir || !*dir || (track && std::strcmp(track, "0") == 0)) {
      g_mode.store(kModeOff, std::memory_order_release);
      return;
    }
    const char* legacy = std::getenv("CUSNAP_SHIM_LEGACY_VMM");
    g_legacy_vmm = !(legacy && std::strcmp(legacy, "0") == 0);
    s.runtime_dir = dir;
    s.pid = ::getpid();
    s.start_time = process_start_time(static_cast<pid_t>(s.pid));
    s.uid = ::getuid();
    static bool atexit_done = false;
    if (!atexit_done) atexit_done = std::atexit(unlink_sockets) == 0;
    g_mode.store(start_servers(s) ? kModeOn : kModeOff, std::memory_order_release);
  } catch (...) {
    g_mode.store(kModeOff, std::memory_order_release);
  }
}

}  // namespace

void log(const char* what) noexcept {
  if (debug_enabled()) say("%s", what);
}

uint64_t add_created(State& s, CUmemGenericAllocationHandle d, uint64_t size,
                     const CUmemAllocationProp& prop) {
  uint64_t id = s.next_alloc++;
  Alloc a;
  a.origin = Alloc::Origin::kCreated;
  a.key = {s.pid, s.start_time, id};
  a.size = size;
  a.device = prop.location.id;
  a.driver = d;
  a.prop = prop;
  s.allocs.emplace(id, a);
  s.by_key.emplace(a.key, id);
  return id;
}

void settle(State& s, uint64_t id, std::vector<CUmemGenericAllocationHandle>* release,
            std::vector<ListedFd>* close_fds) {
  auto it = s.allocs.find(id);
  if (it == s.allocs.end()) return;
  Alloc& a = it->second;
  if (a.handles == 0 && a.pins == 0 && a.driver_held) {
    release->push_back(a.driver);
    a.driver_held = false;
  }
  if (a.handles == 0 && a.pins == 0 && a.mappings == 0) {
    if (a.origin == Alloc::Origin::kForeign) {
      if (s.foreign_alive) s.foreign_alive--;
    } else {
      s.by_key.erase(a.key);
    }
    {
      Lock c(s.cache_mu);
      auto ci = s.cache.find(id);
      if (ci != s.cache.end()) {
        // Closed later, if its number still names it; in the fork table until then.
        close_fds->push_back(list_held(ci->second));
        s.cache.erase(ci);
        s.cache_meta.erase(id);
        maybe_shrink(s.cache);
        maybe_shrink(s.cache_meta);
      }
    }
    s.allocs.erase(it);
    maybe_shrink(s.allocs);
    maybe_shrink(s.by_key);
  }
}

void finish(const std::vector<CUmemGenericAllocationHandle>& release, std::vector<ListedFd>* fds) {
  auto rel = REAL(cuMemRelease);
  for (auto h : release)
    if (rel) rel(h);
  if (fds)
    for (ListedFd& fd : *fds) fd.reset();
}

std::map<uint64_t, Mapping>::iterator containing(State& s, uint64_t p) {
  return range_containing(s.ranges, p, [](const Mapping& m) { return m.size; });
}

CUresult ensure_cached(State& s, uint64_t id, CUmemGenericAllocationHandle driver) {
  {
    Lock c(s.cache_mu);
    if (s.cache.count(id)) return CUDA_SUCCESS;
  }
  auto exp = REAL(cuMemExportToShareableHandle);
  if (!exp) return CUDA_ERROR_NOT_SUPPORTED;
  int fd = -1;
  CUresult r = exp(&fd, driver, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (r != CUDA_SUCCESS) return r;
  // In the fork table until it enters the cache (at a fork, in the one or
  // the other), at a high number: kept for long, out of the numbers the
  // application reuses first.
  ListedFd listed;
  list_new(fd, &listed);
  {
    Lock l(s.mu);
    auto it = s.allocs.find(id);
    if (it != s.allocs.end()) {
      Lock c(s.cache_mu);
      if (listed.ours() && !s.cache.count(id)) {
        s.cache.emplace(id, HeldFd::of(listed.get()));
        s.cache_meta[id] = {it->second.generation, it->second.size};
        listed.release();  // the cache's now
      }
      it->second.exported = true;
    }
  }
  return CUDA_SUCCESS;  // one not kept is closed (listed)
}

std::string peer_socket_of(const State& s, const AllocKey& k) {
  return proto::shim_peer_socket(s.runtime_dir, k.pid);
}

CUresult import_ticket(State& s, const proto::Ticket& t, bool as_pin, uint64_t* id_out) {
  AllocKey key{t.creator_pid, t.creator_start, t.allocation};
  {
    Lock l(s.mu);
    auto it = s.by_key.find(key);
    if (it != s.by_key.end() && s.allocs[it->second].driver_held) {
      Alloc& a = s.allocs[it->second];
      if (as_pin)
        a.pins++;
      else
        a.handles++;
      *id_out = it->second;
      return CUDA_SUCCESS;
    }
  }
  if (key.pid == s.pid && key.start == s.start_time) return CUDA_ERROR_INVALID_HANDLE;
  std::string err;
  uint64_t generation = 0;
  CUmemGenericAllocationHandle d = 0;
  CUresult r = CUDA_ERROR_NOT_SUPPORTED;
  if (!fetch_descriptor(t, &err, &generation, [&](int fd) {
        if (auto imp = REAL(cuMemImportFromShareableHandle))
          r = imp(&d, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      })) {
    log(("import: " + err).c_str());
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (r != CUDA_SUCCESS) return r;
  CUmemAllocationProp prop{};
  int32_t device = 0;
  if (auto gp = REAL(cuMemGetAllocationPropertiesFromHandle); gp && gp(&prop, d) == CUDA_SUCCESS)
    device = prop.location.id;
  std::vector<CUmemGenericAllocationHandle> extra;
  {
    Lock l(s.mu);
    auto it = s.by_key.find(key);
    uint64_t id;
    if (it != s.by_key.end()) {
      id = it->second;
      Alloc& a = s.allocs[id];
      if (a.driver_held) {
        extra.push_back(d);  // another thread imported it meanwhile
      } else {
        a.driver = d;
        a.driver_held = true;
      }
    } else {
      id = s.next_alloc++;
      Alloc a;
      a.origin = Alloc::Origin::kImported;
      a.key = key;
      a.size = t.bytes;
      a.device = device;
      a.driver = d;
      a.prop = prop;
      a.generation = generation;
      s.allocs.emplace(id, a);
      s.by_key.emplace(key, id);
    }
    Alloc& a = s.allocs[id];
    if (as_pin)
      a.pins++;
    else
      a.handles++;
    *id_out = id;
  }
  finish(extra);
  return CUDA_SUCCESS;
}

void union_access(std::vector<proto::AccessRecord>* set, const CUmemAccessDesc& d) {
  for (auto& a : *set)
    if (a.type == d.location.type && a.id == d.location.id) {
      a.flags |= d.flags;
      return;
    }
  set->push_back(
      {static_cast<int32_t>(d.location.type), d.location.id, static_cast<uint32_t>(d.flags)});
}

State& state() noexcept {
  static OncePointer<State> s;
  return *s.get([] { return new State; }, [](State* extra) { delete extra; });
}

uint64_t process_start_time(pid_t pid) noexcept {
  uint64_t t = 0;
  return proto::proc_start_time(pid, &t, false) ? t : 0;
}

void note_activity() noexcept {
  int m = g_mode.load(std::memory_order_acquire);
  if (__builtin_expect(m == kModeOff, 1)) return;
  if (m == kModeOn && !g_reset.load(std::memory_order_relaxed)) return;
  start_slow();
}

bool active() noexcept {
  note_activity();
  return g_mode.load(std::memory_order_acquire) == kModeOn;
}

bool tracking_on() noexcept {
  return g_mode.load(std::memory_order_acquire) == kModeOn;
}

bool legacy_vmm() noexcept {
  return g_legacy_vmm;
}

void atfork_prepare() noexcept {
  g_start_mu.lock();
  state().mu.lock();
  state().cache_mu.lock();
  conns_atfork_prepare();
  drain_atfork_prepare();
}
void atfork_parent() noexcept {
  drain_atfork_parent();
  conns_atfork_parent();
  state().cache_mu.unlock();
  state().mu.unlock();
  g_start_mu.unlock();
}
void atfork_child() noexcept {
  // The parent's descriptors are the child's copies now: closed at once,
  // while their numbers still name them (the child may close and reuse
  // numbers before its first CUDA activity, when the rest is reset).
  if (g_mode.load(std::memory_order_relaxed) == kModeOn) {
    State& s = state();
    for (auto& [id, held] : s.cache) held.close_if_ours();
    close_listener(&s.peer_listen, s.peer_path);
    close_listener(&s.ctl_listen, s.ctl_path);
  }
  conns_atfork_child();  // the listeners' connections
  drain_atfork_child();  // no drain thread in the child
  // A reaper of the parent's (another thread) may have held it: the child
  // has none, and no pending frees once reset.
  new (&state().reap_mu) std::mutex;
  new (&state().access_mu) std::mutex;  // likewise a grant's or a free's
  // The copy check's lock may be read-held by a thread the child lacks, with
  // no way to release it: renewed. The table it guards is whole (changed
  // only under mu, held here).
  state().tails_mu.renew();
  state().cache_mu.unlock();
  state().mu.unlock();
  g_start_mu.unlock();
  if (g_mode.load(std::memory_order_relaxed) == kModeOn) g_reset.store(true);
}

void note_context(CUcontext ctx, bool alive) noexcept {
  if (!ctx || g_mode.load(std::memory_order_acquire) != kModeOn) return;
  try {
    State& s = state();
    Lock l(s.mu);
    auto it = std::find(s.contexts.begin(), s.contexts.end(), ctx);
    if (alive && it == s.contexts.end()) s.contexts.push_back(ctx);
    if (!alive && it != s.contexts.end()) s.contexts.erase(it);
  } catch (...) {
  }
}

CUresult init(PfnInit real, unsigned int flags) noexcept {
  CUresult r = real(flags);
  if (r == CUDA_SUCCESS) note_activity();
  return r;
}

proto::ShimRecords snapshot(State& s) {
  proto::ShimRecords r;
  Lock l(s.mu);
  r.pid = s.pid;
  r.start_time = s.start_time;
  for (auto& [id, a] : s.allocs) {
    proto::AllocationRecord x;
    x.id = id;
    x.origin = a.origin == Alloc::Origin::kCreated    ? "created"
               : a.origin == Alloc::Origin::kImported ? "imported"
                                                      : "foreign";
    x.creator_pid = a.key.pid;
    x.creator_start = a.key.start;
    x.creator_id = a.key.id;
    x.size = a.size;
    x.device = a.device;
    x.handles = a.handles;
    x.exported = a.exported;
    x.legacy = a.legacy;
    x.generation = a.generation;
    r.allocations.push_back(std::move(x));
  }
  std::sort(r.allocations.begin(), r.allocations.end(),
            [](const auto& a, const auto& b) { return a.id < b.id; });
  for (auto& [addr, m] : s.ranges) {
    proto::MappingRecord x;
    x.address = addr;
    x.size = m.size;
    x.offset = m.offset;
    x.allocation = m.alloc;
    x.multicast = m.multicast;
    x.access = m.access;
    r.mappings.push_back(std::move(x));
  }
  for (auto& o : s.ipc) r.ipc.push_back({o.address, o.size, o.alloc, o.opens});
  for (auto& [h, m] : s.multicast) r.multicast.push_back(m);
  r.foreign_imports_alive = s.foreign_alive;
  r.foreign_imports_total = s.foreign_total;
  r.driver_blocks = s.driver_blocks.size();
  r.driver_ipc_exports = s.driver_ipc_exports;
  r.driver_block_why = s.driver_block_why;
  r.sharing_calls = s.sharing_calls.load();
  r.tailed_blocks = s.tailed_blocks.load(std::memory_order_relaxed);
  return r;
}

}  // namespace cusnap::shim::track
