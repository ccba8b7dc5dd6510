// For the unit tests: a temporary directory holding an executable script that
// stands in for CRIU, removed with the object.
#pragma once

#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <system_error>

#include "coord/criu.h"

namespace cusnap::testing {

class FakeCriu {
 public:
  explicit FakeCriu(const std::string& script = "#!/bin/sh\nexit 0\n") {
    char tmpl[] = "/tmp/cusnap-criu-test-XXXXXX";
    if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp for a fake CRIU failed");
    dir_ = tmpl;
    set_script(script);
  }
  ~FakeCriu() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  FakeCriu(const FakeCriu&) = delete;
  FakeCriu& operator=(const FakeCriu&) = delete;

  /// Writes the script anew.
  void set_script(const std::string& text) const {
    std::ofstream(path()) << text;
    chmod(path().c_str(), 0755);
  }
  const std::string& dir() const { return dir_; }
  std::string path() const { return dir_ + "/criu"; }
  /// A file of the directory (a log, an output).
  std::string file(const std::string& name) const { return dir_ + "/" + name; }
  /// CRIU as find_criu would describe it, at path().
  CriuInfo info() const {
    CriuInfo c;
    c.path = path();
    return c;
  }

 private:
  std::string dir_;
};

}  // namespace cusnap::testing
