#include "coord/settings.h"

#include <doctest/doctest.h>
#include <stdlib.h>

#include <functional>
#include <string>
#include <vector>

#include "coord/criu.h"
#include "coord/gpu_memory.h"
#include "coord/rank_gpus.h"
#include "coord/sha256_chunked.h"
#include "proto/env_settings.h"

using namespace cusnap;

TEST_CASE("settings: a setting the client sent counts before the environment") {
  setenv("CUSNAP_CRIU_GHOST_LIMIT", "4G", 1);
  const proto::Settings none, sent{{"CUSNAP_CRIU_GHOST_LIMIT", "1M"}};
  CHECK(std::string(setting(none, "CUSNAP_CRIU_GHOST_LIMIT")) == "4G");
  CHECK(std::string(setting(sent, "CUSNAP_CRIU_GHOST_LIMIT")) == "1M");
  unsetenv("CUSNAP_CRIU_GHOST_LIMIT");
  CHECK(setting(none, "CUSNAP_CRIU_GHOST_LIMIT") == nullptr);
  CHECK(std::string(setting(sent, "CUSNAP_CRIU_GHOST_LIMIT")) == "1M");
}

TEST_CASE("settings: a value from the supervisor's environment is said to be, in a message") {
  const proto::Settings none, sent{{"CUSNAP_CRIU_GHOST_LIMIT", "1M"}};
  setenv("CUSNAP_CRIU_GHOST_LIMIT", "4G", 1);
  CHECK(setting_origin(sent, "CUSNAP_CRIU_GHOST_LIMIT").empty());  // the user's own
  CHECK(setting_origin(none, "CUSNAP_CRIU_GHOST_LIMIT") ==
        " (CUSNAP_CRIU_GHOST_LIMIT=\"4G\" is from the environment of the job's supervisor, as "
        "the job was launched or restored: set CUSNAP_CRIU_GHOST_LIMIT for this command to "
        "override it)");
  // A reader's refusal of that value says so; another failure is left alone.
  std::string err = "CUSNAP_CRIU_GHOST_LIMIT=\"4G\" is too small";
  CHECK_FALSE(refused_setting(none, "CUSNAP_CRIU_GHOST_LIMIT", &err));
  CHECK(err == "CUSNAP_CRIU_GHOST_LIMIT=\"4G\" is too small" +
                   setting_origin(none, "CUSNAP_CRIU_GHOST_LIMIT"));
  err = "CRIU was not found";
  CHECK_FALSE(refused_setting(none, "CUSNAP_CRIU_GHOST_LIMIT", &err));
  CHECK(err == "CRIU was not found");
  err = "CUSNAP_CRIU_GHOST_LIMIT=\"1M\" is too small";
  CHECK_FALSE(refused_setting(sent, "CUSNAP_CRIU_GHOST_LIMIT", &err));
  CHECK(err == "CUSNAP_CRIU_GHOST_LIMIT=\"1M\" is too small");
  unsetenv("CUSNAP_CRIU_GHOST_LIMIT");
  CHECK(setting_origin(none, "CUSNAP_CRIU_GHOST_LIMIT").empty());  // unset: the default
}

TEST_CASE("settings: launch's check of the supervisor's settings agrees with its reading") {
  // The supervisor's reading of each setting a client may send
  // (proto::kClientSettings), which launch and restore check up front
  // (proto::check_env_settings): the same values refused, in the same words.
  using Read = std::function<bool(const char*, std::string*)>;
  const std::vector<std::pair<std::string, Read>> readers = {
      {"CUSNAP_HASH_THREADS",
       [](const char* v, std::string* e) {
         unsigned n = 0;
         return hash_thread_count(v, &n, e);
       }},
      {kRestoreMarginSetting,
       [](const char* v, std::string* e) {
         RestoreMemoryPolicy p;
         return restore_memory_policy(v, &p, e);
       }},
      {"CUSNAP_CRIU_BREAKPOINTS",
       [](const char* v, std::string* e) {
         // "auto" and unset probe the machine; the values are what counts.
         const std::string s = v ? v : "";
         if (s.empty() || s == "auto") return true;
         bool use = false;
         return criu_breakpoints(v, &use, e);
       }},
      {"CUSNAP_CRIU_GHOST_LIMIT",
       [](const char* v, std::string* e) {
         std::string arg;
         return criu_ghost_limit(v, &arg, e);
       }},
      {"CUSNAP_CRIU_NETWORK_LOCK",
       [](const char* v, std::string* e) {
         std::string method;
         return criu_network_lock(v, &method, e);
       }},
      {"CUSNAP_ALLOW_RANKS_SHARING_GPU",
       [](const char* v, std::string* e) {
         bool allowed = false;
         return ranks_sharing_gpu_allowed(v, &allowed, e);
       }},
  };
  for (const char* name : proto::kClientSettings) {
    bool found = false;
    for (const auto& [n, read] : readers) found = found || n == name;
    CHECK_MESSAGE(found, name, " has no reader in this test");
  }
  const char* values[] = {"",
                          "0",
                          "1",
                          "2",
                          "256",
                          "257",
                          "-1",
                          " 1",
                          "1 ",
                          "on",
                          "off",
                          "auto",
                          "ON",
                          "4G",
                          "4g",
                          "4T",
                          "512M",
                          "512m",
                          "1k",
                          "1K",
                          "M",
                          "12MB",
                          "lots",
                          "nftables",
                          "iptables",
                          "skip",
                          "999999999999",
                          "9999999999999",
                          "9999999999G",
                          "8589934591G",
                          "8589934592G",
                          "8796093022207M",
                          "9223372036854775807",
                          "9223372036854775808",
                          "17179869184G",
                          "99999999999999999999",
                          "0000000000001"};
  for (const auto& [name, read] : readers) {
    for (const char* v : values) {
      CAPTURE(name);
      CAPTURE(v);
      setenv(name.c_str(), v, 1);
      std::string check_err, read_err;
      const bool checked = proto::check_env_settings(false, true, &check_err);
      const bool taken = read(v, &read_err);
      CHECK(checked == taken);
      if (!taken) CHECK(check_err == read_err);
    }
    unsetenv(name.c_str());
    std::string e;
    CHECK(proto::check_env_settings(false, true, &e));
  }
}
