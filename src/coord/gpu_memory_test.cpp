#include "coord/gpu_memory.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <fstream>

#include "coord/manifest.h"

using namespace cusnap;

namespace {
const std::string kGpu0 = "GPU-00000000-0000-0000-0000-000000000001";
const std::string kGpu1 = "GPU-00000000-0000-0000-0000-000000000002";
}  // namespace

TEST_CASE("gpu memory: the margin setting") {
  RestoreMemoryPolicy p;
  std::string err;
  REQUIRE(restore_memory_policy(nullptr, &p, &err));
  CHECK(p.enabled);
  CHECK(p.margin == (256ull << 20));
  REQUIRE(restore_memory_policy("", &p, &err));
  CHECK(p.margin == kDefaultRestoreMargin);
  REQUIRE(restore_memory_policy("off", &p, &err));
  CHECK_FALSE(p.enabled);
  REQUIRE(restore_memory_policy("0", &p, &err));
  CHECK(p.enabled);
  CHECK(p.margin == 0);
  REQUIRE(restore_memory_policy("512M", &p, &err));
  CHECK(p.margin == (512ull << 20));
  REQUIRE(restore_memory_policy("2G", &p, &err));
  CHECK(p.margin == (2ull << 30));
  REQUIRE(restore_memory_policy("64k", &p, &err));
  CHECK(p.margin == (64ull << 10));
  REQUIRE(restore_memory_policy("1048576", &p, &err));
  CHECK(p.margin == (1ull << 20));
  for (const char* bad :
       {"-1", "1T", "12MB", "M", "abc", "on", " 5", "99999999999999999999", "17179869184G"}) {
    CAPTURE(bad);
    err.clear();
    CHECK_FALSE(restore_memory_policy(bad, &p, &err));
    CHECK(err.find("CUSNAP_RESTORE_MEMORY_MARGIN=\"" + std::string(bad) + "\"") !=
          std::string::npos);
  }
}

TEST_CASE("gpu memory: what a restore needs, per GPU, through a device map") {
  ProcessGpuUse use;
  use[10][kGpu0] = 100;
  use[11][kGpu0] = 50;
  use[11][kGpu1] = 7;
  use[12][kGpu1] = 1000;  // not restored here
  GpuUse need = restore_need(use, {10, 11, 13});
  CHECK(need.size() == 2);
  CHECK(need[kGpu0] == 150);
  CHECK(need[kGpu1] == 7);
  // Swapped GPUs: each process's use lands on the GPU it is restored onto.
  need = restore_need(use, {10, 11}, {{kGpu0, kGpu1}, {kGpu1, kGpu0}});
  CHECK(need[kGpu1] == 150);
  CHECK(need[kGpu0] == 7);
  CHECK(restore_need(use, {}).empty());
  // Nothing needed, or the check off: fits without asking NVML.
  std::string why;
  CHECK(restore_memory_fits({}, RestoreMemoryPolicy{}, {}, &why));
  RestoreMemoryPolicy off;
  off.enabled = false;
  CHECK(restore_memory_fits({{kGpu0, ~0ull}}, off, {}, &why));
  // The margin's cap follows the GPUs through the map.
  const GpuUse cap = map_gpus({{kGpu0, 5}, {kGpu1, 6}}, {{kGpu0, kGpu1}, {kGpu1, kGpu0}});
  CHECK(cap.at(kGpu1) == 5);
  CHECK(cap.at(kGpu0) == 6);
  CHECK(why.empty());
}

TEST_CASE("gpu memory: the runtime record, written and read back, bad ones refused") {
  char tmpl[] = "/tmp/cusnap-gpu-use-XXXXXX";
  REQUIRE(mkdtemp(tmpl));
  const std::string dir = tmpl, path = dir + "/" + kGpuUseFile;
  ProcessGpuUse use, back;
  GpuUse free = {{kGpu0, 123456789ull}}, free_back;
  use[4242][kGpu0] = 4838064128ull;
  use[4243][kGpu1] = 1;
  std::string err;
  REQUIRE(write_gpu_use(path, use, free, &err));
  REQUIRE(read_gpu_use(path, &back, &free_back));
  CHECK(back == use);
  CHECK(free_back == free);
  REQUIRE(write_gpu_use(path, {}, {}, &err));  // an empty record stands too
  REQUIRE(read_gpu_use(path, &back, &free_back));
  CHECK(back.empty());
  CHECK(free_back.empty());
  auto bad = [&](const std::string& text) {
    std::ofstream(path, std::ios::trunc) << text;
    back[1][kGpu0] = 1;
    free_back[kGpu0] = 1;
    CAPTURE(text);
    CHECK_FALSE(read_gpu_use(path, &back, &free_back));
    CHECK(back.empty());
    CHECK(free_back.empty());
  };
  auto procs = [](const std::string& p) { return "{\"processes\": " + p + "}"; };
  bad("[1, 2]");
  bad("{\"12\": {}}");  // not under "processes"
  bad(procs("[]"));
  bad(procs("{\"x\": {}}"));
  bad(procs("{\"-5\": {}}"));
  bad(procs("{\"12\": {\"not-a-gpu\": 5}}"));
  bad(procs("{\"12\": {\"" + kGpu0 + "\": -5}}"));
  bad(procs("{\"12\": {\"" + kGpu0 + "\": \"5\"}}"));
  bad("{\"processes\": {}, \"free\": {\"" + kGpu0 + "\": -1}}");
  bad("{\"processes\": {}, \"free\": 7}");
  bad("{\"processes\": ");
  ::unlink(path.c_str());
  CHECK_FALSE(read_gpu_use(path, &back, &free_back));
  // A link is not followed.
  REQUIRE(symlink("/etc/hostname", path.c_str()) == 0);
  CHECK_FALSE(read_gpu_use(path, &back, &free_back));
  ::unlink(path.c_str());
  CHECK(write_gpu_use(dir + "/missing/" + kGpuUseFile, use, free, &err) == false);
  CHECK(err.find("missing") != std::string::npos);
  ::rmdir(dir.c_str());
}

TEST_CASE("gpu memory: a process's use in the manifest, optional and checked") {
  Manifest m, back;
  m.job.name = "j";
  m.job.root_pid = 100;
  ManifestProcess p;
  p.pid = 100;
  p.uses_cuda = true;
  p.gpus = {kGpu0};
  m.processes.push_back(p);
  std::string err;
  std::string text = manifest_to_json(m);
  CHECK(text.find("gpu_memory") == std::string::npos);  // absent when not counted
  REQUIRE(manifest_from_json(text, &back, &err));
  CHECK(back.processes[0].gpu_memory.empty());
  m.processes[0].gpu_memory[kGpu0] = 4838064128ull;
  text = manifest_to_json(m);
  REQUIRE(manifest_from_json(text, &back, &err));
  CHECK(back.processes[0].gpu_memory == m.processes[0].gpu_memory);
  const std::string count = "\"" + kGpu0 + "\": 4838064128";
  REQUIRE(text.find(count) != std::string::npos);
  std::string t = text;
  CHECK_FALSE(manifest_from_json(t.replace(t.find(count), count.size(), "\"x\": 1"), &back, &err));
  CHECK(err.find("processes[0].gpu_memory.x") != std::string::npos);
  t = text;
  CHECK_FALSE(manifest_from_json(t.replace(t.find(count), count.size(), "\"" + kGpu0 + "\": -1"),
                                 &back, &err));
  CHECK(err.find("processes[0].gpu_memory") != std::string::npos);
  // Each GPU's free memory before the checkpoint, optional and checked too.
  m.gpu_free[kGpu0] = 1ull << 30;
  text = manifest_to_json(m);
  REQUIRE(manifest_from_json(text, &back, &err));
  CHECK(back.gpu_free == m.gpu_free);
  const std::string freetext = "\"gpu_free\": {\n    \"" + kGpu0 + "\": 1073741824";
  REQUIRE(text.find(freetext) != std::string::npos);
  t = text;
  CHECK_FALSE(manifest_from_json(
      t.replace(t.find(freetext), freetext.size(), "\"gpu_free\": {\"" + kGpu0 + "\": \"x\""),
      &back, &err));
  CHECK(err.find("gpu_free") != std::string::npos);
}

TEST_CASE("gpu memory: counts no GPU has are refused in the manifest, sums included") {
  Manifest m, back;
  m.job.name = "j";
  m.job.root_pid = 100;
  ManifestProcess p;
  p.pid = 100;
  p.uses_cuda = true;
  p.gpus = {kGpu0};
  p.gpu_memory[kGpu0] = ~0ull;
  m.processes.push_back(p);
  std::string err;
  CHECK_FALSE(manifest_from_json(manifest_to_json(m), &back, &err));
  CHECK(err.find("processes[0].gpu_memory." + kGpu0 +
                 " is 18446744073709551615 bytes, more device memory than a GPU has") !=
        std::string::npos);
  // Each at the bound, but more together than a GPU has.
  m.processes[0].gpu_memory[kGpu0] = kMaxGpuMemoryBytes;
  REQUIRE(manifest_from_json(manifest_to_json(m), &back, &err));
  p.pid = 101;
  p.gpu_memory[kGpu0] = kMaxGpuMemoryBytes;
  m.processes.push_back(p);
  CHECK_FALSE(manifest_from_json(manifest_to_json(m), &back, &err));
  CHECK(err.find("processes[1].gpu_memory." + kGpu0 + ": the processes' use of " + kGpu0 +
                 " adds up to more device memory than a GPU has") != std::string::npos);
  m.processes.pop_back();
  m.gpu_free[kGpu0] = kMaxGpuMemoryBytes + 1;
  CHECK_FALSE(manifest_from_json(manifest_to_json(m), &back, &err));
  CHECK(err.find("gpu_free." + kGpu0 + " is " + std::to_string(kMaxGpuMemoryBytes + 1) +
                 " bytes, more device memory than a GPU has") != std::string::npos);
  m.gpu_free.clear();
  m.gpus.push_back({0, "Fake H200", kGpu0, ~0ull});
  CHECK_FALSE(manifest_from_json(manifest_to_json(m), &back, &err));
  CHECK(err.find("gpus[0].total_mem is 18446744073709551615 bytes, more device memory than a GPU "
                 "has") != std::string::npos);
}

TEST_CASE("gpu memory: the need saturates, and the check names it in MiB that do not wrap") {
  ProcessGpuUse use;
  use[10][kGpu0] = ~0ull;
  use[11][kGpu0] = 2;
  use[11][kGpu1] = ~0ull - 1;
  use[12][kGpu1] = ~0ull - 1;
  GpuUse need = restore_need(use, {10, 11, 12});
  CHECK(need[kGpu0] == ~0ull);
  CHECK(need[kGpu1] == ~0ull);
  // Onto one GPU through a map: still no wrap.
  need = restore_need(use, {10, 11, 12}, {{kGpu1, kGpu0}});
  CHECK(need.size() == 1);
  CHECK(need[kGpu0] == ~0ull);
  // Against the simulated GPUs (NVML of tests/fakecuda, on LD_LIBRARY_PATH).
  std::vector<GpuMemory> gpus;
  ProcessGpuUse now;
  std::string err, why;
  REQUIRE_MESSAGE(nvml_read(&gpus, &now, &err), err);
  REQUIRE_FALSE(gpus.empty());
  CHECK_FALSE(restore_memory_fits({{gpus[0].uuid, ~0ull}}, RestoreMemoryPolicy{}, {}, &why));
  CHECK_MESSAGE(why.find("the job needs 17592186044416 MiB there") != std::string::npos, why);
  CHECK_FALSE(restore_memory_fits({{gpus[0].uuid, (~0ull) - (1ull << 19) + 1}},
                                  RestoreMemoryPolicy{}, {}, &why));
  CHECK_MESSAGE(why.find("the job needs 17592186044416 MiB there") != std::string::npos, why);
  // Where the margin came from, when the message gives it.
  RestoreMemoryPolicy from;
  from.origin = " (from the supervisor)";
  CHECK_FALSE(restore_memory_fits({{gpus[0].uuid, ~0ull}}, from, {}, &why));
  CHECK_MESSAGE(why.find("set CUSNAP_RESTORE_MEMORY_MARGIN lower (from the supervisor).") !=
                    std::string::npos,
                why);
}
