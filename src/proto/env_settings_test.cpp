#include "proto/env_settings.h"

#include <doctest/doctest.h>
#include <stdlib.h>

#include <array>
#include <string>
#include <vector>

#include "proto/control.h"

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
  // The shim's collective prefixes: what it would read as none, or cut short.
  CHECK(collective_kernels_valid(nullptr));
  CHECK(collective_kernels_valid(""));
  for (const char* ok : {"ncclDevKernel,ncclKernel", "myAllReduce", "a,b,c,d,e,f,g,h", ",nccl",
                         "nccl,", "a,,b", ",a,b,c,d,e,f,g,h,"})
    CHECK_MESSAGE(collective_kernels_valid(ok), ok);
  for (const char* bad : {",,,", ",", "nccl, ncclKernel", " nccl", "a,b,c,d,e,f,g,h,i"})
    CHECK_MESSAGE(!collective_kernels_valid(bad), bad);
  CHECK(collective_kernels_valid(std::string(255, 'k').c_str()));
  CHECK_FALSE(collective_kernels_valid(std::string(256, 'k').c_str()));
  EnvVar e("CUSNAP_SHIM_DIRECT_IO", "yes");
  std::string err;
  CHECK_FALSE(check_env_settings(true, false, &err));
  CHECK(
      err ==
      "CUSNAP_SHIM_DIRECT_IO=\"yes\" is none of off, auto and on (unset it for the default, off)");
}

TEST_CASE("env_settings: the shim's switches are 0 or 1") {
  for (const char* ok : {"0", "1", ""}) CHECK_MESSAGE(shim_switch_valid(ok), ok);
  CHECK(shim_switch_valid(nullptr));
  for (const char* bad : {"false", "off", "no", "00", " 0", "2"})
    CHECK_MESSAGE(!shim_switch_valid(bad), bad);
  for (const char* name : kShimSwitches) {
    EnvVar e(name, "off");
    std::string err;
    CHECK_FALSE(check_env_settings(true, false, &err));
    CHECK(err == std::string(name) +
                     "=\"off\" is neither 0 nor 1: set it to 0 to turn it off, or unset it (on)");
    CHECK(check_env_settings(false, true, &err));  // the supervisor does not read it
  }
}

TEST_CASE("env_settings: the control timeout is seconds above 0, at most a year") {
  int64_t ms = 0;
  CHECK(parse_timeout_seconds("2.5", &ms));
  CHECK(ms == 2500);
  CHECK(parse_timeout_seconds("0.0001", &ms));
  CHECK(ms == 1);  // never 0
  CHECK(parse_timeout_seconds("31536000", &ms));
  for (const char* bad : {"", "0", "-1", "30s", "nan", "31536001", "abc", "0x10", "1e3", "+5", " 5",
                          "5 ", "inf", ".5", "5.", "1..2"})
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
    CHECK(err ==
          "CUSNAP_CONTROL_TIMEOUT=\"30s\" is not a number of seconds greater than 0 and at most "
          "31536000, a year (unset it for the default, 10)");
  }
}

TEST_CASE("env_settings: launch and restore check every setting the supervisor reads later") {
  std::string err;
  // Each value a later checkpoint, suspend or resume would refuse, refused now
  // in the same words: {setting, value, message}.
  const std::vector<std::array<const char*, 3>> bad = {
      {"CUSNAP_RESTORE_MEMORY_MARGIN", "lots",
       "CUSNAP_RESTORE_MEMORY_MARGIN=\"lots\" is not a size (bytes, or a number followed by K, M "
       "or G) or off (unset it for the default, 256M)"},
      {"CUSNAP_RESTORE_MEMORY_MARGIN", "17179869184G", "CUSNAP_RESTORE_MEMORY_MARGIN="},
      {"CUSNAP_HASH_THREADS", "0",
       "CUSNAP_HASH_THREADS=\"0\" is not a number of threads from 1 to 256 (unset it to use every "
       "core)"},
      {"CUSNAP_HASH_THREADS", "257", "CUSNAP_HASH_THREADS=\"257\""},
      {"CUSNAP_CRIU_BREAKPOINTS", "maybe",
       "CUSNAP_CRIU_BREAKPOINTS=\"maybe\" is not auto, on or off: unset it to let cusnap find "
       "out whether this machine's hardware breakpoints work"},
      {"CUSNAP_CRIU_GHOST_LIMIT", "4T",
       "CUSNAP_CRIU_GHOST_LIMIT=\"4T\" is not a size (bytes, or a number followed by K, M or G, "
       "e.g. 4G): unset it to save deleted files of any size"},
      {"CUSNAP_CRIU_GHOST_LIMIT", "0", "CUSNAP_CRIU_GHOST_LIMIT=\"0\""},
      {"CUSNAP_CRIU_GHOST_LIMIT", "9999999999G", "CUSNAP_CRIU_GHOST_LIMIT=\"9999999999G\""},
      {"CUSNAP_CRIU_NETWORK_LOCK", "ufw",
       "CUSNAP_CRIU_NETWORK_LOCK=\"ufw\" is not nftables, iptables or skip (CRIU's network lock "
       "methods): unset it for nftables"},
      {"CUSNAP_ALLOW_RANKS_SHARING_GPU", "yes",
       "CUSNAP_ALLOW_RANKS_SHARING_GPU=\"yes\" is neither 1 nor 0: set it to 1 to checkpoint "
       "ranks that share a GPU anyway, or unset it"},
  };
  for (const auto& [name, value, why] : bad) {
    CAPTURE(name);
    CAPTURE(value);
    EnvVar e(name, value);
    err.clear();
    CHECK_FALSE(check_env_settings(false, true, &err));
    CHECK_MESSAGE(err.find(why) == 0, err);
    CHECK(check_env_settings(true, false, &err));  // not the shim's
  }
  // What the supervisor takes passes.
  const std::vector<std::array<const char*, 2>> good = {
      {"CUSNAP_RESTORE_MEMORY_MARGIN", "off"}, {"CUSNAP_RESTORE_MEMORY_MARGIN", "512M"},
      {"CUSNAP_RESTORE_MEMORY_MARGIN", ""},    {"CUSNAP_HASH_THREADS", "256"},
      {"CUSNAP_CRIU_BREAKPOINTS", "auto"},     {"CUSNAP_CRIU_BREAKPOINTS", "0"},
      {"CUSNAP_CRIU_BREAKPOINTS", ""},         {"CUSNAP_CRIU_GHOST_LIMIT", "4G"},
      {"CUSNAP_CRIU_GHOST_LIMIT", ""},         {"CUSNAP_CRIU_NETWORK_LOCK", "skip"},
      {"CUSNAP_ALLOW_RANKS_SHARING_GPU", "1"}, {"CUSNAP_ALLOW_RANKS_SHARING_GPU", ""},
  };
  for (const auto& [name, value] : good) {
    CAPTURE(name);
    CAPTURE(value);
    EnvVar e(name, value);
    CHECK_MESSAGE(check_env_settings(false, true, &err), err);
  }
  // Empty is unset, for CUSNAP_HASH_THREADS as for every other setting.
  EnvVar empty_threads("CUSNAP_HASH_THREADS", "");
  CHECK_MESSAGE(check_env_settings(false, true, &err), err);
}

TEST_CASE("env_settings: every setting a client may send is one launch and restore check") {
  // A client's setting counts before the supervisor's environment; without
  // one, the supervisor's own value is used: each must be checked up front.
  for (const char* name : kClientSettings) {
    CAPTURE(name);
    EnvVar e(name, "\x01not-a-value");
    std::string err;
    CHECK_FALSE(check_env_settings(false, true, &err));
    CHECK(err.find(std::string(name) + "=\"") == 0);
  }
}

TEST_CASE(
    "env_settings: a setting a command sends is checked first; one too long says what it takes "
    "and how to get the default") {
  std::string err;
  CHECK(sent_setting_checked("CUSNAP_HASH_THREADS", nullptr, 64, &err));
  CHECK(sent_setting_checked("CUSNAP_HASH_THREADS", "8", 64, &err));
  CHECK(sent_setting_checked("CUSNAP_RESTORE_MEMORY_MARGIN", (std::string(62, '0') + "1M").c_str(),
                             64, &err));
  // Not a value it takes: the words launch uses for it.
  const std::string threads(70, '1');
  CHECK_FALSE(sent_setting_checked("CUSNAP_HASH_THREADS", threads.c_str(), 64, &err));
  CHECK(err == "CUSNAP_HASH_THREADS=\"" + std::string(32, '1') +
                   "...\" is not a number of threads from 1 to 256 (unset it to use every core)");
  const std::string lock = "nftables" + std::string(60, 'x');
  CHECK_FALSE(sent_setting_checked("CUSNAP_CRIU_NETWORK_LOCK", lock.c_str(), 64, &err));
  CHECK(err.find("is not nftables, iptables or skip (CRIU's network lock methods): unset it for "
                 "nftables") != std::string::npos);
  // A short value it does not take is refused before it is sent, in the
  // same words, so that a command refuses it as launch does.
  CHECK_FALSE(sent_setting_checked("CUSNAP_CRIU_GHOST_LIMIT", "12X", 64, &err));
  CHECK(err == "CUSNAP_CRIU_GHOST_LIMIT=\"12X\" " + std::string(kCriuGhostLimit.refusal));
  CHECK_FALSE(sent_setting_checked("CUSNAP_RESTORE_MEMORY_MARGIN", "lots", 64, &err));
  CHECK(err.find("CUSNAP_RESTORE_MEMORY_MARGIN=\"lots\" is not a size") == 0);
  CHECK_FALSE(sent_setting_checked("CUSNAP_ALLOW_RANKS_SHARING_GPU", "yes", 64, &err));
  CHECK(sent_setting_checked("CUSNAP_ALLOW_RANKS_SHARING_GPU", "1", 64, &err));
  CHECK(sent_setting_checked("CUSNAP_RESTORE_MEMORY_MARGIN", "off", 64, &err));
  // One it takes, written long: too long, and what to do.
  const std::string margin = std::string(70, '0') + "1M";
  CHECK_FALSE(sent_setting_checked("CUSNAP_RESTORE_MEMORY_MARGIN", margin.c_str(), 64, &err));
  CHECK(err.find("CUSNAP_RESTORE_MEMORY_MARGIN=\"") == 0);
  CHECK(err.find("is longer than 64 characters") != std::string::npos);
  CHECK(err.find("unset it for the default") != std::string::npos);
  // Each setting a command sends: the form it takes, and unsetting it.
  for (const TextSetting* s : kSupervisorTextSettings) {
    CAPTURE(s->name);
    CHECK_FALSE(sent_setting_checked(s->name, std::string(65, 'z').c_str(), 64, &err));
    CHECK(err.find("unset it") != std::string::npos);
  }
}
