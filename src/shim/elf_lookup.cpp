#include "shim/elf_lookup.h"

#include <elf.h>
#include <link.h>

#include <cstdint>

#include "shim/cstr.h"

namespace cusnap::shim {

namespace {

#if __ELF_NATIVE_CLASS == 64
using Sym = Elf64_Sym;
constexpr unsigned kBloomBits = 64;
#define CUSNAP_ST_TYPE ELF64_ST_TYPE
#define CUSNAP_ST_BIND ELF64_ST_BIND
#define CUSNAP_ST_VIS ELF64_ST_VISIBILITY
#else
using Sym = Elf32_Sym;
constexpr unsigned kBloomBits = 32;
#define CUSNAP_ST_TYPE ELF32_ST_TYPE
#define CUSNAP_ST_BIND ELF32_ST_BIND
#define CUSNAP_ST_VIS ELF32_ST_VISIBILITY
#endif

char shim_anchor;  // an address inside the shim

bool contains(const dl_phdr_info* info, uintptr_t addr) {
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    if (addr >= lo && addr < lo + ph.p_memsz) return true;
  }
  return false;
}

uint32_t gnu_hash(const char* s) {
  uint32_t h = 5381;
  for (; *s; ++s) h = h * 33 + static_cast<unsigned char>(*s);
  return h;
}

uint32_t sysv_hash(const char* s) {
  uint32_t h = 0;
  for (; *s; ++s) {
    h = (h << 4) + static_cast<unsigned char>(*s);
    uint32_t g = h & 0xf0000000u;
    if (g) h ^= g >> 24;
    h &= ~g;
  }
  return h;
}

struct Tables {
  uintptr_t base = 0;
  const Sym* symtab = nullptr;
  const char* strtab = nullptr;
  const uint32_t* gnu = nullptr;
  const uint32_t* sysv = nullptr;
  const ElfW(Half) * versym = nullptr;
  const char* verdef = nullptr;
};

// Dynamic entries of loaded objects are relocated in place by the loader for
// most objects, not for the vDSO nor for DT_VERDEF: an address below the load
// base is still an offset.
template <class T>
const T* dyn_ptr(uintptr_t base, ElfW(Addr) v) {
  return reinterpret_cast<const T*>(v < base ? base + v : v);
}

bool load_tables(const dl_phdr_info* info, Tables& t) {
  t.base = info->dlpi_addr;
  const ElfW(Dyn)* dyn = nullptr;
  for (int i = 0; i < info->dlpi_phnum; ++i)
    if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
      dyn = reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
  if (!dyn) return false;
  for (; dyn->d_tag != DT_NULL; ++dyn) {
    switch (dyn->d_tag) {
      case DT_SYMTAB:
        t.symtab = dyn_ptr<Sym>(t.base, dyn->d_un.d_ptr);
        break;
      case DT_STRTAB:
        t.strtab = dyn_ptr<char>(t.base, dyn->d_un.d_ptr);
        break;
      case DT_GNU_HASH:
        t.gnu = dyn_ptr<uint32_t>(t.base, dyn->d_un.d_ptr);
        break;
      case DT_HASH:
        t.sysv = dyn_ptr<uint32_t>(t.base, dyn->d_un.d_ptr);
        break;
      case DT_VERSYM:
        t.versym = dyn_ptr<ElfW(Half)>(t.base, dyn->d_un.d_ptr);
        break;
      case DT_VERDEF:
        t.verdef = dyn_ptr<char>(t.base, dyn->d_un.d_ptr);
        break;
      default:
        break;
    }
  }
  return t.symtab && t.strtab && (t.gnu || t.sysv);
}

const char* version_name(const Tables& t, unsigned ndx) {
  if (!t.verdef) return nullptr;
  const char* p = t.verdef;
  for (;;) {
    auto* vd = reinterpret_cast<const ElfW(Verdef)*>(p);
    if ((vd->vd_ndx & 0x7fff) == ndx && vd->vd_cnt > 0) {
      auto* aux = reinterpret_cast<const ElfW(Verdaux)*>(p + vd->vd_aux);
      return t.strtab + aux->vda_name;
    }
    if (vd->vd_next == 0) return nullptr;
    p += vd->vd_next;
  }
}

bool matches(const Tables& t, uint32_t ix, const char* name, const char* version) {
  const Sym& s = t.symtab[ix];
  if (s.st_shndx == SHN_UNDEF || s.st_value == 0) return false;
  const unsigned type = CUSNAP_ST_TYPE(s.st_info);
  if (type != STT_FUNC && type != STT_OBJECT && type != STT_NOTYPE && type != STT_GNU_IFUNC)
    return false;
  const unsigned bind = CUSNAP_ST_BIND(s.st_info);
  if (bind != STB_GLOBAL && bind != STB_WEAK && bind != STB_GNU_UNIQUE) return false;
  if (CUSNAP_ST_VIS(s.st_other) == STV_HIDDEN || CUSNAP_ST_VIS(s.st_other) == STV_INTERNAL)
    return false;
  if (!cstr_eq(t.strtab + s.st_name, name)) return false;
  if (!t.versym) return true;
  const ElfW(Half) vs = t.versym[ix];
  if (!version) return (vs & 0x8000) == 0;  // the default version only
  const char* vn = version_name(t, vs & 0x7fff);
  return vn && cstr_eq(vn, version);
}

void* resolve(const Tables& t, uint32_t ix) {
  const Sym& s = t.symtab[ix];
  void* addr = reinterpret_cast<void*>(t.base + s.st_value);
  if (CUSNAP_ST_TYPE(s.st_info) == STT_GNU_IFUNC) addr = reinterpret_cast<void* (*)()>(addr)();
  return addr;
}

void* lookup(const Tables& t, const char* name, const char* version) {
  if (t.gnu) {
    const uint32_t nbuckets = t.gnu[0], symoffset = t.gnu[1], bloom_size = t.gnu[2],
                   shift = t.gnu[3];
    if (nbuckets == 0 || bloom_size == 0) return nullptr;
    auto* bloom = reinterpret_cast<const ElfW(Addr)*>(t.gnu + 4);
    auto* buckets = reinterpret_cast<const uint32_t*>(bloom + bloom_size);
    const uint32_t* chain = buckets + nbuckets;
    const uint32_t h = gnu_hash(name);
    const ElfW(Addr) word = bloom[(h / kBloomBits) % bloom_size];
    const ElfW(Addr) mask =
        (ElfW(Addr)(1) << (h % kBloomBits)) | (ElfW(Addr)(1) << ((h >> shift) % kBloomBits));
    if ((word & mask) != mask) return nullptr;
    uint32_t ix = buckets[h % nbuckets];
    if (ix < symoffset) return nullptr;
    for (;; ++ix) {
      const uint32_t ch = chain[ix - symoffset];
      if ((ch | 1) == (h | 1) && matches(t, ix, name, version)) return resolve(t, ix);
      if (ch & 1) return nullptr;
    }
  }
  const uint32_t nbucket = t.sysv[0];
  const uint32_t* bucket = t.sysv + 2;
  const uint32_t* chain = bucket + nbucket;
  for (uint32_t ix = bucket[sysv_hash(name) % nbucket]; ix != STN_UNDEF; ix = chain[ix])
    if (matches(t, ix, name, version)) return resolve(t, ix);
  return nullptr;
}

struct Search {
  uintptr_t after;
  const char* name;
  const char* version;
  bool started;
  void* found;
};

int search_cb(dl_phdr_info* info, size_t, void* data) {
  auto* s = static_cast<Search*>(data);
  if (!s->started) {
    if (contains(info, s->after)) s->started = true;
    return 0;
  }
  if (contains(info, reinterpret_cast<uintptr_t>(&shim_anchor))) return 0;
  Tables t;
  if (!load_tables(info, t)) return 0;
  s->found = lookup(t, s->name, s->version);
  return s->found ? 1 : 0;
}

struct Same {
  uintptr_t a, b;
  int result;
};

int same_cb(dl_phdr_info* info, size_t, void* data) {
  auto* s = static_cast<Same*>(data);
  const bool ha = contains(info, s->a), hb = contains(info, s->b);
  if (ha || hb) {
    s->result = ha && hb;
    return 1;
  }
  return 0;
}

}  // namespace

void* elf_find_next(const void* after, const char* name, const char* version) noexcept {
  Search s{reinterpret_cast<uintptr_t>(after), name, version, after == nullptr, nullptr};
  dl_iterate_phdr(search_cb, &s);
  return s.found;
}

bool elf_same_object(const void* addr, const void* anchor) noexcept {
  Same s{reinterpret_cast<uintptr_t>(addr), reinterpret_cast<uintptr_t>(anchor), 0};
  dl_iterate_phdr(same_cb, &s);
  return s.result == 1;
}

}  // namespace cusnap::shim
