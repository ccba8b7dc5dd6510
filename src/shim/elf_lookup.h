// Symbol lookup in the dynamic symbol tables of loaded objects, without the
// dynamic linker's dlsym: the shim exports dlsym and dlvsym itself, so it finds
// the C library's own through this, and emulates RTLD_NEXT for the driver's
// names. Allocates nothing and takes no lock of its own (dl_iterate_phdr holds
// the loader's lock while it walks), so it is safe during the sanitizer
// runtime's start-up, before any constructor of the shim has run.
#pragma once

namespace cusnap::shim {

/// First definition of `name` in the objects loaded after the object that
/// contains `after` (load order, the order the global scope searches), skipping
/// the shim itself. With version == nullptr only the default version matches;
/// otherwise the definition must carry that version name. nullptr when none.
void* elf_find_next(const void* after, const char* name, const char* version) noexcept;

/// True when `addr` lies in the object that also contains `anchor`.
bool elf_same_object(const void* addr, const void* anchor) noexcept;

}  // namespace cusnap::shim
