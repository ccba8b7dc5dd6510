// Stands in for src/coord/sha256.cpp in fuzz_manifest, which parses manifests
// and never hashes (and sha256.cpp's CPU-feature check does not build with
// clang 14). Any call is a harness bug.
#include <cstdlib>

#include "coord/sha256.h"

namespace cusnap {

Sha256::Sha256() {
  std::abort();
}
void Sha256::update(const void*, size_t) {
  std::abort();
}
std::string Sha256::hex_digest() {
  std::abort();
}

}  // namespace cusnap
