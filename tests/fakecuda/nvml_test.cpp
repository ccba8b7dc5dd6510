// The simulated NVML (libnvidia-ml.so.1, dlopened from the simulated driver's
// directory) and the system-wide ledger behind it: devices and UUIDs as the
// driver's, holders (progs/fakecuda_holder) listed with their memory on their
// device until driver-checkpointed (progs/fakecuda_ckpt), the driver's
// restore refused for lack of memory (then 304 for good) or let through, the
// count protocol, FAKECUDA_NVML=off and calls before nvmlInit. Holders use
// device 1 of 2 (FAKECUDA_UUID_SEED 41), compared with what was there before.
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cudaapi/nvml_table.h"
#include "fakecuda_test_util.h"

extern char** environ;

using namespace fctest;

namespace {

constexpr unsigned long long kMiB = 1ULL << 20;
using Env = std::vector<std::pair<std::string, std::string>>;

/// The simulated NVML's entry points (the coordinator's table, and the
/// older nvmlInit too), resolved once.
struct NvmlLib : cusnap::NvmlTable {
  void* handle = nullptr;
  decltype(&nvmlInit_v2) init_v1 = nullptr;
};

const NvmlLib& lib() {
  static NvmlLib l = [] {
    NvmlLib n;
    n.handle = dlopen(CUSNAP_FAKECUDA_DIR "/libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!n.handle) return n;
    n.resolve(n.handle);
    n.init_v1 = reinterpret_cast<decltype(&nvmlInit_v2)>(dlsym(n.handle, "nvmlInit"));
    return n;
  }();
  return l;
}

bool lib_complete() {
  const NvmlLib& n = lib();
  return n.handle && n.init && n.init_v1 && n.shutdown && n.error_string && n.count && n.by_index &&
         n.uuid && n.memory && n.processes;
}

/// Sets environment variables for the scope (NVML reads them at nvmlInit),
/// then restores them.
class EnvGuard {
 public:
  explicit EnvGuard(const Env& set) {
    for (const auto& [k, v] : set) {
      const char* old = getenv(k.c_str());
      saved_.push_back({k, old ? std::string(old) : std::string(), old != nullptr});
      setenv(k.c_str(), v.c_str(), 1);
    }
  }
  ~EnvGuard() {
    for (const auto& s : saved_) {
      if (s.had)
        setenv(s.key.c_str(), s.value.c_str(), 1);
      else
        unsetenv(s.key.c_str());
    }
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  struct Saved {
    std::string key, value;
    bool had;
  };
  std::vector<Saved> saved_;
};

/// The environment of a holder or coordinator on "this machine".
Env machine_env(unsigned long long total_mem = 0) {
  Env e{{"FAKECUDA_DEVICES", "2"}, {"FAKECUDA_UUID_SEED", "41"}};
  if (total_mem) e.push_back({"FAKECUDA_TOTAL_MEM", std::to_string(total_mem)});
  return e;
}

/// A program of the simulated driver's directory, its stdout on a pipe;
/// killed (SIGKILL) and reaped when it goes out of scope.
struct Proc {
  pid_t pid = -1;
  int out = -1;
  std::string buf;

  Proc() = default;
  Proc(const Proc&) = delete;
  Proc& operator=(const Proc&) = delete;
  ~Proc() { stop(); }

  void start(const std::vector<std::string>& args, const Env& env) {
    std::vector<std::string> envs;
    for (char** e = environ; *e; ++e) {
      bool replaced = false;
      for (const auto& [k, v] : env)
        replaced = replaced || strncmp(*e, (k + "=").c_str(), k.size() + 1) == 0;
      if (!replaced) envs.emplace_back(*e);
    }
    for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
    std::vector<char*> argv, envp;
    std::string path = std::string(CUSNAP_FAKECUDA_DIR) + "/" + args[0];
    argv.push_back(path.data());
    for (size_t i = 1; i < args.size(); ++i) argv.push_back(const_cast<char*>(args[i].c_str()));
    argv.push_back(nullptr);
    for (auto& s : envs) envp.push_back(s.data());
    envp.push_back(nullptr);
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return;
    fflush(nullptr);
    pid = fork();
    if (pid == 0) {
      dup2(p[1], 1);
      execve(path.c_str(), argv.data(), envp.data());
      _exit(127);
    }
    close(p[1]);
    out = p[0];
  }

  /// The next line of its output (without '\n'); false at EOF or timeout.
  bool line(std::string* l, int timeout_ms = 10000) {
    for (;;) {
      size_t nl = buf.find('\n');
      if (nl != std::string::npos) {
        *l = buf.substr(0, nl);
        buf.erase(0, nl + 1);
        return true;
      }
      pollfd pf{out, POLLIN, 0};
      if (out < 0 || poll(&pf, 1, timeout_ms) != 1) return false;
      char chunk[512];
      ssize_t n = read(out, chunk, sizeof chunk);
      if (n <= 0) return false;
      buf.append(chunk, static_cast<size_t>(n));
    }
  }

  /// Everything it prints until it exits, and its exit status.
  int finish(std::string* all) {
    std::string l;
    while (line(&l, 30000)) *all += l + "\n";
    *all += buf;
    if (out >= 0) close(out);
    out = -1;
    int status = 0;
    if (pid > 0) waitpid(pid, &status, 0);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  void stop() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    pid = -1;
    if (out >= 0) close(out);
    out = -1;
  }
};

/// Starts a holder of two buffers of `mib` MiB on device `dev` and waits
/// until it holds them ("ready <pid>").
bool start_holder(Proc* h, unsigned mib, int dev) {
  h->start({"fakecuda_holder", std::to_string(mib), "0", std::to_string(dev)}, machine_env());
  std::string l;
  return h->pid > 0 && h->line(&l) && l == "ready " + std::to_string(h->pid);
}

/// Two more verified ticks ("tick N ok") of a running holder.
bool holder_ticks_ok(Proc* h) {
  std::string l;
  for (int i = 0; i < 2; ++i) {
    do {
      if (!h->line(&l)) return false;
    } while (l.rfind("tick ", 0) != 0 && l.find("CORRUPT") == std::string::npos);
    if (l.find(" ok") == std::string::npos) return false;
  }
  return true;
}

/// Runs `fakecuda_ckpt op pid` on this machine (env), with GPU pairs
/// ("OLD=NEW,...") for a restore; returns the CUresult it reports (0: ok), or
/// -1 when it says nothing readable. For "state": the state.
int ckpt(const char* op, pid_t pid, const Env& env, const std::string& pairs = "") {
  Proc c;
  std::vector<std::string> args{"fakecuda_ckpt", op, std::to_string(pid)};
  if (!pairs.empty()) args.insert(args.end(), {"0", pairs});
  c.start(args, env);
  std::string all;
  c.finish(&all);
  int v = -1;
  if (strcmp(op, "state") == 0) {
    size_t at = all.find("state ");
    if (at != std::string::npos) v = atoi(all.c_str() + at + 6);
    return v;
  }
  if (all.rfind("ok\n", 0) == 0) return 0;
  size_t open = all.rfind('(');
  if (open != std::string::npos) v = atoi(all.c_str() + open + 1);
  if (v < 0) MESSAGE("fakecuda_ckpt " << op << ": " << all);
  return v;
}

nvmlDevice_t device(unsigned i) {
  nvmlDevice_t d = nullptr;
  CHECK(lib().by_index(i, &d) == NVML_SUCCESS);
  return d;
}

nvmlMemory_t memory_of(unsigned i) {
  nvmlMemory_t m{};
  CHECK(lib().memory(device(i), &m) == NVML_SUCCESS);
  return m;
}

/// The bytes NVML lists for pid on device i; 0 when not listed.
unsigned long long listed(unsigned i, pid_t pid) {
  std::vector<nvmlProcessInfo_t> infos(64);
  unsigned n = static_cast<unsigned>(infos.size());
  if (lib().processes(device(i), &n, infos.data()) != NVML_SUCCESS) return ~0ULL;
  for (unsigned k = 0; k < n; ++k)
    if (infos[k].pid == static_cast<unsigned>(pid)) return infos[k].usedGpuMemory;
  return 0;
}

/// NVML initialised on this machine for the scope.
struct NvmlSession {
  EnvGuard env;
  explicit NvmlSession(const Env& e = machine_env()) : env(e) {
    REQUIRE(lib_complete());
    REQUIRE(lib().init() == NVML_SUCCESS);
  }
  ~NvmlSession() { lib().shutdown(); }
};

std::string uuid_text(const CUuuid& u) {
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  char s[48];
  snprintf(s, sizeof s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
           b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
           b[14], b[15]);
  return s;
}

}  // namespace

TEST_CASE("fakecuda nvml: devices and UUIDs are the driver's") {
  REQUIRE(lib_complete());
  CHECK(run_child([] {
          setenv("FAKECUDA_DEVICES", "2", 1);
          setenv("FAKECUDA_UUID_SEED", "41", 1);
          setenv("FAKECUDA_TOTAL_MEM", "1073741824", 1);
          unsetenv("FAKECUDA_NVML");
          FC_REQ(cuInit(0) == CUDA_SUCCESS);
          std::string want[2];
          for (int i = 0; i < 2; ++i) {
            CUuuid u;
            FC_REQ(cuDeviceGetUuid(&u, i) == CUDA_SUCCESS);
            want[i] = uuid_text(u);
          }
          const NvmlLib& n = lib();
          FC_REQ(n.init() == NVML_SUCCESS);
          unsigned count = 0;
          FC_REQ(n.count(&count) == NVML_SUCCESS && count == 2);
          FC_REQ(n.count(nullptr) == NVML_ERROR_INVALID_ARGUMENT);
          nvmlDevice_t d[2] = {};
          for (unsigned i = 0; i < 2; ++i) {
            FC_REQ(n.by_index(i, &d[i]) == NVML_SUCCESS && d[i] != nullptr);
            char s[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
            FC_REQ(n.uuid(d[i], s, sizeof s) == NVML_SUCCESS);
            FC_REQ(s == want[i]);
            FC_REQ(strlen(s) == 40);
            nvmlMemory_t m{};
            FC_REQ(n.memory(d[i], &m) == NVML_SUCCESS);
            FC_REQ(m.total == 1073741824ULL && m.free + m.used == m.total);
          }
          FC_REQ(want[0] != want[1]);
          nvmlDevice_t bad = nullptr;
          FC_REQ(n.by_index(2, &bad) == NVML_ERROR_INVALID_ARGUMENT);
          FC_REQ(n.by_index(0, nullptr) == NVML_ERROR_INVALID_ARGUMENT);
          char s[64];
          FC_REQ(n.uuid(d[0], s, 40) == NVML_ERROR_INSUFFICIENT_SIZE);  // 40 characters + NUL
          FC_REQ(n.uuid(d[0], nullptr, 64) == NVML_ERROR_INVALID_ARGUMENT);
          FC_REQ(n.uuid(nullptr, s, sizeof s) == NVML_ERROR_INVALID_ARGUMENT);
          int not_a_device = 0;
          FC_REQ(n.uuid(reinterpret_cast<nvmlDevice_t>(&not_a_device), s, sizeof s) ==
                 NVML_ERROR_INVALID_ARGUMENT);
          FC_REQ(n.memory(d[0], nullptr) == NVML_ERROR_INVALID_ARGUMENT);
          nvmlMemory_t m{};
          FC_REQ(n.memory(nullptr, &m) == NVML_ERROR_INVALID_ARGUMENT);
          FC_REQ(n.processes(d[1], nullptr, nullptr) == NVML_ERROR_INVALID_ARGUMENT);
          FC_REQ(n.shutdown() == NVML_SUCCESS);
          // Another seed is another machine: other UUIDs, read at the next init.
          setenv("FAKECUDA_UUID_SEED", "42", 1);
          FC_REQ(n.init() == NVML_SUCCESS);
          FC_REQ(n.by_index(0, &d[0]) == NVML_SUCCESS);
          FC_REQ(n.uuid(d[0], s, sizeof s) == NVML_SUCCESS && s != want[0]);
          FC_REQ(n.shutdown() == NVML_SUCCESS);
          return 0;
        }) == 0);
}

TEST_CASE("fakecuda nvml: a holder is listed on its device until driver-checkpointed") {
  NvmlSession nvml;
  const nvmlMemory_t before = memory_of(1);
  Proc holder;
  REQUIRE(start_holder(&holder, 8, 1));
  const pid_t pid = holder.pid;
  const unsigned long long held = 16 * kMiB;  // two buffers of 8 MiB
  CHECK(listed(1, pid) == held);
  CHECK(listed(0, pid) == 0);
  nvmlMemory_t m = memory_of(1);
  CHECK(m.total == before.total);
  CHECK(before.free - m.free == held);
  CHECK(m.used - before.used == held);
  // cuMemGetInfo is system-wide too: a process with nothing of its own sees
  // the holder's memory taken.
  const unsigned long long used_now = m.used;
  CHECK(run_child([used_now] {
          setenv("FAKECUDA_DEVICES", "2", 1);
          setenv("FAKECUDA_UUID_SEED", "41", 1);
          FC_REQ(cuInit(0) == CUDA_SUCCESS);
          CUcontext ctx;
          FC_REQ(cuDevicePrimaryCtxRetain(&ctx, 1) == CUDA_SUCCESS);
          FC_REQ(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
          size_t free_bytes = 0, total = 0;
          FC_REQ(cuMemGetInfo(&free_bytes, &total) == CUDA_SUCCESS);
          FC_REQ(free_bytes == total - used_now);
          return 0;
        }) == 0);

  // Driver-checkpointed, it holds nothing and is not listed.
  REQUIRE(ckpt("suspend", pid, machine_env()) == 0);
  CHECK(listed(1, pid) == 0);
  m = memory_of(1);
  CHECK(m.free == before.free);
  CHECK(m.used == before.used);
  REQUIRE(ckpt("resume", pid, machine_env()) == 0);
  CHECK(listed(1, pid) == held);
  CHECK(holder_ticks_ok(&holder));
}

TEST_CASE("fakecuda nvml: a restore without room fails out of memory, then 304 for good") {
  NvmlSession nvml;
  Proc a, b;
  REQUIRE(start_holder(&a, 8, 1));
  REQUIRE(ckpt("suspend", a.pid, machine_env()) == 0);
  const unsigned long long base = memory_of(1).used;  // a holds nothing now
  REQUIRE(start_holder(&b, 8, 1));                    // takes 16 MiB of device 1
  CHECK(listed(1, b.pid) == 16 * kMiB);
  // A device of base + 24 MiB: 8 MiB free, a needs 16.
  CHECK(ckpt("restore", a.pid, machine_env(base + 24 * kMiB)) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(ckpt("state", a.pid, machine_env()) == CU_PROCESS_STATE_CHECKPOINTED);
  CHECK(listed(1, a.pid) == 0);
  b.stop();
  CHECK(memory_of(1).used == base);
  // The memory is back, but the driver never restores this process again.
  CHECK(ckpt("restore", a.pid, machine_env()) == CUDA_ERROR_OPERATING_SYSTEM);
  CHECK(ckpt("state", a.pid, machine_env()) == CU_PROCESS_STATE_CHECKPOINTED);
  CHECK(ckpt("unlock", a.pid, machine_env()) == CUDA_ERROR_ILLEGAL_STATE);
}

TEST_CASE("fakecuda nvml: a restore with room beside another holder succeeds, bytes intact") {
  NvmlSession nvml;
  Proc a, b;
  REQUIRE(start_holder(&a, 8, 1));
  REQUIRE(ckpt("suspend", a.pid, machine_env()) == 0);
  const unsigned long long base = memory_of(1).used;
  REQUIRE(start_holder(&b, 8, 1));
  // A device of base + 32 MiB: exactly the 16 MiB a needs are free.
  CHECK(ckpt("resume", a.pid, machine_env(base + 32 * kMiB)) == 0);
  CHECK(holder_ticks_ok(&a));
  CHECK(listed(1, a.pid) == 16 * kMiB);
  CHECK(listed(1, b.pid) == 16 * kMiB);
  CHECK(memory_of(1).used == base + 32 * kMiB);
  CHECK(holder_ticks_ok(&b));
}

TEST_CASE("fakecuda nvml: a restore onto the other device (GPU pairs) is counted there") {
  NvmlSession nvml;
  Proc a;
  REQUIRE(start_holder(&a, 8, 1));
  CHECK(listed(1, a.pid) == 16 * kMiB);
  REQUIRE(ckpt("suspend", a.pid, machine_env()) == 0);
  const unsigned long long used0 = memory_of(0).used, used1 = memory_of(1).used;
  // Its device 1 onto the machine's device 0 (and 0 onto 1): the memory is
  // on device 0 now, for NVML and for the next restore's check alike.
  REQUIRE(ckpt("resume", a.pid, machine_env(), "0=1,1=0") == 0);
  CHECK(holder_ticks_ok(&a));
  CHECK(listed(0, a.pid) == 16 * kMiB);
  CHECK(listed(1, a.pid) == 0);
  CHECK(memory_of(0).used == used0 + 16 * kMiB);
  CHECK(memory_of(1).used == used1);
  // Suspended again, it needs device 0's memory: with device 0 too small for
  // it beside what is there, the restore fails out of memory.
  REQUIRE(ckpt("suspend", a.pid, machine_env()) == 0);
  CHECK(ckpt("restore", a.pid, machine_env(used0 + 8 * kMiB)) == CUDA_ERROR_OUT_OF_MEMORY);
}

TEST_CASE("fakecuda nvml: the process count protocol") {
  NvmlSession nvml(Env{{"FAKECUDA_DEVICES", "16"}, {"FAKECUDA_UUID_SEED", "41"}});
  const NvmlLib& n = lib();
  // Device 15: nobody's.
  unsigned count = 0;
  CHECK(n.processes(device(15), &count, nullptr) == NVML_SUCCESS);
  CHECK(count == 0);
  Proc h;
  REQUIRE(start_holder(&h, 2, 1));
  count = 0;
  CHECK(n.processes(device(1), &count, nullptr) == NVML_ERROR_INSUFFICIENT_SIZE);
  CHECK(count >= 1);
  const unsigned needed = count;
  count = needed + 3;  // more room than needed: *infoCount becomes the number written
  CHECK(n.processes(device(1), &count, nullptr) == NVML_ERROR_INVALID_ARGUMENT);
  std::vector<nvmlProcessInfo_t> infos(needed + 3);
  count = needed + 3;
  CHECK(n.processes(device(1), &count, infos.data()) == NVML_SUCCESS);
  CHECK(count == needed);
  bool found = false;
  for (unsigned k = 0; k < count; ++k) {
    if (infos[k].pid != static_cast<unsigned>(h.pid)) continue;
    found = true;
    CHECK(infos[k].usedGpuMemory == 4 * kMiB);
    CHECK(infos[k].gpuInstanceId == 0);
    CHECK(infos[k].computeInstanceId == 0);
  }
  CHECK(found);
  if (needed > 1) {
    count = needed - 1;
    CHECK(n.processes(device(1), &count, infos.data()) == NVML_ERROR_INSUFFICIENT_SIZE);
    CHECK(count == needed);
  }
  CHECK(n.processes(device(1), nullptr, infos.data()) == NVML_ERROR_INVALID_ARGUMENT);
  count = 4;
  CHECK(n.processes(nullptr, &count, infos.data()) == NVML_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("fakecuda nvml: calls before nvmlInit, init counting, FAKECUDA_NVML=off") {
  REQUIRE(lib_complete());
  const NvmlLib& n = lib();
  unsigned count = 0;
  nvmlDevice_t d = nullptr;
  nvmlMemory_t m{};
  char s[96];
  CHECK(n.count(&count) == NVML_ERROR_UNINITIALIZED);
  CHECK(n.by_index(0, &d) == NVML_ERROR_UNINITIALIZED);
  CHECK(n.uuid(d, s, sizeof s) == NVML_ERROR_UNINITIALIZED);
  CHECK(n.memory(d, &m) == NVML_ERROR_UNINITIALIZED);
  CHECK(n.processes(d, &count, nullptr) == NVML_ERROR_UNINITIALIZED);
  CHECK(n.shutdown() == NVML_ERROR_UNINITIALIZED);
  CHECK(std::string(n.error_string(NVML_SUCCESS)) == "Success");
  CHECK(std::string(n.error_string(NVML_ERROR_UNINITIALIZED)) == "Uninitialized");
  CHECK(std::string(n.error_string(NVML_ERROR_INVALID_ARGUMENT)) == "Invalid Argument");
  CHECK(std::string(n.error_string(NVML_ERROR_INSUFFICIENT_SIZE)) == "Insufficient Size");
  CHECK(std::string(n.error_string(NVML_ERROR_DRIVER_NOT_LOADED)) == "Driver Not Loaded");
  CHECK(std::string(n.error_string(12345)) == "Unknown Error");
  {
    EnvGuard off(Env{{"FAKECUDA_NVML", "off"}});
    CHECK(n.init() == NVML_ERROR_DRIVER_NOT_LOADED);
    CHECK(n.init_v1() == NVML_ERROR_DRIVER_NOT_LOADED);
    CHECK(n.count(&count) == NVML_ERROR_UNINITIALIZED);
    CHECK(n.shutdown() == NVML_ERROR_UNINITIALIZED);
  }
  // Each nvmlInit needs its nvmlShutdown.
  EnvGuard env(machine_env());
  CHECK(n.init_v1() == NVML_SUCCESS);
  CHECK(n.init() == NVML_SUCCESS);
  CHECK(n.shutdown() == NVML_SUCCESS);
  CHECK(n.count(&count) == NVML_SUCCESS);
  CHECK(count == 2);
  CHECK(n.shutdown() == NVML_SUCCESS);
  CHECK(n.count(&count) == NVML_ERROR_UNINITIALIZED);
}
