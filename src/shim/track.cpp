// Tracking of shared device memory: logical handles, tickets, the range index,
// legacy IPC served from exportable allocations, multicast records.
// Contract and locks: track.h; state: track_state.h; format: docs/shim.md.
#include "shim/track.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "shim/real_driver.h"
#include "shim/track_state.h"


namespace cusnap::shim::track {

namespace {

constexpr int kModeUnknown = 0, kModeOff = 1, kModeOn = 2;
std::atomic<int> g_mode{kModeUnknown};
std::atomic<bool> g_reset{false};
std::mutex g_start_mu;
bool g_legacy_vmm = true;

using Lock = std::lock_guard<std::mutex>;

void log(const char* what) noexcept {
  static const bool on = [] {
    const char* e = std::getenv("CUSNAP_SHIM_DEBUG");
    return e && *e && std::strcmp(e, "0") != 0;
  }();
  if (on) std::fprintf(stderr, "cusnap-shim[%d]: %s\n", static_cast<int>(::getpid()), what);
}

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
  for (auto& [id, fd] : s.cache) ::close(fd);
  s.cache.clear();
  s.cache_gen.clear();
  s.allocs.clear();
  s.by_key.clear();
  s.handles.clear();
  s.ranges.clear();
  s.legacy_blocks.clear();
  s.ipc.clear();
  s.peers.clear();
  s.contexts.clear();
  s.multicast.clear();
  s.mc_driver.clear();
  s.mc_released = false;
  s.foreign_alive = s.foreign_total = 0;
  if (s.peer_listen >= 0) ::close(s.peer_listen);
  if (s.ctl_listen >= 0) ::close(s.ctl_listen);
  s.peer_listen = s.ctl_listen = -1;
  s.peer_path.clear();
  s.ctl_path.clear();
}

void start_slow() noexcept {
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

/// Records an allocation this process created with driver handle d (s.mu
/// held); returns its local id.
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

uint64_t new_handle(State& s, uint64_t id) {
  uint64_t h = kHandleTag | (s.next_handle++ & 0xFFFFFFFFFFFFull);
  s.handles.emplace(h, id);
  s.allocs[id].handles++;
  return h;
}

/// After a change of counts: releases the driver handle when nothing logical
/// or internal holds it, and forgets the allocation when nothing maps it either.
void settle(State& s, uint64_t id, std::vector<CUmemGenericAllocationHandle>* release,
            std::vector<int>* close_fds) {
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
        close_fds->push_back(ci->second);
        s.cache.erase(ci);
        s.cache_gen.erase(id);
        maybe_shrink(s.cache);
        maybe_shrink(s.cache_gen);
      }
    }
    s.allocs.erase(it);
    maybe_shrink(s.allocs);
    maybe_shrink(s.by_key);
  }
}

void finish(const std::vector<CUmemGenericAllocationHandle>& release, const std::vector<int>& fds) {
  auto rel = REAL(cuMemRelease);
  for (auto h : release)
    if (rel) rel(h);
  for (int fd : fds) ::close(fd);
}

/// Mappings of the range index that overlap [p, p+n): their addresses, and
/// whether any of them is only partly inside.
bool overlapping(State& s, uint64_t p, uint64_t n, std::vector<uint64_t>* out) {
  bool partial = false;
  const uint64_t end = p + n;
  auto it = s.ranges.upper_bound(p);
  if (it != s.ranges.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.size > p) it = prev;
  }
  for (; it != s.ranges.end() && it->first < end; ++it) {
    if (it->first + it->second.size <= p) continue;
    if (it->first < p || it->first + it->second.size > end) partial = true;
    out->push_back(it->first);
  }
  return partial;
}

/// The mapping that contains address p, or end().
std::map<uint64_t, Mapping>::iterator containing(State& s, uint64_t p) {
  auto it = s.ranges.upper_bound(p);
  if (it == s.ranges.begin()) return s.ranges.end();
  --it;
  return p < it->first + it->second.size ? it : s.ranges.end();
}

/// Fills the export cache for an allocation created here (calls the driver,
/// without holding any lock).
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
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  bool kept = false;
  {
    Lock l(s.mu);
    auto it = s.allocs.find(id);
    if (it != s.allocs.end()) {
      Lock c(s.cache_mu);
      kept = s.cache.emplace(id, fd).second;
      if (kept) s.cache_gen[id] = it->second.generation;
      it->second.exported = true;
    }
  }
  if (!kept) ::close(fd);
  return CUDA_SUCCESS;
}

/// A ticket memfd naming key; -1 on failure.
int make_ticket(const State& s, const AllocKey& key, uint64_t bytes, const std::string& socket) {
  proto::Ticket t{};
  std::memcpy(t.magic, proto::kTicketMagic, sizeof(t.magic));
  t.version = proto::kTicketVersion;
  t.size = sizeof(t);
  t.creator_pid = key.pid;
  t.creator_start = key.start;
  t.allocation = key.id;
  t.bytes = bytes;
  std::snprintf(t.socket, sizeof(t.socket), "%s", socket.c_str());
  (void)s;
  int fd = ::memfd_create(proto::kTicketMemfdName, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  if (::pwrite(fd, &t, sizeof(t), 0) != static_cast<ssize_t>(sizeof(t))) {
    ::close(fd);
    return -1;
  }
  ::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  return fd;
}

/// Whether fd is a ticket memfd (by its name: never reads other descriptors).
bool is_ticket_fd(int fd) {
  char path[64], target[128];
  std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  ssize_t n = ::readlink(path, target, sizeof(target) - 1);
  if (n <= 0) return false;
  target[n] = 0;
  static constexpr char kPrefix[] = "/memfd:cusnap-ticket";
  return std::strncmp(target, kPrefix, sizeof(kPrefix) - 1) == 0;
}

std::string peer_socket_of(const State& s, const AllocKey& k) {
  return proto::shim_peer_socket(s.runtime_dir, k.pid);
}

/// A driver handle for the allocation a ticket names: an alias of the one this
/// process holds, or a fresh import of the creator's descriptor. *id gets the
/// local id (created if new, with origin imported); the caller owns one
/// reference it must turn into a logical handle or a pin (under s.mu).
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
  int fd = fetch_descriptor(t, &err, &generation);
  if (fd < 0) {
    log(("import: " + err).c_str());
    return CUDA_ERROR_INVALID_HANDLE;
  }
  CUmemGenericAllocationHandle d = 0;
  auto imp = REAL(cuMemImportFromShareableHandle);
  CUresult r = imp ? imp(&d, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
                   : CUDA_ERROR_NOT_SUPPORTED;
  ::close(fd);
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
  finish(extra, {});
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

}  // namespace

namespace {
/// Set once a checkpoint rebuilt a multicast object: only then do multicast
/// handles need translating (and the lock for it).
std::atomic<bool> g_mc_translated{false};
}  // namespace

CUmemGenericAllocationHandle mc_driver_handle(State& s, CUmemGenericAllocationHandle h) noexcept {
  if (!g_mc_translated.load(std::memory_order_acquire)) return h;
  Lock l(s.mu);
  auto it = s.mc_driver.find(h);
  return it == s.mc_driver.end() ? h : it->second;
}

void note_mc_translation() noexcept {
  g_mc_translated.store(true, std::memory_order_release);
}

void mc_forget(State& s, CUmemGenericAllocationHandle h) noexcept {
  if (s.multicast.erase(h)) maybe_shrink(s.multicast);
  if (s.mc_driver.erase(h)) maybe_shrink(s.mc_driver);
}

State& state() noexcept {
  static State* s = new State;
  return *s;
}

uint64_t process_start_time(pid_t pid) noexcept {
  char path[64], buf[1024];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  const char* p = std::strrchr(buf, ')');
  if (!p) return 0;
  // Fields after the command: state is field 3; starttime is field 22.
  int field = 2;
  for (; *p && field < 22; ++p)
    if (*p == ' ') ++field;
  return std::strtoull(p, nullptr, 10);
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

void atfork_prepare() noexcept {
  g_start_mu.lock();
  state().mu.lock();
  state().cache_mu.lock();
}
void atfork_parent() noexcept {
  state().cache_mu.unlock();
  state().mu.unlock();
  g_start_mu.unlock();
}
void atfork_child() noexcept {
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

CUresult mem_create(decltype(&::cuMemCreate) real, CUmemGenericAllocationHandle* handle,
                    size_t size, const CUmemAllocationProp* prop,
                    unsigned long long flags) noexcept {
  if (!prop || prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !active())
    return real(handle, size, prop, flags);
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  CUmemGenericAllocationHandle d = 0;
  CUresult r = real(&d, size, prop, flags);
  if (r != CUDA_SUCCESS) return r;
  State& s = state();
  try {
    Lock l(s.mu);
    *handle = new_handle(s, add_created(s, d, size, *prop));
    return CUDA_SUCCESS;
  } catch (...) {
  }
  REAL(cuMemRelease)(d);
  return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult mem_release(decltype(&::cuMemRelease) real, CUmemGenericAllocationHandle handle) noexcept {
  if (!is_logical(handle)) {
    CUresult r = real(mc_driver_handle(state(), handle));
    if (r == CUDA_SUCCESS && g_mode.load(std::memory_order_acquire) == kModeOn) {
      State& s = state();
      Lock l(s.mu);
      mc_forget(s, handle);
    }
    return r;
  }
  if (!active()) return CUDA_ERROR_INVALID_HANDLE;
  State& s = state();
  std::vector<CUmemGenericAllocationHandle> rel;
  std::vector<int> fds;
  try {
    Lock l(s.mu);
    auto it = s.handles.find(handle);
    if (it == s.handles.end()) return CUDA_ERROR_INVALID_HANDLE;
    uint64_t id = it->second;
    s.handles.erase(it);
    maybe_shrink(s.handles);
    auto a = s.allocs.find(id);
    if (a != s.allocs.end() && a->second.handles) a->second.handles--;
    settle(s, id, &rel, &fds);
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
  CUresult r = CUDA_SUCCESS;
  for (auto h : rel)
    if (CUresult x = real(h); x != CUDA_SUCCESS) r = x;
  for (int fd : fds) ::close(fd);
  return r;
}

CUresult mem_export(decltype(&::cuMemExportToShareableHandle) real, void* shareable,
                    CUmemGenericAllocationHandle handle, CUmemAllocationHandleType type,
                    unsigned long long flags) noexcept {
  if (!is_logical(handle)) return real(shareable, mc_driver_handle(state(), handle), type, flags);
  if (!shareable || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (!active()) return CUDA_ERROR_INVALID_HANDLE;
  State& s = state();
  try {
    uint64_t id;
    Alloc a;
    {
      Lock l(s.mu);
      auto it = s.handles.find(handle);
      if (it == s.handles.end()) return CUDA_ERROR_INVALID_HANDLE;
      id = it->second;
      a = s.allocs[id];
    }
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
    if (a.origin == Alloc::Origin::kForeign) return real(shareable, a.driver, type, 0);
    if (a.origin == Alloc::Origin::kCreated) {
      if (CUresult r = ensure_cached(s, id, a.driver); r != CUDA_SUCCESS) return r;
    }
    int fd = make_ticket(s, a.key, a.size, peer_socket_of(s, a.key));
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *static_cast<int*>(shareable) = fd;
    return CUDA_SUCCESS;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

CUresult mem_import(decltype(&::cuMemImportFromShareableHandle) real,
                    CUmemGenericAllocationHandle* handle, void* os_handle,
                    CUmemAllocationHandleType type) noexcept {
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !active())
    return real(handle, os_handle, type);
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  State& s = state();
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(os_handle));
  try {
    if (!is_ticket_fd(fd)) {
      CUmemGenericAllocationHandle d = 0;
      CUresult r = real(&d, os_handle, type);
      if (r != CUDA_SUCCESS) return r;
      CUmemAllocationProp prop{};
      int32_t device = 0;
      if (auto gp = REAL(cuMemGetAllocationPropertiesFromHandle); gp && gp(&prop, d) == 0)
        device = prop.location.id;
      Lock l(s.mu);
      s.foreign_total++;
      for (auto& [id, a] : s.allocs)
        if (a.origin == Alloc::Origin::kForeign && a.driver_held && a.driver == d) {
          *handle = new_handle(s, id);
          return CUDA_SUCCESS;
        }
      uint64_t id = s.next_alloc++;
      Alloc a;
      a.origin = Alloc::Origin::kForeign;
      a.driver = d;
      a.device = device;
      s.allocs.emplace(id, a);
      s.foreign_alive++;
      *handle = new_handle(s, id);
      log("import of a descriptor that is not a ticket (counted as foreign)");
      return CUDA_SUCCESS;
    }
    unsigned char buf[sizeof(proto::Ticket) + 1];
    ssize_t n = ::pread(fd, buf, sizeof(buf), 0);
    proto::Ticket t;
    std::string err;
    if (n < 0 || !proto::ticket_valid(buf, static_cast<size_t>(n), &t, &err)) {
      log(("import: " + err).c_str());
      return CUDA_ERROR_INVALID_VALUE;
    }
    uint64_t id = 0;
    CUresult r = import_ticket(s, t, false, &id);
    if (r != CUDA_SUCCESS) return r;
    Lock l(s.mu);
    // import_ticket counted one handle; give it its logical name.
    uint64_t h = kHandleTag | (s.next_handle++ & 0xFFFFFFFFFFFFull);
    s.handles.emplace(h, id);
    *handle = h;
    return CUDA_SUCCESS;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

CUresult mem_retain(decltype(&::cuMemRetainAllocationHandle) real,
                    CUmemGenericAllocationHandle* handle, void* addr) noexcept {
  if (!active()) return real(handle, addr);
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  State& s = state();
  try {
    uint64_t id = 0;
    {
      Lock l(s.mu);
      auto m = containing(s, reinterpret_cast<uint64_t>(addr));
      if (m == s.ranges.end() || m->second.alloc == 0) return real(handle, addr);
      id = m->second.alloc;
      Alloc& a = s.allocs[id];
      if (a.driver_held) {
        *handle = new_handle(s, id);
        return CUDA_SUCCESS;
      }
    }
    CUmemGenericAllocationHandle d = 0;
    CUresult r = real(&d, addr);
    if (r != CUDA_SUCCESS) return r;
    std::vector<CUmemGenericAllocationHandle> extra;
    Lock l(s.mu);
    auto it = s.allocs.find(id);
    if (it == s.allocs.end()) {
      extra.push_back(d);
      finish(extra, {});
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (it->second.driver_held) {
      extra.push_back(d);
    } else {
      it->second.driver = d;
      it->second.driver_held = true;
    }
    *handle = new_handle(s, id);
    finish(extra, {});
    return CUDA_SUCCESS;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

CUresult mem_map(decltype(&::cuMemMap) real, CUdeviceptr ptr, size_t size, size_t offset,
                 CUmemGenericAllocationHandle handle, unsigned long long flags) noexcept {
  if (!active()) return real(ptr, size, offset, handle, flags);
  State& s = state();
  try {
    uint64_t id = 0, mc = 0;
    CUmemGenericAllocationHandle d = handle;
    {
      Lock l(s.mu);
      std::vector<uint64_t> hit;
      overlapping(s, ptr, size, &hit);
      if (!hit.empty()) return CUDA_ERROR_INVALID_VALUE;
      if (is_logical(handle)) {
        auto it = s.handles.find(handle);
        if (it == s.handles.end()) return CUDA_ERROR_INVALID_HANDLE;
        id = it->second;
        d = s.allocs[id].driver;
      } else if (s.multicast.count(handle)) {
        mc = handle;
        auto t = s.mc_driver.find(handle);
        if (t != s.mc_driver.end()) d = t->second;
      }
    }
    CUresult r = real(ptr, size, offset, d, flags);
    if (r != CUDA_SUCCESS || (id == 0 && mc == 0)) return r;
    Lock l(s.mu);
    Mapping m;
    m.size = size;
    m.offset = offset;
    m.alloc = id;
    m.multicast = mc;
    if (id) {
      auto a = s.allocs.find(id);
      if (a == s.allocs.end()) return CUDA_SUCCESS;  // released meanwhile: nothing to record
      a->second.mappings++;
    }
    s.ranges.emplace(ptr, std::move(m));
    return CUDA_SUCCESS;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

CUresult mem_unmap(decltype(&::cuMemUnmap) real, CUdeviceptr ptr, size_t size) noexcept {
  if (!active()) return real(ptr, size);
  State& s = state();
  try {
    std::vector<uint64_t> hit;
    {
      Lock l(s.mu);
      if (overlapping(s, ptr, size, &hit)) return CUDA_ERROR_INVALID_VALUE;
      for (uint64_t a : hit)
        if (s.legacy_blocks.count(a)) return CUDA_ERROR_INVALID_VALUE;
    }
    CUresult r = real(ptr, size);
    if (r != CUDA_SUCCESS || hit.empty()) return r;
    std::vector<CUmemGenericAllocationHandle> rel;
    std::vector<int> fds;
    {
      Lock l(s.mu);
      for (uint64_t a : hit) {
        auto it = s.ranges.find(a);
        if (it == s.ranges.end()) continue;
        uint64_t id = it->second.alloc;
        s.ranges.erase(it);
        auto al = s.allocs.find(id);
        if (id && al != s.allocs.end()) {
          if (al->second.mappings) al->second.mappings--;
          settle(s, id, &rel, &fds);
        }
      }
    }
    finish(rel, fds);
    return CUDA_SUCCESS;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

CUresult mem_set_access(decltype(&::cuMemSetAccess) real, CUdeviceptr ptr, size_t size,
                        const CUmemAccessDesc* desc, size_t count) noexcept {
  if (!active()) return real(ptr, size, desc, count);
  if (!desc && count) return CUDA_ERROR_INVALID_VALUE;
  State& s = state();
  try {
    std::vector<uint64_t> hit;
    {
      Lock l(s.mu);
      if (overlapping(s, ptr, size, &hit)) return CUDA_ERROR_INVALID_VALUE;
    }
    CUresult r = real(ptr, size, desc, count);
    if (r != CUDA_SUCCESS || hit.empty()) return r;
    Lock l(s.mu);
    for (uint64_t a : hit) {
      auto it = s.ranges.find(a);
      if (it == s.ranges.end()) continue;
      for (size_t i = 0; i < count; ++i) {
        union_access(&it->second.access, desc[i]);
        // Set by the application: no longer peer access's to revoke.
        auto& po = it->second.peer_only;
        if (desc[i].location.type == CU_MEM_LOCATION_TYPE_DEVICE)
          po.erase(std::remove(po.begin(), po.end(), desc[i].location.id), po.end());
      }
    }
    return CUDA_SUCCESS;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

CUresult mem_get_props(decltype(&::cuMemGetAllocationPropertiesFromHandle) real,
                       CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) noexcept {
  if (!is_logical(handle)) return real(prop, handle);
  if (!active()) return CUDA_ERROR_INVALID_HANDLE;
  State& s = state();
  CUmemGenericAllocationHandle d;
  {
    Lock l(s.mu);
    auto it = s.handles.find(handle);
    if (it == s.handles.end()) return CUDA_ERROR_INVALID_HANDLE;
    d = s.allocs[it->second].driver;
  }
  return real(prop, d);
}

// Peer access. The driver's cuCtxEnablePeerAccess lets the current context
// reach cuMemAlloc memory of the peer context, but not VMM mappings, so a
// cuMemAlloc block served by a mapping gets explicit access (read-write) for
// every device whose context enabled peer access to the block's device: the
// existing blocks when peer access is enabled, a new block when it is made.
// Access that came from peer access only (Mapping::peer_only) is revoked
// (PROT_NONE) when the last grant between the two devices is disabled; access
// the application set itself is never revoked.

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

/// Grants the block at addr read-write for every device with peer access to
/// its device that lacks it, and records what it granted.
CUresult grant_peers(State& s, CUdeviceptr addr) {
  std::vector<CUmemAccessDesc> add;
  uint64_t size = 0;
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
  for (auto& d : add) {
    const bool had = has_record(m->second.access, d.location.id);
    union_access(&m->second.access, d);
    auto& po = m->second.peer_only;
    if (!had && std::find(po.begin(), po.end(), d.location.id) == po.end())
      po.push_back(d.location.id);
  }
  return CUDA_SUCCESS;
}

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
/// blocks of device `to` where it came from peer access only. A revocation
/// the driver refuses leaves that access (and its record) in place.
void revoke_peers(State& s, int32_t from, int32_t to) {
  std::vector<std::pair<uint64_t, uint64_t>> blocks;
  {
    Lock l(s.mu);
    if (granted(s, from, to)) return;
    for (auto& [addr, id] : s.legacy_blocks) {
      auto a = s.allocs.find(id);
      auto m = s.ranges.find(addr);
      if (a == s.allocs.end() || a->second.device != to || m == s.ranges.end()) continue;
      auto& po = m->second.peer_only;
      if (std::find(po.begin(), po.end(), from) != po.end())
        blocks.emplace_back(addr, m->second.size);
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
    if (m == s.ranges.end()) continue;
    auto& po = m->second.peer_only;
    auto p = std::find(po.begin(), po.end(), from);
    if (p == po.end()) continue;  // the application set it meanwhile
    po.erase(p);
    auto& acc = m->second.access;
    acc.erase(std::remove_if(acc.begin(), acc.end(),
                             [&](const proto::AccessRecord& a) {
                               return a.type == CU_MEM_LOCATION_TYPE_DEVICE && a.id == from;
                             }),
              acc.end());
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
  if (!active() || !g_legacy_vmm) return real(peer, flags);
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
  if (!active() || !g_legacy_vmm) return real(peer);
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

// Legacy IPC. While tracking is active, cuMemAlloc is served by an exportable
// allocation (POSIX-fd handle type) mapped at a reserved address, so an IPC
// handle can name the allocation and an opener can import it through the
// creator's peer socket and map it at an address of its own reservation.

CUresult mem_alloc(decltype(&::cuMemAlloc_v2) real, CUdeviceptr* dptr, size_t bytes) noexcept {
  if (!active() || !g_legacy_vmm) return real(dptr, bytes);
  if (!dptr || bytes == 0) return real(dptr, bytes);
  CUdevice dev = 0;
  auto get_dev = REAL(cuCtxGetDevice);
  auto gran = REAL(cuMemGetAllocationGranularity);
  auto create = REAL(cuMemCreate);
  auto reserve = REAL(cuMemAddressReserve);
  auto map = REAL(cuMemMap);
  auto access = REAL(cuMemSetAccess);
  auto unmap = REAL(cuMemUnmap);
  auto release = REAL(cuMemRelease);
  auto addr_free = REAL(cuMemAddressFree);
  if (!get_dev || !gran || !create || !reserve || !map || !access || !unmap || !release ||
      !addr_free)
    return real(dptr, bytes);
  CUresult r = get_dev(&dev);
  if (r != CUDA_SUCCESS) return r;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t g = 0;
  if (gran(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || g == 0)
    return real(dptr, bytes);
  const size_t size = (bytes + g - 1) / g * g;
  CUmemGenericAllocationHandle d = 0;
  if ((r = create(&d, size, &prop, 0)) != CUDA_SUCCESS) return r;
  CUdeviceptr addr = 0;
  if ((r = reserve(&addr, size, 0, 0, 0)) != CUDA_SUCCESS) {
    release(d);
    return r;
  }
  CUmemAccessDesc desc{};
  desc.location = prop.location;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if ((r = map(addr, size, 0, d, 0)) != CUDA_SUCCESS) {
    addr_free(addr, size);
    release(d);
    return r;
  }
  if ((r = access(addr, size, &desc, 1)) != CUDA_SUCCESS) {
    unmap(addr, size);
    addr_free(addr, size);
    release(d);
    return r;
  }
  State& s = state();
  try {
    Lock l(s.mu);
    uint64_t id = add_created(s, d, size, prop);
    Alloc& a = s.allocs[id];
    a.legacy = true;
    a.pins = 1;
    a.mappings = 1;
    Mapping m;
    m.size = size;
    m.alloc = id;
    union_access(&m.access, desc);
    s.ranges.emplace(addr, std::move(m));
    s.legacy_blocks.emplace(addr, id);
  } catch (...) {
    unmap(addr, size);
    addr_free(addr, size);
    release(d);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  // Devices with peer access to this one reach the block as they would the driver's.
  try {
    r = grant_peers(s, addr);
  } catch (...) {
    r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (r != CUDA_SUCCESS) {
    mem_free(REAL(cuMemFree_v2), addr);
    return r;
  }
  *dptr = addr;
  return CUDA_SUCCESS;
}

CUresult mem_free(decltype(&::cuMemFree_v2) real, CUdeviceptr dptr) noexcept {
  if (g_mode.load(std::memory_order_acquire) != kModeOn || !active()) return real(dptr);
  State& s = state();
  uint64_t id = 0, size = 0;
  std::vector<CUmemGenericAllocationHandle> rel;
  std::vector<int> fds;
  {
    Lock l(s.mu);
    auto b = s.legacy_blocks.find(dptr);
    if (b == s.legacy_blocks.end()) return real(dptr);
    id = b->second;
    s.legacy_blocks.erase(b);
    maybe_shrink(s.legacy_blocks);
    auto m = s.ranges.find(dptr);
    if (m != s.ranges.end()) {
      size = m->second.size;
      s.ranges.erase(m);
    }
  }
  // cuMemFree synchronizes with the device before the memory goes.
  if (auto sync = REAL(cuCtxSynchronize)) sync();
  REAL(cuMemUnmap)(dptr, size);
  REAL(cuMemAddressFree)(dptr, size);
  {
    Lock l(s.mu);
    auto a = s.allocs.find(id);
    if (a != s.allocs.end()) {
      if (a->second.mappings) a->second.mappings--;
      if (a->second.pins) a->second.pins--;
      settle(s, id, &rel, &fds);
    }
  }
  finish(rel, fds);
  return CUDA_SUCCESS;
}

CUresult ipc_get(decltype(&::cuIpcGetMemHandle) real, CUipcMemHandle* h,
                 CUdeviceptr dptr) noexcept {
  if (!active()) return real(h, dptr);
  if (!h) return CUDA_ERROR_INVALID_VALUE;
  State& s = state();
  try {
    uint64_t id;
    Alloc a;
    {
      Lock l(s.mu);
      auto m = containing(s, dptr);
      if (m == s.ranges.end() || !s.legacy_blocks.count(m->first)) return real(h, dptr);
      id = m->second.alloc;
      a = s.allocs[id];
    }
    if (CUresult r = ensure_cached(s, id, a.driver); r != CUDA_SUCCESS) return r;
    proto::IpcHandleBlob b{};
    std::memcpy(b.magic, proto::kIpcMagic, sizeof(b.magic));
    b.creator_pid = a.key.pid;
    b.creator_start = a.key.start;
    b.allocation = a.key.id;
    b.size = a.size;
    static_assert(sizeof(b) == sizeof(CUipcMemHandle));
    std::memcpy(h, &b, sizeof(b));
    return CUDA_SUCCESS;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

CUresult ipc_open(decltype(&::cuIpcOpenMemHandle_v2) real, CUdeviceptr* dptr, CUipcMemHandle h,
                  unsigned int flags) noexcept {
  if (!active()) return real(dptr, h, flags);
  if (!dptr) return CUDA_ERROR_INVALID_VALUE;
  proto::IpcHandleBlob b;
  std::memcpy(&b, &h, sizeof(b));
  State& s = state();
  try {
    if (std::memcmp(b.magic, proto::kIpcMagic, sizeof(b.magic)) != 0) {
      CUresult r = real(dptr, h, flags);
      if (r == CUDA_SUCCESS) {
        Lock l(s.mu);
        s.foreign_total++;
        s.foreign_alive++;
        s.ipc.push_back({nullptr, 0, *dptr, 0, 1});
      }
      return r;
    }
    if (b.creator_pid == s.pid && b.creator_start == s.start_time)
      return CUDA_ERROR_INVALID_CONTEXT;
    if (b.creator_pid <= 0 || b.allocation == 0 || b.size == 0) return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx = nullptr;
    CUdevice dev = 0;
    if (CUresult r = REAL(cuCtxGetCurrent)(&ctx); r != CUDA_SUCCESS) return r;
    if (CUresult r = REAL(cuCtxGetDevice)(&dev); r != CUDA_SUCCESS) return r;
    AllocKey key{b.creator_pid, b.creator_start, b.allocation};
    {
      Lock l(s.mu);
      auto k = s.by_key.find(key);
      if (k != s.by_key.end())
        for (auto& o : s.ipc)
          if (o.ctx == ctx && o.alloc == k->second) {
            o.opens++;
            *dptr = o.address;
            return CUDA_SUCCESS;
          }
    }
    proto::Ticket t{};
    t.creator_pid = b.creator_pid;
    t.creator_start = b.creator_start;
    t.allocation = b.allocation;
    t.bytes = b.size;
    std::snprintf(t.socket, sizeof(t.socket), "%s", peer_socket_of(s, key).c_str());
    uint64_t id = 0;
    if (CUresult r = import_ticket(s, t, true, &id); r != CUDA_SUCCESS) return r;
    CUmemGenericAllocationHandle d;
    {
      Lock l(s.mu);
      d = s.allocs[id].driver;
    }
    CUdeviceptr addr = 0;
    CUmemAccessDesc desc{};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = dev;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUresult r = REAL(cuMemAddressReserve)(&addr, b.size, 0, 0, 0);
    if (r == CUDA_SUCCESS) {
      r = REAL(cuMemMap)(addr, b.size, 0, d, 0);
      if (r == CUDA_SUCCESS) {
        r = REAL(cuMemSetAccess)(addr, b.size, &desc, 1);
        if (r != CUDA_SUCCESS) REAL(cuMemUnmap)(addr, b.size);
      }
      if (r != CUDA_SUCCESS) REAL(cuMemAddressFree)(addr, b.size);
    }
    std::vector<CUmemGenericAllocationHandle> rel;
    std::vector<int> fds;
    {
      Lock l(s.mu);
      Alloc& a = s.allocs[id];
      if (r != CUDA_SUCCESS) {
        if (a.pins) a.pins--;
        settle(s, id, &rel, &fds);
      } else {
        a.legacy = true;
        a.mappings++;
        Mapping m;
        m.size = b.size;
        m.alloc = id;
        union_access(&m.access, desc);
        s.ranges.emplace(addr, std::move(m));
        s.ipc.push_back({ctx, id, addr, b.size, 1});
        *dptr = addr;
      }
    }
    finish(rel, fds);
    return r;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

CUresult ipc_close(decltype(&::cuIpcCloseMemHandle) real, CUdeviceptr dptr) noexcept {
  if (!active()) return real(dptr);
  State& s = state();
  IpcOpen o;
  {
    Lock l(s.mu);
    auto it = s.ipc.begin();
    for (; it != s.ipc.end(); ++it)
      if (it->address == dptr) break;
    if (it == s.ipc.end()) return real(dptr);
    if (it->alloc == 0) {  // a foreign open: the driver's own mapping
      CUresult r = real(dptr);
      if (r == CUDA_SUCCESS && --it->opens == 0) {
        s.ipc.erase(it);
        if (s.foreign_alive) s.foreign_alive--;
      }
      return r;
    }
    if (--it->opens > 0) return CUDA_SUCCESS;
    o = *it;
    s.ipc.erase(it);
    s.ranges.erase(o.address);
  }
  REAL(cuMemUnmap)(o.address, o.size);
  REAL(cuMemAddressFree)(o.address, o.size);
  std::vector<CUmemGenericAllocationHandle> rel;
  std::vector<int> fds;
  {
    Lock l(s.mu);
    auto a = s.allocs.find(o.alloc);
    if (a != s.allocs.end()) {
      if (a->second.mappings) a->second.mappings--;
      if (a->second.pins) a->second.pins--;
      settle(s, o.alloc, &rel, &fds);
    }
  }
  finish(rel, fds);
  return CUDA_SUCCESS;
}

// Multicast: records objects, devices, bindings and mappings; member handles
// are translated to the driver's for the bind calls.

CUresult mc_create(decltype(&::cuMulticastCreate) real, CUmemGenericAllocationHandle* mc,
                   const CUmulticastObjectProp* prop) noexcept {
  CUresult r = real(mc, prop);
  if (r != CUDA_SUCCESS || !active()) return r;
  try {
    State& s = state();
    Lock l(s.mu);
    proto::MulticastRecord m;
    m.handle = *mc;
    m.size = prop->size;
    m.num_devices = prop->numDevices;
    m.flags = prop->handleTypes;
    s.multicast[*mc] = std::move(m);
  } catch (...) {
  }
  return r;
}

CUresult mc_add_device(decltype(&::cuMulticastAddDevice) real, CUmemGenericAllocationHandle mc,
                       CUdevice dev) noexcept {
  CUresult r = real(mc_driver_handle(state(), mc), dev);
  if (r != CUDA_SUCCESS || !active()) return r;
  try {
    State& s = state();
    Lock l(s.mu);
    auto it = s.multicast.find(mc);
    if (it != s.multicast.end()) it->second.devices.push_back(dev);
  } catch (...) {
  }
  return r;
}

CUresult mc_bind_mem(PfnBindMemV1 v1, PfnBindMemV2 v2, CUmemGenericAllocationHandle mc,
                     CUdevice dev, size_t mc_offset, CUmemGenericAllocationHandle mem,
                     size_t mem_offset, size_t size, unsigned long long flags) noexcept {
  const CUmemGenericAllocationHandle mcd = mc_driver_handle(state(), mc);
  auto call = [&](CUmemGenericAllocationHandle m) {
    return v2 ? v2(mcd, dev, mc_offset, m, mem_offset, size, flags)
              : v1(mcd, mc_offset, m, mem_offset, size, flags);
  };
  if (!is_logical(mem) && g_mode.load(std::memory_order_acquire) != kModeOn) return call(mem);
  if (!active()) return is_logical(mem) ? CUDA_ERROR_INVALID_HANDLE : call(mem);
  State& s = state();
  try {
    uint64_t id = 0;
    int32_t member_dev = -1;
    CUmemGenericAllocationHandle d = mem;
    if (is_logical(mem)) {
      Lock l(s.mu);
      auto it = s.handles.find(mem);
      if (it == s.handles.end()) return CUDA_ERROR_INVALID_HANDLE;
      id = it->second;
      d = s.allocs[id].driver;
      member_dev = s.allocs[id].device;
    } else if (CUmemAllocationProp p{};
               !v2 && REAL(cuMemGetAllocationPropertiesFromHandle)(&p, d) == CUDA_SUCCESS) {
      member_dev = p.location.id;
    }
    CUresult r = call(d);
    if (r != CUDA_SUCCESS) return r;
    Lock l(s.mu);
    auto it = s.multicast.find(mc);
    if (it != s.multicast.end()) {
      proto::McBindingRecord b;
      // The v1 ABI binds on the member's own device.
      b.device = v2 ? dev : member_dev;
      b.abi = v2 ? 2 : 1;
      b.mc_offset = mc_offset;
      b.allocation = id;
      b.mem_offset = mem_offset;
      b.size = size;
      it->second.bindings.push_back(b);
    }
    return CUDA_SUCCESS;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

CUresult mc_bind_addr(PfnBindAddrV1 v1, PfnBindAddrV2 v2, CUmemGenericAllocationHandle mc,
                      CUdevice dev, size_t mc_offset, CUdeviceptr ptr, size_t size,
                      unsigned long long flags) noexcept {
  const CUmemGenericAllocationHandle mcd = mc_driver_handle(state(), mc);
  CUresult r =
      v2 ? v2(mcd, dev, mc_offset, ptr, size, flags) : v1(mcd, mc_offset, ptr, size, flags);
  if (r != CUDA_SUCCESS || !active()) return r;
  try {
    State& s = state();
    Lock l(s.mu);
    auto it = s.multicast.find(mc);
    if (it != s.multicast.end()) {
      proto::McBindingRecord b;
      b.device = v2 ? dev : -1;
      b.abi = v2 ? 2 : 1;
      b.mc_offset = mc_offset;
      b.address = ptr;
      b.size = size;
      auto m = containing(s, ptr);
      if (m != s.ranges.end()) {
        b.allocation = m->second.alloc;
        auto a = s.allocs.find(b.allocation);
        if (!v2 && a != s.allocs.end()) b.device = a->second.device;
      }
      it->second.bindings.push_back(b);
    }
  } catch (...) {
  }
  return r;
}

CUresult mc_unbind(decltype(&::cuMulticastUnbind) real, CUmemGenericAllocationHandle mc,
                   CUdevice dev, size_t mc_offset, size_t size) noexcept {
  CUresult r = real(mc_driver_handle(state(), mc), dev, mc_offset, size);
  if (r != CUDA_SUCCESS || !active()) return r;
  State& s = state();
  Lock l(s.mu);
  auto it = s.multicast.find(mc);
  if (it != s.multicast.end()) {
    auto& v = it->second.bindings;
    for (auto b = v.begin(); b != v.end();)
      if (b->mc_offset == mc_offset && (b->device == dev || b->device == -1))
        b = v.erase(b);
      else
        ++b;
  }
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
  return r;
}

}  // namespace cusnap::shim::track
