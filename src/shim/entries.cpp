#include "shim/entries.h"

#include <algorithm>
#include <iterator>

#include "shim/cstr.h"

namespace cusnap::shim {

namespace {

constexpr const char* kNames[] = {
#define CUSNAP_CU_ENTRY(name, params, args) #name,
#define CUSNAP_CU_PROC(...)
#include "cudaapi/entry_points.inc"
#include "shim/extra_entries.inc"
#undef CUSNAP_CU_ENTRY
#undef CUSNAP_CU_PROC
};
static_assert(std::size(kNames) == kEntryCount);

enum : int { CUSNAP_PROC_DEFAULT = 0, CUSNAP_PROC_PTDS = 1, CUSNAP_PROC_PTSZ = 2 };

struct Row {
  const char* name;
  int version;
  int flavour;
  Entry entry;
};

constexpr Row kRows[] = {
#define CUSNAP_CU_ENTRY(...)
#define CUSNAP_CU_PROC(name, version, flavour, symbol) {name, version, flavour, Entry::symbol},
#include "cudaapi/proc_table.inc"
};
constexpr Row kExtraRows[] = {
    {"", 0, 0, Entry::kEnd_},  // keeps the array non-empty once the extras are gone
#include "shim/extra_entries.inc"
#undef CUSNAP_CU_ENTRY
#undef CUSNAP_CU_PROC
};

constexpr bool less(const char* a, const char* b) {
  return cstr_less(a, b);
}

// Binary search below relies on the generator's order; checked at compile time.
static_assert(std::is_sorted(std::begin(kNames), std::begin(kNames) + kGeneratedCount, less),
              "entry_points.inc must be sorted by name");
static_assert(std::is_sorted(std::begin(kRows), std::end(kRows),
                             [](const Row& a, const Row& b) { return less(a.name, b.name); }),
              "proc_table.inc must be grouped and sorted by name");

}  // namespace

const char* entry_name(size_t i) noexcept {
  return i < kEntryCount ? kNames[i] : nullptr;
}

bool find_entry(const char* name, size_t* index) noexcept {
  if (!name || name[0] != 'c' || name[1] != 'u') return false;
  auto end = std::begin(kNames) + kGeneratedCount;
  auto it = std::lower_bound(std::begin(kNames), end, name, less);
  if (it != end && cstr_eq(*it, name)) {
    *index = static_cast<size_t>(it - std::begin(kNames));
    return true;
  }
  for (size_t i = kGeneratedCount; i < kEntryCount; ++i)
    if (cstr_eq(kNames[i], name)) {
      *index = i;
      return true;
    }
  return false;
}

ProcLookup lookup_proc(const char* name, int cuda_version, bool per_thread,
                       ProcAnswer* out) noexcept {
  if (!name) return ProcLookup::kNotFound;
  const Row* best_default = nullptr;
  const Row* best_pt = nullptr;
  bool known = false;
  int authoritative = CUDA_VERSION;
  auto consider = [&](const Row& r) {
    known = true;
    if (r.version > cuda_version) return;
    const Row*& best = r.flavour == CUSNAP_PROC_DEFAULT ? best_default : best_pt;
    if (!best || r.version >= best->version) best = &r;
  };
  auto first = std::lower_bound(std::begin(kRows), std::end(kRows), name,
                                [](const Row& r, const char* n) { return less(r.name, n); });
  for (auto it = first; it != std::end(kRows) && cstr_eq(it->name, name); ++it) consider(*it);
  for (const Row& r : kExtraRows)
    if (r.entry != Entry::kEnd_ && cstr_eq(r.name, name)) {
      consider(r);
      authoritative = std::max(authoritative, r.version);
    }
  if (!known) return ProcLookup::kNotFound;
  const Row* pick = (per_thread && best_pt) ? best_pt : best_default;
  if (!pick) pick = best_pt;
  if (!pick) return ProcLookup::kVersionTooLow;
  out->index = index_of(pick->entry);
  out->authoritative = authoritative;
  return ProcLookup::kFound;
}

size_t proc_row_count() noexcept {
  return std::size(kRows) + std::size(kExtraRows) - 1;
}

ProcRow proc_row(size_t i) noexcept {
  const Row& r = i < std::size(kRows) ? kRows[i] : kExtraRows[i - std::size(kRows) + 1];
  return {r.name, r.version, r.flavour, index_of(r.entry)};
}

}  // namespace cusnap::shim
