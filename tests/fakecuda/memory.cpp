// Device memory primitives (see memory.h).
#include "memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace fc {

namespace {

constexpr int kAnonFlags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;

Reservation* find_reservation(uintptr_t p, uintptr_t* base) {
  auto& rs = driver().reservations;
  auto it = rs.upper_bound(p);
  if (it == rs.begin()) return nullptr;
  --it;
  if (p >= it->first + it->second.size) return nullptr;
  if (base) *base = it->first;
  return &it->second;
}

}  // namespace

int make_memfd(pid_t creator, uint64_t id, size_t size, int machine_dev) {
  char name[64];
  snprintf(name, sizeof name, "fakecuda:%d:%llu:dev%d", static_cast<int>(creator),
           static_cast<unsigned long long>(id), machine_dev);
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

Allocation* find_alloc(uint64_t id) {
  auto it = driver().allocs.find(id);
  return it == driver().allocs.end() ? nullptr : &it->second;
}

CUresult new_allocation(AllocKind kind, size_t size, CUdevice dev, uint64_t* id) {
  Driver& d = driver();
  Device& device = d.devices[dev];
  bool charged = kind == AllocKind::kVmm || kind == AllocKind::kLegacy;
  if (charged && size > device.total_mem - device.used) return CUDA_ERROR_OUT_OF_MEMORY;
  uint64_t nid = d.next_alloc_id++;
  int fd = make_memfd(getpid(), nid, size, device.ledger_index);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  struct stat st {};
  fstat(fd, &st);
  Allocation& a = d.allocs[nid];
  a.id = nid;
  a.kind = kind;
  a.fd = fd;
  a.size = size;
  a.dev = dev;
  a.creator = getpid();
  a.creator_id = nid;
  a.st_dev = st.st_dev;
  a.st_ino = st.st_ino;
  a.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  a.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.prop.location.id = dev;
  if (charged) device.used += size;
  *id = nid;
  return CUDA_SUCCESS;
}

CUresult adopt_allocation(int fd, AllocKind kind, uint64_t* id, bool* reused) {
  char path[64], target[256];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, target, sizeof target - 1);
  if (n <= 0) return CUDA_ERROR_INVALID_VALUE;
  target[n] = '\0';
  int creator = 0, dev = 0;
  unsigned long long cid = 0;
  const int fields = sscanf(target, "/memfd:fakecuda:%d:%llu:dev%d", &creator, &cid, &dev);
  if (fields < 2) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = driver();
  // The name carries the machine's index of the device; this process's
  // ordinal of it differs once a restore remapped its devices.
  // A device this process does not see (CUDA_VISIBLE_DEVICES) is refused
  // (not measured: it takes two GPUs).
  if (fields == 3) {
    int ordinal = -1;
    for (size_t i = 0; i < d.devices.size() && ordinal < 0; ++i)
      if (d.devices[i].ledger_index == dev) ordinal = static_cast<int>(i);
    if (ordinal < 0) return CUDA_ERROR_INVALID_DEVICE;
    dev = ordinal;
  }
  if (!valid_device(fields == 3 ? dev : 0)) return CUDA_ERROR_INVALID_VALUE;
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size <= 0) return CUDA_ERROR_INVALID_VALUE;
  for (auto& [aid, a] : d.allocs) {
    if (a.fd >= 0 && a.st_dev == st.st_dev && a.st_ino == st.st_ino) {
      *id = aid;
      *reused = true;
      return CUDA_SUCCESS;
    }
  }
  int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  uint64_t nid = d.next_alloc_id++;
  Allocation& a = d.allocs[nid];
  a.id = nid;
  a.kind = kind;
  a.fd = own;
  a.size = static_cast<size_t>(st.st_size);
  a.creator = creator;
  a.creator_id = cid;
  a.imported = creator != getpid();
  a.st_dev = st.st_dev;
  a.st_ino = st.st_ino;
  a.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  a.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.dev = fields == 3 ? dev : 0;  // the creator's device
  a.prop.location.id = a.dev;
  a.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  *id = nid;
  *reused = false;
  return CUDA_SUCCESS;
}

void maybe_destroy(uint64_t id) {
  Driver& d = driver();
  auto it = d.allocs.find(id);
  if (it == d.allocs.end()) return;
  Allocation& a = it->second;
  if (a.handle_refs > 0 || a.map_refs > 0) return;
  if (a.fd >= 0) close(a.fd);
  if (a.saved) munmap(a.saved, a.size);
  if (!a.imported && (a.kind == AllocKind::kVmm || a.kind == AllocKind::kLegacy) &&
      static_cast<size_t>(a.dev) < d.devices.size())
    d.devices[a.dev].used -= a.size;
  d.allocs.erase(it);
}

CUresult reserve_va(size_t size, size_t align, uintptr_t hint, bool low32, bool internal,
                    uintptr_t* out) {
  if (size == 0 || size % kGranularity) return CUDA_ERROR_INVALID_VALUE;
  if (align < kGranularity) align = kGranularity;
  if (align & (align - 1)) return CUDA_ERROR_INVALID_VALUE;
  void* p = MAP_FAILED;
  if (hint && hint % align == 0) {
    p = mmap(reinterpret_cast<void*>(hint), size, PROT_NONE, kAnonFlags | MAP_FIXED_NOREPLACE, -1,
             0);
    if (p != MAP_FAILED && reinterpret_cast<uintptr_t>(p) != hint) {
      munmap(p, size);  // old kernels treat the flag as a hint
      p = MAP_FAILED;
    }
  }
  if (p == MAP_FAILED) {
    size_t span = size + align;
    void* raw = mmap(nullptr, span, PROT_NONE, kAnonFlags | (low32 ? MAP_32BIT : 0), -1, 0);
    if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t r = reinterpret_cast<uintptr_t>(raw);
    uintptr_t a = round_up(r, align);
    if (a > r) munmap(raw, a - r);
    if (r + span > a + size) munmap(reinterpret_cast<void*>(a + size), r + span - (a + size));
    p = reinterpret_cast<void*>(a);
  }
  uintptr_t va = reinterpret_cast<uintptr_t>(p);
  driver().reservations[va] = Reservation{size, internal};
  *out = va;
  return CUDA_SUCCESS;
}

CUresult free_va(uintptr_t va, size_t size) {
  Driver& d = driver();
  auto it = d.reservations.find(va);
  if (it == d.reservations.end() || it->second.size != size) return CUDA_ERROR_INVALID_VALUE;
  auto m = d.mappings.lower_bound(va);
  if (m != d.mappings.end() && m->first < va + size) return CUDA_ERROR_INVALID_VALUE;
  munmap(reinterpret_cast<void*>(va), size);
  d.reservations.erase(it);
  return CUDA_SUCCESS;
}

CUresult map_range(uintptr_t va, size_t size, size_t offset, uint64_t id) {
  Driver& d = driver();
  if (size == 0 || va % kGranularity || size % kGranularity || offset % kGranularity)
    return CUDA_ERROR_INVALID_VALUE;
  Allocation* a = find_alloc(id);
  if (!a) return CUDA_ERROR_INVALID_HANDLE;
  if (offset > a->size || size > a->size - offset) return CUDA_ERROR_INVALID_VALUE;
  uintptr_t rbase = 0;
  Reservation* r = find_reservation(va, &rbase);
  if (!r || va + size > rbase + r->size) return CUDA_ERROR_INVALID_VALUE;
  auto next = d.mappings.lower_bound(va);
  if (next != d.mappings.end() && next->first < va + size) return CUDA_ERROR_INVALID_VALUE;
  if (next != d.mappings.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > va) return CUDA_ERROR_INVALID_VALUE;
  }
  if (a->fd < 0) return CUDA_ERROR_INVALID_HANDLE;
  void* p = mmap(reinterpret_cast<void*>(va), size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd,
                 static_cast<off_t>(offset));
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  // As on the real driver, a forked child does not inherit device memory.
  madvise(p, size, MADV_DONTFORK);
  Mapping m;
  m.size = size;
  m.alloc = id;
  m.offset = offset;
  d.mappings[va] = m;
  ++a->map_refs;
  return CUDA_SUCCESS;
}

CUresult unmap_range(uintptr_t va, size_t size) {
  Driver& d = driver();
  if (size == 0 || va % kGranularity || size % kGranularity) return CUDA_ERROR_INVALID_VALUE;
  // Whole mappings, contiguous, exactly covering the range.
  uintptr_t p = va;
  auto it = d.mappings.find(va);
  while (p < va + size) {
    if (it == d.mappings.end() || it->first != p) return CUDA_ERROR_INVALID_VALUE;
    p += it->second.size;
    ++it;
  }
  if (p != va + size) return CUDA_ERROR_INVALID_VALUE;
  it = d.mappings.find(va);
  while (it != d.mappings.end() && it->first < va + size) {
    mmap(reinterpret_cast<void*>(it->first), it->second.size, PROT_NONE, kAnonFlags | MAP_FIXED, -1,
         0);
    uint64_t id = it->second.alloc;
    it = d.mappings.erase(it);
    if (Allocation* a = find_alloc(id)) {
      --a->map_refs;
      maybe_destroy(id);
    }
  }
  return CUDA_SUCCESS;
}

void apply_access(uintptr_t va, Mapping& m) {
  int prot = PROT_NONE;
  for (int i = 0; i < kMaxDevices; ++i) {
    if (m.access[i] == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      prot = PROT_READ | PROT_WRITE;
    else if (m.access[i] == CU_MEM_ACCESS_FLAGS_PROT_READ && prot == PROT_NONE)
      prot = PROT_READ;
  }
  m.prot = prot;
  Allocation* a = find_alloc(m.alloc);
  if (a && a->fd >= 0) mprotect(reinterpret_cast<void*>(va), m.size, prot);
}

Mapping* find_mapping(uintptr_t p, uintptr_t* base) {
  auto& ms = driver().mappings;
  auto it = ms.upper_bound(p);
  if (it == ms.begin()) return nullptr;
  --it;
  if (p >= it->first + it->second.size) return nullptr;
  if (base) *base = it->first;
  return &it->second;
}

Mapping* find_known(uintptr_t p, uintptr_t* base, size_t* size) {
  uintptr_t b = 0;
  Mapping* m = find_mapping(p, &b);
  if (!m) return nullptr;
  size_t n = m->size;
  const Allocation* a = find_alloc(m->alloc);
  if (driver_block(a) && a->requested) n = a->requested;
  if (p - b >= n) return nullptr;
  if (base) *base = b;
  if (size) *size = n;
  return m;
}

bool is_device_address(uintptr_t p) {
  return find_reservation(p, nullptr) != nullptr;
}

CUresult check_range(uintptr_t p, size_t n, bool write) {
  if (p == 0) return CUDA_ERROR_INVALID_VALUE;
  if (p + n < p) return CUDA_ERROR_INVALID_VALUE;
  auto& hs = driver().host_allocs;
  auto h = hs.upper_bound(p);
  if (h != hs.begin()) {
    --h;
    if (p >= h->first && p + n <= h->first + h->second.size) return CUDA_SUCCESS;
  }
  while (n > 0) {
    uintptr_t base = 0;
    size_t size = 0;
    Mapping* m = find_known(p, &base, &size);  // not past a cuMemAlloc block's bytes
    if (!m) return CUDA_ERROR_INVALID_VALUE;
    if (!(m->prot & PROT_READ) || (write && !(m->prot & PROT_WRITE)))
      return CUDA_ERROR_INVALID_VALUE;
    size_t avail = base + size - p;
    size_t take = n < avail ? n : avail;
    p += take;
    n -= take;
  }
  return CUDA_SUCCESS;
}

void free_context_blocks(const void* owner) {
  std::vector<std::pair<uintptr_t, size_t>> gone;
  for (auto& [va, m] : driver().mappings) {
    const Allocation* a = find_alloc(m.alloc);
    if (a && a->kind == AllocKind::kLegacy && a->owner == owner) gone.emplace_back(va, m.size);
  }
  auto& opens = driver().ipc_opens;
  for (auto it = opens.begin(); it != opens.end();) {
    if (it->second.owner != owner) {
      ++it;
      continue;
    }
    if (Mapping* m = find_mapping(it->first, nullptr)) gone.emplace_back(it->first, m->size);
    it = opens.erase(it);
  }
  for (auto [va, size] : gone) {
    unmap_range(va, size);
    free_va(va, size);
  }
}

}  // namespace fc
