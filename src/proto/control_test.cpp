#include "proto/control.h"
#include "proto/wire.h"

#include <doctest/doctest.h>

#include <string>

using namespace cusnap::proto;

namespace {

/// Whether err says what to do: a next step after what failed.
bool says_what_to_do(const std::string& err) {
  return err.find(": ") != std::string::npos &&
         (err.find("unset ") != std::string::npos || err.find("give ") != std::string::npos ||
          err.find("choose another") != std::string::npos ||
          err.find("send it with the cusnap that started the job") != std::string::npos);
}

}  // namespace

TEST_CASE("control: every refusal of a request says what failed and what to do") {
  std::string err;
  SUBCASE("an over-long setting: its name, its length, the most, and to shorten or unset it") {
    CHECK_FALSE(validate(
        TimeoutRequest{1000, {{"CUSNAP_CRIU_GHOST_LIMIT", std::string(kMaxSettingBytes + 1, '1')}}},
        &err));
    CHECK(err.find("CUSNAP_CRIU_GHOST_LIMIT") != std::string::npos);
    CHECK(err.find("is 65 bytes long, more than the 64") != std::string::npos);
    CHECK(err.find("write it shorter, or unset CUSNAP_CRIU_GHOST_LIMIT") != std::string::npos);
  }
  SUBCASE("a setting with a NUL byte") {
    CHECK_FALSE(
        validate(TimeoutRequest{1000, {{"CUSNAP_HASH_THREADS", std::string("1\0", 2)}}}, &err));
    CHECK(err.find("CUSNAP_HASH_THREADS") != std::string::npos);
    CHECK(err.find("NUL") != std::string::npos);
  }
  SUBCASE("an unknown setting: the ones taken") {
    CHECK_FALSE(validate(TimeoutRequest{1000, {{"PATH", "/x"}}}, &err));
    CHECK(err.find("unknown setting 'PATH'") != std::string::npos);
    CHECK(err.find("CUSNAP_HASH_THREADS") != std::string::npos);
  }
  SUBCASE("too many settings") {
    Settings many;
    std::string key = "CUSNAP_X0";
    for (char c = '0'; c <= '9'; ++c) {
      key.back() = c;
      many.emplace(key, std::string(1, '1'));
    }
    CHECK_FALSE(validate(TimeoutRequest{1000, many}, &err));
    CHECK(err.find("10 settings") != std::string::npos);
  }
  SUBCASE("a timeout out of range") {
    CHECK_FALSE(validate(TimeoutRequest{0, {}}, &err));
    CHECK(err.find("timeout of 0 ms is out of range") != std::string::npos);
    CHECK(err.find("--timeout") != std::string::npos);
  }
  SUBCASE("a relative checkpoint directory") {
    CHECK_FALSE(validate(CheckpointRequest{"relative", false, 1000, {}}, &err));
    CHECK(err.find("absolute path") != std::string::npos);
    CHECK(err.find("-o") != std::string::npos);
  }
  SUBCASE("a cancel of an operation that cannot be cancelled") {
    CHECK_FALSE(validate(CancelRequest{"resume", true}, &err));
    CHECK(err.find("'resume'") != std::string::npos);
    CHECK(err.find("only a checkpoint or a suspend") != std::string::npos);
  }
  SUBCASE("a cancel of an unknown operation, not text") {
    CHECK_FALSE(validate(CancelRequest{std::string("\xff\0x", 3), false}, &err));
    CHECK(err.find("not text") != std::string::npos);
  }
  SUBCASE("a checkpoint directory that is not UTF-8") {
    CHECK_FALSE(validate(CheckpointRequest{"/a\xff", false, 1000, {}}, &err));
  }
  CHECK(says_what_to_do(err));
}

TEST_CASE("control: a cancel of a checkpoint or a suspend is valid; it round-trips the wire") {
  std::string err;
  CHECK(validate(CancelRequest{kMsgCheckpoint, true}, &err));
  CHECK(validate(CancelRequest{kMsgSuspend, false}, &err));
  CHECK_FALSE(validate(CancelRequest{"", true}, &err));
  Message m;
  const std::string body = encode_body(kMsgCancel, CancelRequest{kMsgSuspend, false});
  REQUIRE(decode_body(body, &m, &err));
  CHECK(m.type == kMsgCancel);
  CancelRequest r;
  REQUIRE(m.get(&r, &err));
  CHECK(r.op == kMsgSuspend);
  CHECK_FALSE(r.own);
  SUBCASE("a cancel of another shape is refused, not taken") {
    const std::string bad = encode_body(kMsgCancel, std::string("checkpoint"));
    REQUIRE(decode_body(bad, &m, &err));
    CHECK_FALSE(m.get(&r, &err));
    CHECK(err.find("malformed 'cancel'") != std::string::npos);
  }
}
