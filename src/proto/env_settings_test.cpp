#include "proto/env_settings.h"

#include <doctest/doctest.h>
#include <stdlib.h>

#include <string>

using namespace cusnap::proto;

namespace {

/// Sets (or, with nullptr, unsets) a variable for one scope.
struct EnvVar {
  EnvVar(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) {
      had_ = true;
      old_ = old;
    }
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~EnvVar() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }
  const char* name_;
  bool had_ = false;
  std::string old_;
};

}  // namespace

TEST_CASE("env_settings: a whole number is decimal digits within the bounds, nothing else") {
  uint64_t v = 7;
  CHECK(parse_whole("0", 0, 10, &v));
  CHECK(v == 0);
  CHECK(parse_whole("10", 0, 10, &v));
  CHECK(v == 10);
  CHECK(parse_whole("0042", 1, 100, &v));
  CHECK(v == 42);
  CHECK(parse_whole("9999999999999999999", 0, UINT64_MAX, &v));  // 19 digits
  CHECK(v == 9999999999999999999ull);
  v = 7;
  for (const char* bad : {"", "11", "-1", "+1", " 1", "1 ", "1k", "0x1", "1.0", "abc",
                          "18446744073709551616", "00000000000000000001"})
    CHECK_MESSAGE(!parse_whole(bad, 0, 10, &v), bad);
  CHECK_FALSE(parse_whole(nullptr, 0, 10, &v));
  CHECK_FALSE(parse_whole("0", 1, 10, &v));
  CHECK(v == 7);  // untouched by a refusal
}

TEST_CASE(
    "env_settings: the shim's reading takes the fallback for a bad value, the check says it") {
  uint64_t v = 0;
  std::string err;
  {
    EnvVar e("CUSNAP_SHIM_STAGING_MIB", nullptr);
    CHECK(env_number(kShimStagingMib) == 32);
    CHECK(env_number_checked(kShimStagingMib, &v, &err));
    CHECK(v == 32);
  }
  {
    EnvVar e("CUSNAP_SHIM_STAGING_MIB", "");
    CHECK(env_number_checked(kShimStagingMib, &v, &err));
    CHECK(v == 32);
  }
  {
    EnvVar e("CUSNAP_SHIM_STAGING_MIB", "64");
    CHECK(env_number(kShimStagingMib) == 64);
    CHECK(env_number_checked(kShimStagingMib, &v, &err));
    CHECK(v == 64);
  }
  {
    EnvVar e("CUSNAP_SHIM_STAGING_MIB", "2048");
    CHECK(env_number(kShimStagingMib) == 32);
    CHECK_FALSE(env_number_checked(kShimStagingMib, &v, &err));
    CHECK(err ==
          "CUSNAP_SHIM_STAGING_MIB=\"2048\" is not a whole number of MiB from 1 to 1024 (unset it "
          "for the default)");
    CHECK_FALSE(check_env_settings(true, false, &err));
    CHECK(err.find("CUSNAP_SHIM_STAGING_MIB") == 0);
    CHECK(check_env_settings(false, true, &err));  // not the supervisor's
  }
  {
    EnvVar e("CUSNAP_SAVE_PARTS", "0");
    CHECK(check_env_settings(true, false, &err));
    err.clear();
    CHECK_FALSE(check_env_settings(false, true, &err));
    CHECK(err.find("CUSNAP_SAVE_PARTS=\"0\"") == 0);
  }
  {
    EnvVar e("CUSNAP_GUARDIAN_CRIU_WAIT_MS", std::string(100, '9').c_str());
    CHECK_FALSE(env_number_checked(kGuardianCriuWaitMs, &v, &err));
    CHECK(err.find(std::string(32, '9') + "...\"") != std::string::npos);  // shortened
  }
}

TEST_CASE("env_settings: CUSNAP_SHIM_DIRECT_IO is off, auto or on") {
  for (const char* ok : {"off", "0", "auto", "on", "1", ""})
    CHECK_MESSAGE(shim_direct_io_valid(ok), ok);
  CHECK(shim_direct_io_valid(nullptr));
  for (const char* bad : {"yes", "ON", "true", "2"}) CHECK_MESSAGE(!shim_direct_io_valid(bad), bad);
  EnvVar e("CUSNAP_SHIM_DIRECT_IO", "yes");
  std::string err;
  CHECK_FALSE(check_env_settings(true, false, &err));
  CHECK(err == "CUSNAP_SHIM_DIRECT_IO=\"yes\" is none of off, auto and on");
}

TEST_CASE("env_settings: the control timeout is seconds above 0, at most a year") {
  int64_t ms = 0;
  CHECK(parse_timeout_seconds("2.5", &ms));
  CHECK(ms == 2500);
  CHECK(parse_timeout_seconds("0.0001", &ms));
  CHECK(ms == 1);  // never 0
  CHECK(parse_timeout_seconds("31536000", &ms));
  for (const char* bad : {"", "0", "-1", "30s", "nan", "31536001", "abc"})
    CHECK_MESSAGE(!parse_timeout_seconds(bad, &ms), bad);
  std::string err;
  {
    EnvVar e("CUSNAP_CONTROL_TIMEOUT", nullptr);
    ms = 5;
    CHECK(control_timeout_checked(&ms, &err));
    CHECK(ms == 5);
  }
  {
    EnvVar e("CUSNAP_CONTROL_TIMEOUT", "30s");
    CHECK_FALSE(control_timeout_checked(&ms, &err));
    CHECK(err.find("CUSNAP_CONTROL_TIMEOUT=\"30s\" is not a number of seconds") == 0);
  }
}
