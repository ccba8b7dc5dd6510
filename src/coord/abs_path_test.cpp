#include "coord/abs_path.h"

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

using namespace cusnap;

namespace {
std::string absolute_of(const std::string& p) {
  std::string out;
  std::error_code ec;
  REQUIRE(absolute_path(p, &out, &ec));
  return out;
}
}  // namespace

TEST_CASE("absolute path: '..' is taken where the path before it leads, links followed") {
  char tmp[] = "/tmp/cusnap-abspath.XXXXXX";
  REQUIRE(::mkdtemp(tmp));
  const std::string d = std::filesystem::canonical(tmp).string();
  REQUIRE(::mkdir((d + "/real").c_str(), 0700) == 0);
  REQUIRE(::mkdir((d + "/real/sub").c_str(), 0700) == 0);
  REQUIRE(::symlink((d + "/real/sub").c_str(), (d + "/link").c_str()) == 0);

  // Through the link, '..' is the parent of its target, as the kernel has it.
  CHECK(absolute_of(d + "/link/../other") == d + "/real/other");
  CHECK(absolute_of(d + "/link/..") == d + "/real");
  // Without '..' the path stays as written: its links are kept.
  CHECK(absolute_of(d + "/link/x/") == d + "/link/x");
  CHECK(absolute_of(d + "//real/./sub///") == d + "/real/sub");
  // '..' past a part that does not exist (yet) is taken as written.
  CHECK(absolute_of(d + "/new/../x") == d + "/x");
  // Relative: from the current directory.
  char cwd[4096];
  REQUIRE(::getcwd(cwd, sizeof cwd));
  REQUIRE(::chdir((d + "/link").c_str()) == 0);
  CHECK(absolute_of("../y") == d + "/real/y");
  CHECK(absolute_of("z/.") == d + "/real/sub/z");  // getcwd names no link
  REQUIRE(::chdir(cwd) == 0);
  std::filesystem::remove_all(d);
}
