// Per-entry behaviour of the wrappers. Hook<E>::bind(real) returns what the
// wrapper calls with the application's arguments: by default the real driver
// function itself (plain forwarding). An entry that needs more specializes
// Hook; the resolver does so for the cuGetProcAddress family.
#pragma once

#include "shim/entries.h"

namespace cusnap::shim {

template <Entry E>
struct Hook {
  template <class Fn>
  static Fn bind(Fn real) noexcept {
    return real;
  }
};

using GetProcAddressV1 = CUresult(CUDAAPI*)(const char*, void**, int, cuuint64_t);
using GetProcAddressV2 = CUresult(CUDAAPI*)(const char*, void**, int, cuuint64_t,
                                            CUdriverProcAddressQueryResult*);

/// cuGetProcAddress (v1, v2 and v2_ptsz) through the real one; returns the
/// shim's wrapper for what the driver resolves, or fails closed.
CUresult get_proc_address(GetProcAddressV2 real_v2, GetProcAddressV1 real_v1, bool ptsz,
                          const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                          CUdriverProcAddressQueryResult* status) noexcept;

template <>
struct Hook<Entry::cuGetProcAddress> {
  static auto bind(GetProcAddressV1 real) noexcept {
    return [real](const char* s, void** pfn, int v, cuuint64_t f) noexcept {
      return get_proc_address(nullptr, real, false, s, pfn, v, f, nullptr);
    };
  }
};

template <>
struct Hook<Entry::cuGetProcAddress_v2> {
  static auto bind(GetProcAddressV2 real) noexcept {
    return [real](const char* s, void** pfn, int v, cuuint64_t f,
                  CUdriverProcAddressQueryResult* st) noexcept {
      return get_proc_address(real, nullptr, false, s, pfn, v, f, st);
    };
  }
};

template <>
struct Hook<Entry::cuGetProcAddress_v2_ptsz> {
  static auto bind(GetProcAddressV2 real) noexcept {
    return [real](const char* s, void** pfn, int v, cuuint64_t f,
                  CUdriverProcAddressQueryResult* st) noexcept {
      return get_proc_address(real, nullptr, true, s, pfn, v, f, st);
    };
  }
};

}  // namespace cusnap::shim
