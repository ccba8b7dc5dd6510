// The entry list and the cuGetProcAddress table as the shim sees them.
#include <doctest/doctest.h>

#include <cstring>
#include <string>

#include "shim/entries.h"

using namespace cusnap::shim;

namespace {
std::string resolve(const char* name, int version, bool per_thread = false) {
  ProcAnswer a;
  auto r = lookup_proc(name, version, per_thread, &a);
  if (r == ProcLookup::kNotFound) return "<not found>";
  if (r == ProcLookup::kVersionTooLow) return "<version too low>";
  return entry_name(a.index);
}
}  // namespace

TEST_SUITE("shim.entries") {
  TEST_CASE("every entry point is found by its exported name") {
    CHECK(kEntryCount > 600);
    for (size_t i = 0; i < kEntryCount; ++i) {
      size_t j = kEntryCount;
      REQUIRE(find_entry(entry_name(i), &j));
      CHECK(j == i);
    }
    size_t j;
    CHECK_FALSE(find_entry("cuNoSuchEntryPoint", &j));
    CHECK_FALSE(find_entry("malloc", &j));
    CHECK_FALSE(find_entry(nullptr, &j));
  }

  TEST_CASE("versions pick the newest symbol not newer than the caller") {
    CHECK(resolve("cuMemAlloc", 3020) == "cuMemAlloc_v2");
    CHECK(resolve("cuMemAlloc", 13000) == "cuMemAlloc_v2");
    CHECK(resolve("cuMemAlloc", 3010) == "cuMemAlloc");
    CHECK(resolve("cuMemAlloc", 1000) == "<version too low>");
    CHECK(resolve("cuNoSuchEntryPoint", 13000) == "<not found>");
    CHECK(resolve("cuGetProcAddress", 12000) == "cuGetProcAddress_v2");
    CHECK(resolve("cuGetProcAddress", 11030) == "cuGetProcAddress");
  }

  TEST_CASE("per-thread default stream rows") {
    CHECK(resolve("cuMemcpyAsync", 13000, false) == "cuMemcpyAsync");
    CHECK(resolve("cuMemcpyAsync", 13000, true) == "cuMemcpyAsync_ptsz");
    CHECK(resolve("cuMemcpy", 13000, true) == "cuMemcpy_ptds");
    CHECK(resolve("cuMemAlloc", 13000, true) == "cuMemAlloc_v2");  // no per-thread form
  }

  TEST_CASE("multicast bind: device-explicit ABI from 13.1") {
    CHECK(resolve("cuMulticastBindMem", 13000) == "cuMulticastBindMem");
    CHECK(resolve("cuMulticastBindMem", 13010) == "cuMulticastBindMem_v2");
    CHECK(resolve("cuMulticastBindAddr", 12090) == "cuMulticastBindAddr");
    CHECK(resolve("cuMulticastBindAddr", 13020) == "cuMulticastBindAddr_v2");
    ProcAnswer a;
    REQUIRE(lookup_proc("cuMulticastBindMem", 13010, false, &a) == ProcLookup::kFound);
    CHECK(a.authoritative >= 13010);
    REQUIRE(lookup_proc("cuMemAlloc", 13000, false, &a) == ProcLookup::kFound);
    CHECK(a.authoritative == CUDA_VERSION);
  }

  TEST_CASE("every resolver row answers at its own version") {
    for (size_t r = 0; r < proc_row_count(); ++r) {
      ProcRow row = proc_row(r);
      ProcAnswer a;
      REQUIRE(lookup_proc(row.name, row.version, row.flavour != 0, &a) == ProcLookup::kFound);
      // Rows of one name and version may name the same symbol twice; the
      // answer must be a symbol of that name.
      CHECK(std::strncmp(entry_name(a.index), row.name, std::strlen(row.name)) == 0);
    }
  }
}
