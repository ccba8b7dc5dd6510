#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cctype>

#include <filesystem>
#include <fstream>

#include "coord/engine.h"
#include "coord/engine_internal.h"
#include "coord/manifest.h"

using namespace cusnap;
namespace fs = std::filesystem;

namespace {

const char* kUuidA = "GPU-00000000-0000-0000-0000-00000000000a";
const char* kUuidB = "GPU-00000000-0000-0000-0000-00000000000b";
const char* kUuidC = "GPU-00000000-0000-0000-0000-00000000000c";

}  // namespace

TEST_CASE("engine: device plan keeps the same GPU, else the same model, else refuses") {
  using engine_detail::plan_device_pairs;
  std::vector<GpuDevice> recorded = {{0, "H200", kUuidA, 1}, {1, "H200", kUuidB, 1}};
  std::vector<CUcheckpointGpuPair> pairs;
  std::string err;
  // Same devices: no pairs.
  CHECK(plan_device_pairs(recorded, {kUuidA}, recorded, {}, &pairs, &err));
  CHECK(pairs.empty());
  // The used GPU is gone but another H200 is there: paired onto it.
  std::vector<GpuDevice> other = {{0, "H200", kUuidC, 1}};
  REQUIRE(plan_device_pairs(recorded, {kUuidA}, other, {}, &pairs, &err));
  REQUIRE(pairs.size() == 1);
  CHECK(format_gpu_uuid(pairs[0].newUuid) == kUuidC);
  // Another model only: refused, naming the model.
  std::vector<GpuDevice> a100 = {{0, "A100", kUuidC, 1}};
  CHECK_FALSE(plan_device_pairs(recorded, {kUuidA}, a100, {}, &pairs, &err));
  CHECK(err.find("no H200 is available") != std::string::npos);
  // ... without sending the user to --device-map, which cannot change models.
  CHECK(err.find("this machine has A100") != std::string::npos);
  CHECK(err.find("only between GPUs of the same model") != std::string::npos);
  CHECK(err.find("map it with") == std::string::npos);
  // Two H200 used, one here: the other is taken; only more GPUs do.
  CHECK_FALSE(plan_device_pairs(recorded, {kUuidA, kUuidB}, other, {}, &pairs, &err));
  CHECK(err.find("every one is taken") != std::string::npos);
  CHECK(err.find("at least 2 H200 GPUs") != std::string::npos);
  // An explicit map by index.
  REQUIRE(plan_device_pairs(recorded, {kUuidA}, recorded, {{"0", "1"}}, &pairs, &err));
  REQUIRE(pairs.size() == 1);
  CHECK(format_gpu_uuid(pairs[0].oldUuid) == kUuidA);
  CHECK(format_gpu_uuid(pairs[0].newUuid) == kUuidB);
  CHECK_FALSE(plan_device_pairs(recorded, {kUuidA}, a100, {{kUuidA, "0"}}, &pairs, &err));
  CHECK(err.find("same GPU model") != std::string::npos);
}

TEST_CASE("engine: device plan refuses two GPUs sent to one, or one GPU mapped twice") {
  using engine_detail::plan_device_pairs;
  std::vector<GpuDevice> recorded = {{0, "H200", kUuidA, 1}, {1, "H200", kUuidB, 1}};
  std::vector<GpuDevice> present = {
      {0, "H200", kUuidA, 1}, {1, "H200", kUuidB, 1}, {2, "H200", kUuidC, 1}};
  std::vector<CUcheckpointGpuPair> pairs;
  std::string err;
  // Both used GPUs sent to one, named once by index and once by UUID.
  CHECK_FALSE(plan_device_pairs(recorded, {kUuidA, kUuidB}, present, {{"0", "2"}, {kUuidB, kUuidC}},
                                &pairs, &err));
  CHECK(err.find("sends both GPU") != std::string::npos);
  CHECK(err.find(kUuidC) != std::string::npos);
  // A GPU sent onto another the job used, which the map leaves in place (in
  // either order of the used GPUs).
  for (auto used : {std::vector<std::string>{kUuidA, kUuidB}, {kUuidB, kUuidA}}) {
    CHECK_FALSE(plan_device_pairs(recorded, used, present, {{"0", "1"}}, &pairs, &err));
    CHECK(err.find("map that GPU too") != std::string::npos);
  }
  // One GPU mapped twice, by index and by UUID.
  CHECK_FALSE(
      plan_device_pairs(recorded, {kUuidA}, present, {{"0", "2"}, {kUuidA, "1"}}, &pairs, &err));
  CHECK(err.find("twice") != std::string::npos);
  // A swap is fine.
  REQUIRE(plan_device_pairs(recorded, {kUuidA, kUuidB}, present, {{"0", "1"}, {"1", "0"}}, &pairs,
                            &err));
  REQUIRE(pairs.size() == 2);
  CHECK(format_gpu_uuid(pairs[0].newUuid) == kUuidB);
  CHECK(format_gpu_uuid(pairs[1].newUuid) == kUuidA);
  // So is moving one GPU while the other stays, and the model fallback
  // takes only a GPU nobody asked for.
  REQUIRE(plan_device_pairs(recorded, {kUuidA, kUuidB}, present, {{"0", "2"}}, &pairs, &err));
  REQUIRE(pairs.size() == 2);
  CHECK(format_gpu_uuid(pairs[0].newUuid) == kUuidC);
  CHECK(format_gpu_uuid(pairs[1].newUuid) == kUuidB);
}

TEST_CASE("engine: device plan refuses a map entry for a GPU the job did not use") {
  using engine_detail::plan_device_pairs;
  std::vector<GpuDevice> recorded = {{0, "H200", kUuidA, 1}, {1, "H200", kUuidB, 1}};
  std::vector<CUcheckpointGpuPair> pairs;
  std::string err;
  // Recorded (the machine had it) but unused: by index and by UUID.
  for (const std::string& old : {std::string("1"), std::string(kUuidB)}) {
    CAPTURE(old);
    CHECK_FALSE(plan_device_pairs(recorded, {kUuidA}, recorded, {{old, "0"}}, &pairs, &err));
    CHECK(err.find("recorded but its processes did not use") != std::string::npos);
    CHECK(err.find(std::string("used GPU 0 (") + kUuidA + ")") != std::string::npos);
  }
  // Not a GPU of the checkpoint at all.
  CHECK_FALSE(
      plan_device_pairs(recorded, {kUuidA}, recorded, {{"0", "1"}, {"7", "0"}}, &pairs, &err));
  CHECK(err.find("GPU 7 ('7=0'), which the checkpoint does not name") != std::string::npos);
  // The used one, mapped: fine.
  CHECK(plan_device_pairs(recorded, {kUuidA}, recorded, {{"0", "1"}}, &pairs, &err));
}

TEST_CASE("engine: GPU UUID text round trip") {
  CUuuid u;
  REQUIRE(parse_gpu_uuid(kUuidB, &u));
  CHECK(format_gpu_uuid(u) == kUuidB);
  CHECK_FALSE(parse_gpu_uuid("GPU-12", &u));
  // Either case, the prefix as the digits.
  CUuuid lower;
  std::string text = kUuidB;
  for (char& c : text) c = char(std::tolower(static_cast<unsigned char>(c)));
  REQUIRE(parse_gpu_uuid(text, &lower));
  CHECK(format_gpu_uuid(lower) == kUuidB);
  CHECK_FALSE(parse_gpu_uuid("GPX-" + text.substr(4), &u));
}

TEST_CASE("engine: a driver library without the checkpoint API is refused by name") {
  setenv("CUSNAP_LIBCUDA", "libm.so.6", 1);
  Driver d;
  std::string err;
  CHECK_FALSE(d.load(&err));
  CHECK(err.find("libm.so.6") != std::string::npos);
  setenv("CUSNAP_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
  Driver d2;
  CHECK_FALSE(d2.load(&err));
  CHECK(err.find("cannot load the CUDA driver") != std::string::npos);
  unsetenv("CUSNAP_LIBCUDA");
}

namespace {

// A job in its own session with stdout on out_fd, stdin and stderr on /dev/null.
pid_t start_job(const std::vector<std::string>& argv, int out_fd) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    setsid();
    int null_fd = open("/dev/null", O_RDWR);
    dup2(null_fd, 0);
    dup2(null_fd, 2);
    dup2(out_fd, 1);
    for (int fd = 3; fd < 1024; ++fd) close(fd);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

// A CPU-only job: a shell counting into a pipe.
pid_t start_counter(int out_fd) {
  return start_job({"/bin/sh", "-c", "i=0; while :; do i=$((i+1)); echo $i; sleep 0.05; done"},
                   out_fd);
}

// Reads lines until n of them started with prefix ("count " for "count N
// ok"; "" for bare numbers) or timeout; returns the numbers after the prefix
// (fewer on timeout).
std::vector<long> read_numbers(int fd, size_t n, int timeout_ms, const std::string& prefix = "") {
  std::vector<long> out;
  std::string buf;
  while (out.size() < n) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) break;
    char tmp[256];
    ssize_t r = read(fd, tmp, sizeof tmp);
    if (r <= 0) break;
    buf.append(tmp, size_t(r));
    size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      std::string line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      if (line.starts_with(prefix)) out.push_back(std::atol(line.c_str() + prefix.size()));
      if (out.size() == n) break;  // what came with it is not asked for
    }
  }
  return out;
}

// Reads lines "count N ok" until n arrived; returns those n (fewer on timeout).
std::vector<long> read_counts(int fd, size_t n, int timeout_ms) {
  return read_numbers(fd, n, timeout_ms, "count ");
}

// Reaps the given processes (our children, or orphans of them that this
// subreaper adopts) until they are gone; other children are left alone.
void reap(const std::vector<pid_t>& pids) {
  for (int i = 0; i < 1000; ++i) {
    bool any = false;
    for (pid_t pid : pids) {
      waitpid(pid, nullptr, WNOHANG);
      any |= access(("/proc/" + std::to_string(pid)).c_str(), F_OK) == 0;
    }
    if (!any) return;
    usleep(10000);
  }
}

// The pids a checkpoint recorded.
std::vector<pid_t> manifest_pids(const std::string& dir) {
  Manifest m;
  std::string err;
  std::vector<pid_t> pids;
  if (read_manifest(dir, &m, &err))
    for (const auto& p : m.processes) pids.push_back(p.pid);
  return pids;
}

void kill_and_reap(pid_t root) {
  std::vector<pid_t> pids;
  for (const ProcessInfo& pi : list_job_processes(root)) {
    kill(pi.pid, SIGKILL);
    pids.push_back(pi.pid);
  }
  reap(pids);
}

std::string pipe_id(int fd) {
  struct stat st;
  fstat(fd, &st);
  return "pipe:[" + std::to_string(st.st_ino) + "]";
}

bool have_criu() {
  CriuInfo c;
  std::string err;
  return geteuid() == 0 && find_criu(&c, &err, nullptr);
}

/// The suite "root" runs as ctest's unit.root, skipped (not passed) when not
/// root; as root a missing CRIU fails it.
constexpr const char* kNeedsCriu = "needs CRIU >= 4.1 (scripts/install-deps.sh installs it)";

}  // namespace

TEST_CASE("engine: a CPU-only job is checkpointed, stopped, restored twice, and counts on" *
          doctest::test_suite("root")) {
  REQUIRE_MESSAGE(have_criu(), kNeedsCriu);
  REQUIRE(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
  int p[2];
  REQUIRE(pipe2(p, O_CLOEXEC) == 0);
  pid_t job_pid = start_counter(p[1]);
  close(p[1]);
  auto before = read_numbers(p[0], 3, 20000);
  REQUIRE(before.size() == 3);

  char tmpl[] = "/tmp/cusnap-engine-test-XXXXXX";
  std::string base = mkdtemp(tmpl);
  JobInfo job;
  job.name = "counter";
  job.root_pid = job_pid;
  job.argv = {"sh", "-c", "..."};
  job.cwd = "/";
  job.stdout_pipe_id = pipe_id(p[0]);
  CheckpointOptions opts;
  opts.dir = base + "/ckpt";
  CheckpointResult res;
  std::string err;
  std::vector<std::string> phases;
  bool ok = checkpoint_job(
      job, opts, [&](const Progress& pr) { phases.push_back(pr.phase); }, &res, &err);
  INFO(err);
  REQUIRE(ok);
  CHECK(res.job_stopped);
  CHECK(res.bytes > 0);
  CHECK(fs::exists(opts.dir + "/manifest.json"));
  CHECK(std::find(phases.begin(), phases.end(), "dump") != phases.end());
  // The supervisor's part: reap the stopped job so its pids are free.
  int status;
  REQUIRE(waitpid(job_pid, &status, 0) == job_pid);
  CHECK(WIFSIGNALED(status));
  reap(manifest_pids(opts.dir));
  auto drained = read_numbers(p[0], 1000, 300);
  long last = drained.empty() ? before.back() : drained.back();
  close(p[0]);

  CHECK(verify_checkpoint(opts.dir, &err));
  // A second checkpoint into the same directory is refused.
  CheckpointResult res2;
  CHECK_FALSE(checkpoint_job(job, opts, nullptr, &res2, &err));
  CHECK(res2.code == kExitRefused);

  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    int q[2];
    REQUIRE(pipe2(q, O_CLOEXEC) == 0);
    RestoreOptions ro;
    ro.dir = opts.dir;
    ro.stdout_fd = q[1];
    RestoreResult rr;
    bool rok = restore_job(ro, nullptr, &rr, &err);
    INFO(err);
    REQUIRE(rok);
    close(q[1]);
    CHECK(rr.root_pid == job_pid);
    CHECK(rr.job.name == "counter");
    // The watch goes on until the caller has the job guarded.
    REQUIRE(rr.watch);
    const pid_t watch = rr.watch->pid();
    CHECK(watch > 0);
    CHECK(kill(watch, 0) == 0);
    rr.watch->dismiss();
    CHECK(rr.watch->pid() == -1);
    auto after = read_numbers(q[0], 3, 20000);
    REQUIRE(after.size() == 3);
    CHECK(after[0] > 1);
    CHECK(after[0] <= last + 1);
    CHECK(after[1] == after[0] + 1);
    // The supervisor's part: kill the whole tree and reap every process.
    kill_and_reap(rr.root_pid);
    close(q[0]);
  }

  SUBCASE("a corrupted image is refused before anything starts") {
    std::string img;
    for (auto& e : fs::directory_iterator(opts.dir + "/criu"))
      if (e.path().filename().string().starts_with("pages-")) img = e.path();
    REQUIRE(!img.empty());
    {
      int fd = open(img.c_str(), O_WRONLY);
      REQUIRE(fd >= 0);
      REQUIRE(pwrite(fd, "\x5a", 1, 100) == 1);
      close(fd);
    }
    ExitCode code;
    CHECK_FALSE(verify_checkpoint_coded(opts.dir, {}, &code, &err));
    CHECK(code == kExitBadCheckpoint);
    CHECK(err.find("SHA-256") != std::string::npos);
  }
  fs::remove_all(base);
}

TEST_CASE(
    "engine: a CUDA pattern job on the simulated driver: suspend/resume, checkpoint, restore" *
    doctest::test_suite("root")) {
  std::string job_bin = std::string(CUSNAP_BINARY_DIR) + "/bin/cusnap-pattern-job";
  REQUIRE_MESSAGE(have_criu(), kNeedsCriu);
  REQUIRE_MESSAGE(access(job_bin.c_str(), X_OK) == 0, job_bin << " is not built");
  REQUIRE(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
  int p[2];
  REQUIRE(pipe2(p, O_CLOEXEC) == 0);
  pid_t job_pid = start_job({job_bin, "--mib", "8", "--interval-ms", "20"}, p[1]);
  close(p[1]);
  REQUIRE(read_counts(p[0], 3, 20000).size() == 3);
  JobInfo job;
  job.name = "pattern";
  job.root_pid = job_pid;
  job.argv = {job_bin};
  job.stdout_pipe_id = pipe_id(p[0]);
  std::string err;

  auto procs = list_job_processes(job_pid);
  REQUIRE(procs.size() == 1);
  CHECK(procs[0].uses_cuda);
  CHECK(procs[0].cuda_state == "running");

  SuspendResult sres;
  bool sok = suspend_job_coded(job, std::chrono::seconds(10), {}, &sres, &err);
  INFO(err);
  REQUIRE(sok);
  CHECK(list_job_processes(job_pid)[0].cuda_state == "checkpointed");
  // Suspended: a checkpoint is refused, nothing changes.
  CheckpointOptions opts;
  char tmpl[] = "/tmp/cusnap-engine-test-XXXXXX";
  std::string base = mkdtemp(tmpl);
  opts.dir = base + "/ckpt";
  CheckpointResult res;
  CHECK_FALSE(checkpoint_job(job, opts, nullptr, &res, &err));
  CHECK(res.code == kExitRefused);
  CHECK(err.find("suspended") != std::string::npos);
  CHECK_FALSE(fs::exists(opts.dir));
  ExitCode code;
  REQUIRE(resume_job_coded(job, std::chrono::seconds(10), {}, &code, &err));
  CHECK(list_job_processes(job_pid)[0].cuda_state == "running");
  REQUIRE(read_counts(p[0], 2, 20000).size() == 2);

  // Checkpoint with leave_running: the job goes on.
  opts.leave_running = true;
  bool cok = checkpoint_job(job, opts, nullptr, &res, &err);
  INFO(err);
  REQUIRE(cok);
  CHECK_FALSE(res.job_stopped);
  REQUIRE(read_counts(p[0], 2, 20000).size() == 2);
  fs::remove_all(opts.dir);

  // Checkpoint and stop, then restore.
  opts.leave_running = false;
  cok = checkpoint_job(job, opts, nullptr, &res, &err);
  INFO(err);
  REQUIRE(cok);
  Manifest m;
  REQUIRE(read_manifest(opts.dir, &m, &err));
  REQUIRE(m.processes.size() == 1);
  CHECK(m.processes[0].uses_cuda);
  CHECK(!m.processes[0].gpus.empty());
  CHECK(m.driver_version > 0);
  int status;
  REQUIRE(waitpid(job_pid, &status, 0) == job_pid);
  auto drained = read_counts(p[0], 100000, 300);
  close(p[0]);

  int q[2];
  REQUIRE(pipe2(q, O_CLOEXEC) == 0);
  RestoreOptions ro;
  ro.dir = opts.dir;
  ro.stdout_fd = q[1];
  RestoreResult rr;
  bool rok = restore_job(ro, nullptr, &rr, &err);
  INFO(err);
  REQUIRE(rok);
  close(q[1]);
  auto after = read_counts(q[0], 3, 20000);
  REQUIRE(after.size() == 3);
  if (!drained.empty()) CHECK(after[0] == drained.back() + 1);
  CHECK(list_job_processes(rr.root_pid)[0].cuda_state == "running");
  kill_and_reap(rr.root_pid);
  close(q[0]);
  fs::remove_all(base);
}

TEST_CASE("engine: two processes with private memory each; shared memory is refused" *
          doctest::test_suite("root")) {
  std::string bin = std::string(CUSNAP_BINARY_DIR) + "/bin/";
  REQUIRE_MESSAGE(have_criu(), kNeedsCriu);
  REQUIRE_MESSAGE(access((bin + "cusnap-share-job").c_str(), X_OK) == 0,
                  bin << "cusnap-share-job is not built");
  REQUIRE(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
  char tmpl[] = "/tmp/cusnap-engine-test-XXXXXX";
  std::string base = mkdtemp(tmpl);
  std::string err;

  SUBCASE("shared") {
    int p[2];
    REQUIRE(pipe2(p, O_CLOEXEC) == 0);
    pid_t pid = start_job({bin + "cusnap-share-job", "--interval-ms", "20"}, p[1]);
    close(p[1]);
    REQUIRE(read_counts(p[0], 2, 20000).size() == 2);
    JobInfo job;
    job.name = "share";
    job.root_pid = pid;
    CheckpointOptions opts;
    opts.dir = base + "/ckpt";
    CheckpointResult res;
    CHECK_FALSE(checkpoint_job(job, opts, nullptr, &res, &err));
    CHECK(res.code == kExitRefused);
    CHECK(err.find("shares device memory between processes") != std::string::npos);
    CHECK(err.find("shim") != std::string::npos);
    CHECK_FALSE(fs::exists(opts.dir));
    SuspendResult sres;
    CHECK_FALSE(suspend_job_coded(job, std::chrono::seconds(5), {}, &sres, &err));
    CHECK(sres.code == kExitRefused);
    for (const ProcessInfo& pi : list_job_processes(pid)) CHECK(pi.cuda_state == "running");
    REQUIRE(read_counts(p[0], 2, 20000).size() == 2);
    kill_and_reap(pid);
    close(p[0]);
  }
  SUBCASE("private") {
    int p[2];
    REQUIRE(pipe2(p, O_CLOEXEC) == 0);
    pid_t pid = start_job(
        {bin + "cusnap-pattern-job", "--mib", "4", "--children", "1", "--interval-ms", "20"}, p[1]);
    close(p[1]);
    REQUIRE(read_counts(p[0], 2, 20000).size() == 2);
    JobInfo job;
    job.name = "two";
    job.root_pid = pid;
    job.stdout_pipe_id = pipe_id(p[0]);
    CheckpointOptions opts;
    opts.dir = base + "/ckpt";
    CheckpointResult res;
    bool ok = checkpoint_job(job, opts, nullptr, &res, &err);
    INFO(err);
    REQUIRE(ok);
    Manifest m;
    REQUIRE(read_manifest(opts.dir, &m, &err));
    REQUIRE(m.processes.size() == 2);
    CHECK(m.processes[0].uses_cuda);
    CHECK(m.processes[1].uses_cuda);
    reap(manifest_pids(opts.dir));
    close(p[0]);
    int q[2];
    REQUIRE(pipe2(q, O_CLOEXEC) == 0);
    RestoreOptions ro;
    ro.dir = opts.dir;
    ro.stdout_fd = q[1];
    RestoreResult rr;
    bool rok = restore_job(ro, nullptr, &rr, &err);
    INFO(err);
    REQUIRE(rok);
    close(q[1]);
    REQUIRE(read_counts(q[0], 3, 20000).size() == 3);
    auto procs = list_job_processes(rr.root_pid);
    REQUIRE(procs.size() == 2);
    for (const ProcessInfo& pi : procs) CHECK(pi.cuda_state == "running");
    kill_and_reap(rr.root_pid);
    close(q[0]);
  }
  fs::remove_all(base);
}

TEST_CASE("engine: a driver call that never returns is given up after the deadline") {
  std::string lib = std::string(CUSNAP_BINARY_DIR) + "/lib/libcusnap_stuck_driver.so";
  REQUIRE_MESSAGE(access(lib.c_str(), R_OK) == 0, lib << " is not built (cusnap_workloads)");
  setenv("CUSNAP_LIBCUDA", lib.c_str(), 1);
  Driver d;
  std::string err;
  REQUIRE(d.load(&err));
  unsetenv("CUSNAP_LIBCUDA");
  d.set_call_deadline(std::chrono::milliseconds(200));
  auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(d.checkpoint(12345, &err));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK(err.find("cuCheckpointProcessCheckpoint of process 12345 did not return") !=
        std::string::npos);
  CUprocessState st = CU_PROCESS_STATE_LOCKED;
  CHECK(d.get_state(12345, &st, &err));
  CHECK(st == CU_PROCESS_STATE_RUNNING);
  // The state call is bounded as well: a roll back asks it of a process
  // whose checkpoint call is stuck.
  t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(d.get_state(23456, &st, &err));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK(err.find("cuCheckpointProcessGetState of process 23456 did not return within 200 ms") !=
        std::string::npos);
  // Before an operation sets a deadline (ps, inspect, an operation's first
  // look), the control timeout bounds the state call.
  setenv("CUSNAP_LIBCUDA", lib.c_str(), 1);
  Driver fresh;
  REQUIRE(fresh.load(&err));
  unsetenv("CUSNAP_LIBCUDA");
  setenv("CUSNAP_CONTROL_TIMEOUT", "0.3", 1);
  t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(fresh.get_state(23456, &st, &err));
  unsetenv("CUSNAP_CONTROL_TIMEOUT");
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK(err.find("did not return within 300 ms") != std::string::npos);
  // The state, lock and unlock calls move no memory: an operation bounds
  // them by its timeout plus the control timeout, not by the long deadline
  // of the checkpoint and restore calls (the machine's memory at 0.5 GB/s,
  // some 38 minutes on eight 141 GB GPUs).
  setenv("CUSNAP_CONTROL_TIMEOUT", "0.1", 1);
  std::vector<GpuDevice> eight(8);
  for (GpuDevice& g : eight) g.total_mem = uint64_t(141) << 30;
  CHECK(engine_detail::driver_deadline(std::chrono::milliseconds(200), eight) >
        std::chrono::minutes(30));
  engine_detail::set_driver_deadlines(fresh, std::chrono::milliseconds(200), eight);
  unsetenv("CUSNAP_CONTROL_TIMEOUT");
  t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(fresh.get_state(23456, &st, &err));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK(err.find("did not return within 300 ms") != std::string::npos);
}

TEST_CASE("engine: stale temporary directories of a killed checkpoint or restore are swept") {
  namespace fs = std::filesystem;
  char tmpl[] = "/tmp/cusnap-sweep-XXXXXX";
  REQUIRE(::mkdtemp(tmpl));
  const std::string base = tmpl;
  const pid_t gone = ::fork();  // a pid whose process is gone
  REQUIRE(gone >= 0);
  if (gone == 0) ::_exit(0);
  REQUIRE(::waitpid(gone, nullptr, 0) == gone);
  const std::string dead = std::to_string(gone), live = std::to_string(::getpid());
  auto make = [&](const std::string& name, bool old) {
    const std::string p = base + "/" + name;
    REQUIRE(::mkdir(p.c_str(), 0700) == 0);
    std::ofstream(p + "/restore.log") << "log";
    if (old) {
      const timespec t[2] = {{::time(nullptr) - 3600, 0}, {::time(nullptr) - 3600, 0}};
      REQUIRE(::utimensat(AT_FDCWD, p.c_str(), t, 0) == 0);
    }
  };
  make("cusnap-restore-" + dead + "-Ab12Cd", true);    // swept
  make("cusnap-noplugins-" + dead + "-Ab12Cd", true);  // swept
  make("cusnap-dump-" + live + "-Ab12Cd", true);       // its maker lives
  make("cusnap-dump-" + dead + "-Ef34Gh", false);      // too recent
  make("cusnap-restore-Ab12Cd", true);                 // no pid: another version's
  make("cusnap-restore-" + dead + "-Ab12Cd-x", true);  // not one of ours
  make("other-" + dead + "-Ab12Cd", true);
  make("cusnap-restore-" + dead + "-Kp12Kp", false);  // kept by a failure for its files
  std::ofstream(base + "/cusnap-restore-" + dead + "-Kp12Kp/" + engine_detail::kTempKeptMarker);
  {
    const timespec t[2] = {{::time(nullptr) - 3600, 0}, {::time(nullptr) - 3600, 0}};
    REQUIRE(::utimensat(AT_FDCWD, (base + "/cusnap-restore-" + dead + "-Kp12Kp").c_str(), t, 0) ==
            0);
  }
  CHECK(engine_detail::sweep_stale_temp_dirs(base, std::chrono::seconds(600)) == 2);
  CHECK(fs::exists(base + "/cusnap-restore-" + dead + "-Kp12Kp/restore.log"));
  CHECK_FALSE(fs::exists(base + "/cusnap-restore-" + dead + "-Ab12Cd"));
  CHECK_FALSE(fs::exists(base + "/cusnap-noplugins-" + dead + "-Ab12Cd"));
  CHECK(fs::exists(base + "/cusnap-dump-" + live + "-Ab12Cd"));
  CHECK(fs::exists(base + "/cusnap-dump-" + dead + "-Ef34Gh"));
  CHECK(fs::exists(base + "/cusnap-restore-Ab12Cd"));
  CHECK(fs::exists(base + "/cusnap-restore-" + dead + "-Ab12Cd-x"));
  CHECK(fs::exists(base + "/other-" + dead + "-Ab12Cd"));
  // A link named like one is not followed, nor removed.
  fs::create_directory_symlink(base + "/other-" + dead + "-Ab12Cd",
                               base + "/cusnap-dump-" + dead + "-Zz99Zz");
  CHECK(engine_detail::sweep_stale_temp_dirs(base, std::chrono::seconds(0)) ==
        1);  // the recent one
  CHECK(fs::exists(base + "/other-" + dead + "-Ab12Cd/restore.log"));
  CHECK(fs::is_symlink(base + "/cusnap-dump-" + dead + "-Zz99Zz"));
  fs::remove_all(base);
}
