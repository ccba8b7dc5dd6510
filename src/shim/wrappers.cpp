// One exported wrapper per driver entry point, generated from the entry list.
//
// Each wrapper is a hidden function cusnap_w_<name>, exported under the driver's
// name through an alias. The alias redeclares the name cuda.h declares, so a
// parameter list that disagrees with cuda.h does not compile, and a
// static_assert ties the wrapper's type to cuda.h's declaration through decltype.
// A wrapper enters the gate, finds the real function (loading the driver on
// first use), fails closed with CUDA_ERROR_NOT_SUPPORTED when there is none, and
// otherwise calls it through its Hook.
#include <type_traits>

#include "shim/entries.h"
#include "shim/gate.h"
#include "shim/hooks.h"
#include "shim/track_hooks.h"
#include "shim/real_driver.h"

#define CUSNAP_CU_PROC(...)
#define CUSNAP_CU_ENTRY(name, params, args)                                                  \
  extern "C" __attribute__((visibility("hidden"))) CUresult CUDAAPI cusnap_w_##name params { \
    using Fn = decltype(&::name);                                                            \
    constexpr size_t kIndex = ::cusnap::shim::index_of(::cusnap::shim::Entry::name);         \
    ::cusnap::shim::GateGuard guard(kIndex + 1);                                             \
    auto real = reinterpret_cast<Fn>(::cusnap::shim::real_entry(kIndex));                    \
    if (__builtin_expect(real == nullptr, 0)) return ::cusnap::shim::fail_closed(kIndex);    \
    return ::cusnap::shim::Hook<::cusnap::shim::Entry::name>::bind(real) args;               \
  }                                                                                          \
  static_assert(std::is_same_v<decltype(&::name), decltype(&cusnap_w_##name)>,               \
                "wrapper of " #name " differs from cuda.h");                                 \
  extern "C" __attribute__((visibility("default"), alias("cusnap_w_" #name)))                \
  CUresult CUDAAPI name params;
#include "cudaapi/entry_points.inc"
#include "shim/extra_entries.inc"
#undef CUSNAP_CU_ENTRY

namespace cusnap::shim {

namespace {
void* const kWrappers[] = {
#define CUSNAP_CU_ENTRY(name, params, args) reinterpret_cast<void*>(&cusnap_w_##name),
#include "cudaapi/entry_points.inc"
#include "shim/extra_entries.inc"
#undef CUSNAP_CU_ENTRY
};
static_assert(std::size(kWrappers) == kEntryCount);
}  // namespace

void* wrapper_of(size_t i) noexcept {
  return i < kEntryCount ? kWrappers[i] : nullptr;
}

}  // namespace cusnap::shim
#undef CUSNAP_CU_PROC
