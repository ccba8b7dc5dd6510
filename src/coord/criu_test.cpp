#include "coord/criu.h"

#include <doctest/doctest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

using namespace cusnap;

TEST_CASE("criu: version parsing") {
  CriuInfo c;
  REQUIRE(parse_criu_version("Version: 4.1.1\n", &c));
  CHECK(c.major == 4);
  CHECK(c.minor == 1);
  CHECK(c.patch == 1);
  REQUIRE(parse_criu_version("Version: 3.17\nGitID: v3.17\n", &c));
  CHECK(c.version == "3.17");
  CHECK(c.minor == 17);
  CHECK_FALSE(parse_criu_version("criu: unknown option\n", &c));
}

TEST_CASE("criu: too old and missing are refused with what to do") {
  char dir[] = "/tmp/cusnap-criu-test-XXXXXX";
  REQUIRE(mkdtemp(dir));
  std::string fake = std::string(dir) + "/criu";
  std::ofstream(fake) << "#!/bin/sh\necho 'Version: 3.17'\n";
  chmod(fake.c_str(), 0755);
  setenv("CUSNAP_CRIU", fake.c_str(), 1);
  CriuInfo c;
  std::string err;
  CHECK_FALSE(find_criu(&c, &err));
  CHECK(err.find("version 3.17") != std::string::npos);
  CHECK(err.find(">= 4.1") != std::string::npos);
  setenv("CUSNAP_CRIU", "/nonexistent/criu", 1);
  CHECK_FALSE(find_criu(&c, &err));
  CHECK(err.find("not an executable") != std::string::npos);
  unsetenv("CUSNAP_CRIU");
  std::filesystem::remove_all(dir);
}

TEST_CASE("criu: a failing run quotes the end of its log") {
  char dir[] = "/tmp/cusnap-criu-test-XXXXXX";
  REQUIRE(mkdtemp(dir));
  std::string fake = std::string(dir) + "/criu";
  std::ofstream(fake) << "#!/bin/sh\necho 'Error (criu/cr-dump.c:1): something broke' > " << dir
                      << "/x.log\nexit 1\n";
  chmod(fake.c_str(), 0755);
  CriuInfo c;
  c.path = fake;
  CriuRun run;
  run.args = {"dump"};
  run.log_path = std::string(dir) + "/x.log";
  std::string err;
  CHECK_FALSE(run_criu(c, run, &err));
  CHECK(err.find("criu dump failed (exit status 1)") != std::string::npos);
  CHECK(err.find("something broke") != std::string::npos);
  std::filesystem::remove_all(dir);
}
