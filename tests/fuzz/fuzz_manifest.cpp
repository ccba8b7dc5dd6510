// libFuzzer harness for the checkpoint manifest parser and validator
// (src/coord/manifest.*): any text is either rejected with an error message
// or yields a manifest that writes back to JSON which parses again to the
// same manifest.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "coord/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cusnap;
  const std::string text(reinterpret_cast<const char*>(data), size);
  Manifest m;
  std::string err;
  if (!manifest_from_json(text, &m, &err)) {
    if (err.empty()) {
      std::fprintf(stderr, "a rejected manifest has no error message\n");
      std::abort();
    }
    return 0;
  }
  const std::string again = manifest_to_json(m);
  Manifest m2;
  if (!manifest_from_json(again, &m2, &err)) {
    std::fprintf(stderr, "an accepted manifest does not parse once written back: %s\n%s\n",
                 err.c_str(), again.c_str());
    std::abort();
  }
  if (manifest_to_json(m2) != again) {
    std::fprintf(stderr, "a manifest changes through a second round trip\n");
    std::abort();
  }
  return 0;
}
