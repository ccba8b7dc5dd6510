// String comparison for the paths that run inside the sanitizer runtime's
// start-up (dlsym, the entry table, ELF lookup): the C library's strcmp is
// intercepted by ASan, and its interceptors are not usable until ASan has
// resolved them — through our dlsym.
#pragma once

namespace cusnap::shim {

/// strcmp's ordering, without calling the C library.
constexpr int cstr_cmp(const char* a, const char* b) noexcept {
  for (;; ++a, ++b) {
    const auto ca = static_cast<unsigned char>(*a), cb = static_cast<unsigned char>(*b);
    if (ca != cb) return ca < cb ? -1 : 1;
    if (ca == 0) return 0;
  }
}
constexpr bool cstr_eq(const char* a, const char* b) noexcept {
  return cstr_cmp(a, b) == 0;
}
constexpr bool cstr_less(const char* a, const char* b) noexcept {
  return cstr_cmp(a, b) < 0;
}

}  // namespace cusnap::shim
