#include "coord/settings.h"

#include <doctest/doctest.h>
#include <stdlib.h>

#include <string>

using namespace cusnap;

TEST_CASE("settings: a setting the client sent counts before the environment") {
  setenv("CUSNAP_CRIU_GHOST_LIMIT", "4G", 1);
  const proto::Settings none, sent{{"CUSNAP_CRIU_GHOST_LIMIT", "1M"}};
  CHECK(std::string(setting(none, "CUSNAP_CRIU_GHOST_LIMIT")) == "4G");
  CHECK(std::string(setting(sent, "CUSNAP_CRIU_GHOST_LIMIT")) == "1M");
  unsetenv("CUSNAP_CRIU_GHOST_LIMIT");
  CHECK(setting(none, "CUSNAP_CRIU_GHOST_LIMIT") == nullptr);
  CHECK(std::string(setting(sent, "CUSNAP_CRIU_GHOST_LIMIT")) == "1M");
}
