#include "coord/sha256_chunked.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>

using namespace cusnap;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char t[] = "/tmp/cusnap-chunked-test-XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() { fs::remove_all(path); }
};

// Bytes i % 251: no two 4 KiB chunks alike.
std::string pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = char(i % 251);
  return s;
}

void write_file(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
}

ChunkedDigest hash_one(const std::string& path, uint64_t size, uint64_t chunk, unsigned threads) {
  std::vector<ChunkedDigest> out;
  std::string err;
  HashOptions o;
  o.threads = threads;
  REQUIRE_MESSAGE(sha256_chunked_files({{path, size, chunk}}, o, &out, &err), err);
  REQUIRE(out.size() == 1);
  return out[0];
}

std::vector<std::string> hex_chunks(const ChunkedDigest& d) {
  std::vector<std::string> v;
  for (const Sha256Digest& c : d.chunks) v.push_back(to_hex(c));
  return v;
}

// Sets or unsets CUSNAP_HASH_THREADS for one scope.
struct EnvThreads {
  std::optional<std::string> saved;
  explicit EnvThreads(const char* value) {
    if (const char* v = getenv("CUSNAP_HASH_THREADS")) saved = v;
    if (value)
      setenv("CUSNAP_HASH_THREADS", value, 1);
    else
      unsetenv("CUSNAP_HASH_THREADS");
  }
  ~EnvThreads() {
    if (saved)
      setenv("CUSNAP_HASH_THREADS", saved->c_str(), 1);
    else
      unsetenv("CUSNAP_HASH_THREADS");
  }
};

}  // namespace

// Expected values from Python's hashlib (and from the split/sha256sum line in
// sha256_chunked.h).
TEST_CASE("chunked sha256: known answers") {
  TempDir d;
  SUBCASE("10000 bytes in 4 KiB chunks: two full chunks and a short one") {
    write_file(d.path + "/f", pattern(10000));
    ChunkedDigest h = hash_one(d.path + "/f", 10000, 4096, 2);
    CHECK(hex_chunks(h) == std::vector<std::string>{
                               "d67c656e01756650d77717b0839985a056ec28ffe174601d690fc407a2ceffca",
                               "416317ed11e1666ed2a36373377df576bd327eb944640bf119b242d6f941bb5a",
                               "825cabc798c5aefd6ec7b0f6dbab6c5fe7ff84336193a4e462556d1b0bc37bf1"});
    CHECK(to_hex(h.root) == "9290b4e966be476ea86028e863e8f7d5a101ef65f83faec0c40b7be21c3d51ae");
  }
  SUBCASE("an exact multiple of the chunk size has no empty last chunk") {
    write_file(d.path + "/f", pattern(3 * 4096));
    ChunkedDigest h = hash_one(d.path + "/f", 3 * 4096, 4096, 2);
    REQUIRE(h.chunks.size() == 3);
    CHECK(to_hex(h.chunks[2]) ==
          "d1b82a8c64b45b2b48c5a6675a88542327f7724fa4e4d6d3308648f9878869a5");
    CHECK(to_hex(h.root) == "bffa6764c2dea78a61de083de3bc5282193062e042a6bfe5926d027b96ce4e0d");
  }
  SUBCASE("an empty file has no chunks; its digest is SHA-256 of nothing") {
    write_file(d.path + "/f", "");
    ChunkedDigest h = hash_one(d.path + "/f", 0, 4096, 4);
    CHECK(h.chunks.empty());
    CHECK(to_hex(h.root) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  }
  SUBCASE("the default chunk size: 64 MiB of zeros and one more byte") {
    std::string path = d.path + "/f";
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, off_t(kHashChunkSize + 1)) == 0);
    close(fd);
    ChunkedDigest h = hash_one(path, kHashChunkSize + 1, kHashChunkSize, 2);
    CHECK(hex_chunks(h) == std::vector<std::string>{
                               "3b6a07d0d404fab4e23b6d34bc6696a6a312dd92821332385e5af7c01c421351",
                               "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"});
    CHECK(to_hex(h.root) == "aa35313ca25925c90a2647dbedefcfeb1586c1e9a6d7d30af7285895513d1f5a");
  }
}

TEST_CASE("chunked sha256: a one-chunk file's chunk is its plain SHA-256") {
  TempDir d;
  write_file(d.path + "/f", "abc");
  ChunkedDigest h = hash_one(d.path + "/f", 3, 4096, 1);
  REQUIRE(h.chunks.size() == 1);
  CHECK(to_hex(h.chunks[0]) == sha256_hex("abc"));
  CHECK(to_hex(h.root) == to_hex(chunked_root(h.chunks)));
}

TEST_CASE("chunked sha256: the digest does not depend on the number of threads") {
  TempDir d;
  std::vector<HashTarget> targets;
  // Files of assorted sizes, so that chunks of several files interleave.
  for (size_t size : {0ul, 1ul, 4095ul, 4096ul, 4097ul, 50000ul, 200000ul, 12288ul}) {
    std::string p = d.path + "/f" + std::to_string(size);
    write_file(p, pattern(size));
    targets.push_back({p, size, 4096});
  }
  std::vector<ChunkedDigest> one, many;
  std::string err;
  HashOptions o;
  o.threads = 1;
  REQUIRE(sha256_chunked_files(targets, o, &one, &err));
  for (unsigned n : {2u, 3u, 8u, 64u}) {
    o.threads = n;
    REQUIRE(sha256_chunked_files(targets, o, &many, &err));
    REQUIRE(many.size() == one.size());
    for (size_t i = 0; i < one.size(); ++i) {
      CHECK(many[i].chunks == one[i].chunks);
      CHECK(many[i].root == one[i].root);
    }
  }
}

TEST_CASE("chunked sha256: a one-byte change shows in its chunk only, in every chunk") {
  TempDir d;
  const uint64_t chunk = 4096, size = 5 * chunk + 100;
  const std::string path = d.path + "/f", data = pattern(size);
  write_file(path, data);
  ChunkedDigest clean = hash_one(path, size, chunk, 3);
  for (uint64_t c = 0; c < chunk_count(size, chunk); ++c) {
    // The last byte of the chunk: the edge where an off-by-one would miss it.
    for (uint64_t at : {c * chunk, std::min(size, (c + 1) * chunk) - 1}) {
      std::string bad = data;
      bad[at] = char(bad[at] ^ 0x01);
      write_file(path, bad);
      ChunkedDigest h = hash_one(path, size, chunk, 3);
      CAPTURE(at);
      CHECK(h.root != clean.root);
      for (uint64_t k = 0; k < h.chunks.size(); ++k)
        CHECK((h.chunks[k] != clean.chunks[k]) == (k == c));
    }
  }
}

TEST_CASE("chunked sha256: progress counts every byte and ends at the total") {
  TempDir d;
  std::vector<HashTarget> targets;
  uint64_t total = 0;
  for (size_t size : {300000ul, 7ul, 0ul, 65536ul}) {
    std::string p = d.path + "/f" + std::to_string(size);
    write_file(p, pattern(size));
    targets.push_back({p, size, 4096});
    total += size;
  }
  std::vector<uint64_t> seen;
  HashOptions o;
  o.threads = 4;
  o.progress = [&](uint64_t done) { seen.push_back(done); };
  std::vector<ChunkedDigest> out;
  std::string err;
  REQUIRE(sha256_chunked_files(targets, o, &out, &err));
  REQUIRE_FALSE(seen.empty());
  CHECK(std::is_sorted(seen.begin(), seen.end()));
  CHECK(seen.back() == total);
}

TEST_CASE("chunked sha256: errors name the file") {
  TempDir d;
  std::vector<ChunkedDigest> out;
  std::string err;
  HashOptions o;
  o.threads = 2;
  SUBCASE("missing") {
    CHECK_FALSE(sha256_chunked_files({{d.path + "/none", 10, 4096}}, o, &out, &err));
    CHECK(err.find(d.path + "/none: cannot open") == 0);
  }
  SUBCASE("shorter than expected") {
    write_file(d.path + "/f", pattern(5000));
    CHECK_FALSE(sha256_chunked_files({{d.path + "/f", 9000, 4096}}, o, &out, &err));
    CHECK(err.find("truncated") != std::string::npos);
  }
  SUBCASE("a symbolic link is not followed") {
    write_file(d.path + "/f", pattern(10));
    fs::create_symlink(d.path + "/f", d.path + "/l");
    CHECK_FALSE(sha256_chunked_files({{d.path + "/l", 10, 4096}}, o, &out, &err));
    CHECK(err.find(d.path + "/l: cannot open") == 0);
  }
  SUBCASE("a chunk size that is not a power of two") {
    write_file(d.path + "/f", pattern(10));
    CHECK_FALSE(sha256_chunked_files({{d.path + "/f", 10, 5000}}, o, &out, &err));
    CHECK(err.find("chunk size 5000") != std::string::npos);
  }
}

TEST_CASE("chunked sha256: CUSNAP_HASH_THREADS") {
  unsigned n = 0;
  std::string err;
  for (const char* unset : {static_cast<const char*>(nullptr), ""}) {
    EnvThreads e(unset);  // empty is unset, as for every other setting
    REQUIRE(hash_thread_count(&n, &err));
    CHECK(n >= 1);
    CHECK(n <= kMaxHashThreads);
  }
  {
    EnvThreads e("3");
    REQUIRE(hash_thread_count(&n, &err));
    CHECK(n == 3);
  }
  for (const char* bad : {"0", "x", "4x", "-1", "257", "99999999999999999999"}) {
    EnvThreads e(bad);
    CAPTURE(bad);
    CHECK_FALSE(hash_thread_count(&n, &err));
    CHECK(err.find("CUSNAP_HASH_THREADS") == 0);
  }
}
