#include "coord/rank_gpus.h"

#include <doctest/doctest.h>

using namespace cusnap;

TEST_CASE("rank_gpus: two processes with collectives on one GPU share it") {
  const std::string a = "GPU-00000000-0000-0000-0000-00000000000a";
  const std::string b = "GPU-00000000-0000-0000-0000-00000000000b";
  std::string what;
  CHECK_FALSE(ranks_share_gpu({}, &what));
  CHECK_FALSE(ranks_share_gpu({{10, {a}}}, &what));
  CHECK_FALSE(ranks_share_gpu({{10, {a}}, {11, {b}}}, &what));
  // One process on two GPUs is not sharing.
  CHECK_FALSE(ranks_share_gpu({{10, {a, b}}}, &what));
  CHECK_FALSE(ranks_share_gpu({{10, {a, a}}}, &what));
  CHECK(what.empty());
  REQUIRE(ranks_share_gpu({{10, {a}}, {11, {b}}, {12, {b}}}, &what));
  CHECK(what == "processes 11 and 12 both run collective kernels (NCCL ranks) on GPU " + b);
  REQUIRE(ranks_share_gpu({{10, {b, a}}, {11, {a}}}, &what));
  CHECK(what.find("processes 10 and 11") == 0);
  CHECK(what.find(a) != std::string::npos);
}

TEST_CASE("rank_gpus: CUSNAP_ALLOW_RANKS_SHARING_GPU is 1, 0 or unset") {
  bool allowed = true;
  std::string err;
  REQUIRE(ranks_sharing_gpu_allowed(nullptr, &allowed, &err));
  CHECK_FALSE(allowed);
  allowed = true;
  REQUIRE(ranks_sharing_gpu_allowed("", &allowed, &err));
  CHECK_FALSE(allowed);
  allowed = true;
  REQUIRE(ranks_sharing_gpu_allowed("0", &allowed, &err));
  CHECK_FALSE(allowed);
  REQUIRE(ranks_sharing_gpu_allowed("1", &allowed, &err));
  CHECK(allowed);
  for (const char* bad : {"yes", "2", " 1", "true"}) {
    err.clear();
    CHECK_FALSE(ranks_sharing_gpu_allowed(bad, &allowed, &err));
    CHECK(err.find(std::string("CUSNAP_ALLOW_RANKS_SHARING_GPU=\"") + bad +
                   "\" is neither 1 nor 0") == 0);
  }
}
