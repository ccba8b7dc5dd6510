// Tracking of VMM allocations: the cuMem* hooks (create, release, export as a
// ticket, import, retain, map, unmap, access, properties).
// Contract and locks: track.h; state: track_state.h; helpers: track_internal.h.
#include "shim/track.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "shim/real_driver.h"
#include "shim/track_internal.h"

namespace cusnap::shim::track {

namespace {

uint64_t new_handle(State& s, uint64_t id) {
  uint64_t h = kHandleTag | (s.next_handle++ & 0xFFFFFFFFFFFFull);
  s.handles.emplace(h, id);
  s.allocs[id].handles++;
  return h;
}

/// A reference to allocation id for cuMemRetainAllocationHandle of a mapping
/// made with logical handle `mapped` (0: none): that handle, as the driver
/// returns the handle used to map the memory (one more reference when it is
/// alive; alive again, with one, when the application released it after
/// mapping: handles are never reused), else a new one. NCCL frees its
/// buffers so: retain, release, unmap, release the same value again.
uint64_t retained_handle(State& s, uint64_t id, uint64_t mapped) {
  if (mapped == 0) return new_handle(s, id);
  auto it = s.handles.find(mapped);
  if (it != s.handles.end() && it->second != id) return new_handle(s, id);
  if (it != s.handles.end())
    s.handle_refs[mapped]++;
  else
    s.handles.emplace(mapped, id);
  s.allocs[id].handles++;
  return mapped;
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

/// Whether any of the mappings at `hit` is a block the shim serves or a
/// legacy IPC open of the shim's: no VMM mapping to the application, which
/// cuMemUnmap and cuMemSetAccess refuse (INVALID_VALUE) as the driver does
/// for its own cuMemAlloc block and open, whatever the size (measured on an
/// H100: tests/gpu/probes/alloc_sizes.cpp ctx_attrs, ipc_attrs). cuMemFree
/// and cuIpcCloseMemHandle take them, and peer access is the only way to a
/// block's access (track_peers.cpp).
bool any_block(const State& s, const std::vector<uint64_t>& hit) {
  for (uint64_t a : hit) {
    auto m = s.ranges.find(a);
    if (m != s.ranges.end() && m->second.asked.kind != BlockAsked::Kind::kNone) return true;
  }
  return false;
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

}  // namespace

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
  const NoCancel no_cancel;  // closes the export cache's descriptor (track_internal.h)
  if (!is_logical(handle)) {
    CUresult r = real(mc_driver_handle(state(), handle));
    if (r == CUDA_SUCCESS && tracking_on()) {
      State& s = state();
      Lock l(s.mu);
      mc_forget(s, handle);
    }
    return r;
  }
  if (!active()) return CUDA_ERROR_INVALID_HANDLE;
  State& s = state();
  std::vector<CUmemGenericAllocationHandle> rel;
  std::vector<ListedFd> fds;
  try {
    Lock l(s.mu);
    auto it = s.handles.find(handle);
    if (it == s.handles.end()) return CUDA_ERROR_INVALID_HANDLE;
    uint64_t id = it->second;
    if (auto extra = s.handle_refs.find(handle); extra != s.handle_refs.end()) {
      if (--extra->second == 0) s.handle_refs.erase(extra);  // the handle stays, one fewer
    } else {
      s.handles.erase(it);
      maybe_shrink(s.handles);
    }
    auto a = s.allocs.find(id);
    if (a != s.allocs.end() && a->second.handles) a->second.handles--;
    settle(s, id, &rel, &fds);
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
  CUresult r = CUDA_SUCCESS;
  for (auto h : rel)
    if (CUresult x = real(h); x != CUDA_SUCCESS) r = x;
  for (ListedFd& fd : fds) fd.reset();  // the number may be the application's since
  return r;
}

CUresult mem_export(decltype(&::cuMemExportToShareableHandle) real, void* shareable,
                    CUmemGenericAllocationHandle handle, CUmemAllocationHandleType type,
                    unsigned long long flags) noexcept {
  const NoCancel no_cancel;  // pwrite, close (track_internal.h)
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
    note_sharing_call(s);
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
  const NoCancel no_cancel;  // pread, the fetch, close, log (track_internal.h)
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !active())
    return real(handle, os_handle, type);
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  State& s = state();
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(os_handle));
  note_sharing_call(s);
  try {
    if (!is_ticket_fd(fd)) {
      CUmemGenericAllocationHandle d = 0;
      CUresult r = real(&d, os_handle, type);
      if (r != CUDA_SUCCESS) return r;
      CUmemAllocationProp prop{};
      int32_t device = 0;
      if (auto gp = REAL(cuMemGetAllocationPropertiesFromHandle); gp && gp(&prop, d) == 0)
        device = prop.location.id;
      {
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
      }
      log("import of a descriptor that is not a ticket (counted as foreign)");  // s.mu dropped
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
    uint64_t id = 0, mapped = 0;
    {
      Lock l(s.mu);
      auto m = containing(s, reinterpret_cast<uint64_t>(addr));
      if (m != s.ranges.end() && m->second.alloc != 0) {
        id = m->second.alloc;
        mapped = m->second.handle;
      }
      if (auto a = s.allocs.find(id); id != 0 && a != s.allocs.end()) {
        // The driver refuses a cuMemAlloc block here (INVALID_VALUE, measured
        // on an H100), and legacy IPC memory (the simulated driver's
        // account): a block the shim serves, or an IPC open it made, is
        // refused too, so that a library that falls back on a refusal
        // (NCCL's registration of a cudaMalloc buffer) does as without it.
        if (a->second.legacy) return CUDA_ERROR_INVALID_VALUE;
        if (a->second.driver_held) {
          *handle = retained_handle(s, id, mapped);
          return CUDA_SUCCESS;
        }
      }
    }
    if (id == 0) return real(handle, addr);  // not tracked; never a driver call under s.mu
    CUmemGenericAllocationHandle d = 0;
    CUresult r = real(&d, addr);
    if (r != CUDA_SUCCESS) return r;
    // A second driver reference (another thread retained it first, or the
    // allocation went meanwhile) is released after the lock: never a driver
    // call under s.mu (track.h).
    std::vector<CUmemGenericAllocationHandle> extra;
    CUresult out = CUDA_SUCCESS;
    {
      Lock l(s.mu);
      auto it = s.allocs.find(id);
      if (it == s.allocs.end()) {
        extra.push_back(d);
        out = CUDA_ERROR_INVALID_VALUE;
      } else {
        if (it->second.driver_held) {
          extra.push_back(d);
        } else {
          it->second.driver = d;
          it->second.driver_held = true;
        }
        *handle = retained_handle(s, id, mapped);
      }
    }
    finish(extra);
    return out;
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
    m.handle = id ? handle : 0;
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
  const NoCancel no_cancel;  // closes the export cache's descriptor (track_internal.h)
  if (!active()) return real(ptr, size);
  State& s = state();
  try {
    std::vector<uint64_t> hit;
    {
      Lock l(s.mu);
      if (overlapping(s, ptr, size, &hit) || any_block(s, hit)) return CUDA_ERROR_INVALID_VALUE;
    }
    CUresult r = real(ptr, size);
    if (r != CUDA_SUCCESS || hit.empty()) return r;
    std::vector<CUmemGenericAllocationHandle> rel;
    std::vector<ListedFd> fds;
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
    finish(rel, &fds);
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
      if (overlapping(s, ptr, size, &hit) || any_block(s, hit)) return CUDA_ERROR_INVALID_VALUE;
    }
    CUresult r = real(ptr, size, desc, count);
    if (r != CUDA_SUCCESS || hit.empty()) return r;
    Lock l(s.mu);
    for (uint64_t a : hit) {
      auto it = s.ranges.find(a);
      if (it == s.ranges.end()) continue;
      for (size_t i = 0; i < count; ++i) union_access(&it->second.access, desc[i]);
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
    auto al = s.allocs.find(it->second);
    if (al == s.allocs.end()) return CUDA_ERROR_INVALID_HANDLE;
    d = al->second.driver;
  }
  return real(prop, d);
}

}  // namespace cusnap::shim::track
