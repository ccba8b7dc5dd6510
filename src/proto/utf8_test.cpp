#include <doctest/doctest.h>

#include <string>

#include "proto/json_text.h"
#include "proto/utf8.h"

using namespace cusnap;

TEST_CASE("utf8: well-formed text is accepted, anything else refused") {
  CHECK(valid_utf8(""));
  CHECK(valid_utf8("/tmp/ckpt-1"));
  CHECK(valid_utf8("caf\xc3\xa9"));           // é
  CHECK(valid_utf8("\xe2\x82\xac"));          // €
  CHECK(valid_utf8("\xf0\x9f\x98\x80"));      // U+1F600
  CHECK(valid_utf8("\xf4\x8f\xbf\xbf"));      // U+10FFFF, the last
  CHECK(valid_utf8(std::string("a\0b", 3)));  // NUL is UTF-8 (callers refuse it)
  CHECK_FALSE(valid_utf8("caf\xe9"));         // Latin-1
  CHECK_FALSE(valid_utf8("\xff"));
  CHECK_FALSE(valid_utf8("\x80"));  // a lone continuation byte
  CHECK_FALSE(valid_utf8("\xc3"));  // cut short
  CHECK_FALSE(valid_utf8("\xe2\x82"));
  CHECK_FALSE(valid_utf8("\xc0\xaf"));          // overlong '/'
  CHECK_FALSE(valid_utf8("\xe0\x80\xaf"));      // overlong, three bytes
  CHECK_FALSE(valid_utf8("\xf0\x80\x80\xaf"));  // overlong, four bytes
  CHECK_FALSE(valid_utf8("\xed\xa0\x80"));      // a surrogate
  CHECK_FALSE(valid_utf8("\xf4\x90\x80\x80"));  // above U+10FFFF
  CHECK_FALSE(valid_utf8("\xc3\x28"));          // a continuation missing
}

TEST_CASE("json_text: bytes that are not UTF-8 become U+FFFD instead of throwing") {
  const nlohmann::json j = {{"argv", {"sh", "caf\xe9"}}, {"ok", "caf\xc3\xa9"}};
  std::string text;
  CHECK_NOTHROW(text = json_text(j));
  CHECK(text == "{\"argv\":[\"sh\",\"caf\xef\xbf\xbd\"],\"ok\":\"caf\xc3\xa9\"}");
  CHECK(valid_utf8(text));
  CHECK(nlohmann::json::parse(text)["argv"][1] == "caf\xef\xbf\xbd");
  CHECK(json_text(nlohmann::json{{"a", 1}}, 2) == "{\n  \"a\": 1\n}");
}

TEST_CASE("utf8: a prefix of so many characters never cuts one") {
  CHECK(utf8_prefix("", 3) == "");
  CHECK(utf8_prefix("abcdef", 3) == "abc");
  CHECK(utf8_prefix("ab", 3) == "ab");
  CHECK(utf8_prefix("caf\xc3\xa9s", 4) == "caf\xc3\xa9");
  CHECK(utf8_prefix("\xc3\xa9\xc3\xa9\xc3\xa9", 2) == "\xc3\xa9\xc3\xa9");
  CHECK(utf8_prefix("a\xf0\x9f\x98\x80z", 2) == "a\xf0\x9f\x98\x80");
  // A byte that starts no well-formed character counts as one, as it is shown.
  CHECK(utf8_prefix("caf\xe9xyz", 4) == "caf\xe9");
  CHECK(utf8_prefix(std::string(10, '\x80'), 4) == std::string(4, '\x80'));
  CHECK(utf8_prefix("\xe2\x82x", 2) == "\xe2\x82");
  CHECK(utf8_length("caf\xc3\xa9") == 4);
  CHECK(utf8_length("caf\xe9") == 4);
  CHECK(utf8_length("\xf0\x9f\x98\x80\xe2\x82\xac") == 2);
}
