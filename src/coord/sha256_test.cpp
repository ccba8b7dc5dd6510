#include "coord/sha256.h"

#include <doctest/doctest.h>

#include <string>

using cusnap::Sha256;
using cusnap::sha256_hex;

namespace {
void check_vectors() {
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnop"
                   "qklmnopqrlmnopqrsmnopqrstnopqrstu") ==
        "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  // One million 'a', fed in uneven pieces to cross block boundaries.
  Sha256 h;
  std::string chunk(997, 'a');
  size_t left = 1000000;
  while (left > 0) {
    size_t n = std::min(left, chunk.size());
    h.update(chunk.data(), n);
    left -= n;
  }
  CHECK(h.hex_digest() == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}
}  // namespace

TEST_CASE("sha256: standard vectors, hardware path where present") {
  Sha256::force_portable(false);
  check_vectors();
}

TEST_CASE("sha256: standard vectors, portable path") {
  Sha256::force_portable(true);
  check_vectors();
  Sha256::force_portable(false);
}

TEST_CASE("sha256: both paths agree on every length up to 300") {
  std::string data;
  for (int i = 0; i < 300; ++i) data.push_back(char(i * 7 + 3));
  for (size_t len = 0; len <= data.size(); ++len) {
    Sha256::force_portable(true);
    std::string a = sha256_hex(std::string_view(data).substr(0, len));
    Sha256::force_portable(false);
    std::string b = sha256_hex(std::string_view(data).substr(0, len));
    REQUIRE(a == b);
  }
}

TEST_CASE("sha256: binary digest and hex conversions") {
  Sha256 h;
  h.update("abc", 3);
  cusnap::Sha256Digest d = h.digest();
  CHECK(d[0] == 0xba);
  CHECK(d[31] == 0xad);
  CHECK(cusnap::to_hex(d) == sha256_hex("abc"));
  cusnap::Sha256Digest back{};
  REQUIRE(cusnap::from_hex(sha256_hex("abc"), &back));
  CHECK(back == d);
  CHECK_FALSE(cusnap::from_hex(std::string(63, 'a'), &back));
  CHECK_FALSE(cusnap::from_hex(std::string(64, 'A'), &back));
  CHECK_FALSE(cusnap::from_hex(std::string(63, 'a') + "g", &back));
}
