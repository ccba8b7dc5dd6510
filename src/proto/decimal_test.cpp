#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "proto/decimal.h"
#include "proto/proc_stat.h"

using namespace cusnap;

namespace {
std::string decimal(uint64_t v) {
  char out[proto::kDecimalMax];
  return std::string(out, proto::format_decimal(v, out));
}
}  // namespace

TEST_CASE("decimal: every unsigned 64-bit number, in its shortest digits") {
  CHECK(decimal(0) == "0");
  CHECK(decimal(7) == "7");
  CHECK(decimal(10) == "10");
  CHECK(decimal(4194304) == "4194304");
  CHECK(decimal(UINT64_MAX) == "18446744073709551615");
  CHECK(decimal(UINT64_MAX).size() == proto::kDecimalMax);
}

TEST_CASE("decimal: a plain decimal is digits, then a point and digits if any") {
  for (const char* good : {"0", "10", "2.5", "0.001", "604800"})
    CHECK_MESSAGE(proto::plain_decimal(good), good);
  for (const char* bad :
       {"", "0x10", "1e3", "+5", "-1", " 5", "5 ", "inf", "nan", ".5", "5.", "1..2", "1.2.3"})
    CHECK_MESSAGE(!proto::plain_decimal(bad), bad);
  CHECK_FALSE(proto::plain_decimal(nullptr));
}

TEST_CASE("decimal: seconds in milliseconds, to the nearest, without the locale's strtod") {
  const auto ms = [](const char* text) {
    int64_t v = -1;
    return proto::decimal_seconds_ms(text, 86400 * 365, &v) ? v : -1;
  };
  CHECK(ms("2.5") == 2500);
  CHECK(ms("10") == 10000);
  CHECK(ms("0.001") == 1);
  CHECK(ms("0.0004") == 1);  // above 0: never 0 ms
  CHECK(ms("0.0015") == 2);  // half up
  CHECK(ms("1.23449") == 1234);
  CHECK(ms("0.9999") == 1000);
  CHECK(ms("31536000") == int64_t(31536000) * 1000);  // a year, the most
  CHECK(ms("31536000.000") == int64_t(31536000) * 1000);
  for (const char* bad : {"0", "0.000", "31536000.0001", "31536001", "99999999999999999999999",
                          "2,5", "1e3", "", "-1"})
    CHECK_MESSAGE(ms(bad) == -1, bad);
}

TEST_CASE("proc_stat: this process's start time is field 22 of its stat file") {
  std::ifstream in("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t at = stat.rfind(')') + 2;  // field 3
  for (int field = 3; field < 22; ++field) at = stat.find(' ', at) + 1;
  const uint64_t expected = std::stoull(stat.substr(at));
  uint64_t got = 0;
  REQUIRE(proto::proc_start_time(::getpid(), &got, true));
  CHECK(got == expected);
  CHECK_FALSE(proto::proc_start_time(0x3fffffff, &got, false));  // no such pid
}
