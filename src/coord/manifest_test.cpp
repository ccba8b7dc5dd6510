#include "coord/manifest.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "coord/sha256.h"

using namespace cusnap;
namespace fs = std::filesystem;

namespace {

Manifest sample() {
  Manifest m;
  m.created = "2026-01-01T00:00:00Z";
  m.cusnap_version = "0.1.0";
  m.job.name = "train";
  m.job.argv = {"./train", "--epochs", "3"};
  m.job.cwd = "/home/u";
  m.job.root_pid = 100;
  m.job.stdout_pipe_id = "pipe:[11]";
  m.job.stderr_pipe_id = "pipe:[12]";
  ManifestProcess p;
  p.pid = 100;
  p.ppid = 1;
  p.exe = "/bin/train";
  p.cmdline = m.job.argv;
  p.uses_cuda = true;
  p.gpus = {"GPU-00000000-0000-0000-0000-000000000001"};
  m.processes.push_back(p);
  m.driver_version = 13000;
  m.gpus.push_back({0, "Fake H200", "GPU-00000000-0000-0000-0000-000000000001", 1ull << 34});
  m.criu_version = "4.1.1";
  m.files.push_back({"criu/pages-1.img", 3, sha256_hex("abc")});
  m.phases = {{"dump", 1.5}};
  return m;
}

struct TempDir {
  std::string path;
  TempDir() {
    char t[] = "/tmp/cusnap-manifest-test-XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() { fs::remove_all(path); }
};

void write_file(const std::string& path, const std::string& data) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << data;
}

}  // namespace

TEST_CASE("manifest: round trip keeps every field") {
  Manifest m = sample(), back;
  std::string err;
  REQUIRE(manifest_from_json(manifest_to_json(m), &back, &err));
  CHECK(back.job.name == "train");
  CHECK(back.job.argv == m.job.argv);
  CHECK(back.job.stderr_pipe_id == "pipe:[12]");
  REQUIRE(back.processes.size() == 1);
  CHECK(back.processes[0].uses_cuda);
  CHECK(back.processes[0].gpus == m.processes[0].gpus);
  CHECK(back.gpus[0].total_mem == (1ull << 34));
  CHECK(back.files[0].sha256 == m.files[0].sha256);
  CHECK(back.phases == m.phases);
}

TEST_CASE("manifest: the loader rejects what it does not understand, saying which field") {
  std::string err;
  Manifest out;
  CHECK_FALSE(manifest_from_json("{\"format\": \"cusnap-checkpoint\", \"vers", &out, &err));
  CHECK(err.find("not valid JSON") != std::string::npos);

  std::string text = manifest_to_json(sample());
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    size_t p = t.find(from);
    REQUIRE(p != std::string::npos);
    return t.replace(p, from.size(), to);
  };
  CHECK_FALSE(manifest_from_json(with("\"version\": 1\n}", "\"version\": 7\n}"), &out, &err));
  CHECK(err.find("version 7 is not supported") != std::string::npos);
  CHECK_FALSE(manifest_from_json(with("\"root_pid\": 100", "\"root_pid\": \"x\""), &out, &err));
  CHECK(err.find("job.root_pid is not an integer") != std::string::npos);
  CHECK_FALSE(manifest_from_json(with("criu/pages-1.img", "../etc/passwd"), &out, &err));
  CHECK(err.find("not a relative path") != std::string::npos);
  CHECK_FALSE(manifest_from_json(with("\"uses_cuda\": true", "\"uses_cuda\": 1"), &out, &err));
  CHECK(err.find("uses_cuda") != std::string::npos);
  CHECK_FALSE(manifest_from_json(with("\"cusnap-checkpoint\"", "\"other\""), &out, &err));
}

TEST_CASE("manifest: atomic write, read back, and file verification") {
  TempDir d;
  write_file(d.path + "/criu/pages-1.img", "abc");
  Manifest m = sample();
  std::string err;
  std::vector<ManifestFile> files;
  REQUIRE(hash_directory(d.path, &files, nullptr, &err));
  REQUIRE(files.size() == 1);
  CHECK(files[0].path == "criu/pages-1.img");
  CHECK(files[0].sha256 == sha256_hex("abc"));
  m.files = files;
  REQUIRE(write_manifest(d.path, m, &err));
  CHECK_FALSE(fs::exists(d.path + "/manifest.json.tmp"));
  Manifest back;
  REQUIRE(read_manifest(d.path, &back, &err));
  CHECK(verify_manifest_files(d.path, back, nullptr, &err));

  SUBCASE("a changed byte is caught") {
    write_file(d.path + "/criu/pages-1.img", "abd");
    CHECK_FALSE(verify_manifest_files(d.path, back, nullptr, &err));
    CHECK(err.find("does not match its SHA-256") != std::string::npos);
  }
  SUBCASE("a truncated file is caught by its size") {
    write_file(d.path + "/criu/pages-1.img", "ab");
    CHECK_FALSE(verify_manifest_files(d.path, back, nullptr, &err));
    CHECK(err.find("truncated") != std::string::npos);
  }
  SUBCASE("a missing file") {
    fs::remove(d.path + "/criu/pages-1.img");
    CHECK_FALSE(verify_manifest_files(d.path, back, nullptr, &err));
    CHECK(err.find("missing") != std::string::npos);
  }
  SUBCASE("an extra file") {
    write_file(d.path + "/criu/core-9.img", "x");
    CHECK_FALSE(verify_manifest_files(d.path, back, nullptr, &err));
    CHECK(err.find("not listed") != std::string::npos);
  }
  SUBCASE("CRIU's restore statistics are allowed") {
    write_file(d.path + "/criu/stats-restore", "x");
    CHECK(verify_manifest_files(d.path, back, nullptr, &err));
  }
  SUBCASE("no manifest: not a finished checkpoint") {
    fs::remove(d.path + "/manifest.json");
    CHECK_FALSE(read_manifest(d.path, &back, &err));
    CHECK(err.find("did not finish") != std::string::npos);
  }
}
