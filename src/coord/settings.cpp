#include "coord/settings.h"

#include <cstdlib>

namespace cusnap {

const char* setting(const proto::Settings& settings, const char* name) {
  const auto it = settings.find(name);
  return it != settings.end() ? it->second.c_str() : std::getenv(name);
}

}  // namespace cusnap
