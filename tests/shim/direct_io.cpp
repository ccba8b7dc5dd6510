// The two paths of the shim's bulk copies (src/shim/track_copy.h): direct
// (part files mapped and registered, DMA straight to and from them) and
// staging (pinned buffers, write/read), under the preloaded shim against the
// simulated driver: ctest shim.track.direct.
//
// One scenario per environment; in each a creator process (forked before any
// CUDA activity, with the scenario's environment) makes a VMM allocation and
// writes a pattern into it. The test's own process is the coordinator: it
// speaks the control protocol to the shim and never calls the driver.
//   - save into 3 part files handed over write-only, as the coordinator
//     opens them (the direct path reopens them read-write): the files hold
//     the allocation's bytes in the part layout, byte-identical across
//     scenarios; release
//   - auto: a load from truncated parts is refused naming "truncated"
//   - new bytes written into the files; load from read-only descriptors;
//     gate-open: the creator sees the files' bytes
//   - after each request nothing of the part files stays mapped in the
//     creator, and it holds none of their descriptors
//   - the path each copy took ($CUSNAP_SHIM_COPY_LOG): on and auto ->
//     direct, off and unset -> staging, auto with registration of file mappings refused
//     (FAKECUDA_HOST_REGISTER_FILES) -> staging (fell back), auto with the
//     second registration failing -> mixed; on with registration refused:
//     the save fails naming "direct I/O" and leaves nothing behind.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tests/fakecuda/fakecuda_test_util.h"
#include "tests/shim/ckpt_client.h"

using namespace fctest;
using namespace ckpt_client;

namespace {

// 11 granules in 3 parts: 8 MiB, 8 MiB, 6 MiB (part_bytes rounds to 2 MiB);
// 2 MiB windows and 1 MiB staging chunks: several of each per part.
constexpr size_t kSize = 22u << 20;
constexpr size_t kParts = 3;
constexpr size_t kPer = 8u << 20;
constexpr uint64_t kSeedDev = 0x7777;   // creator writes before the save
constexpr uint64_t kSeedFile = 0x8888;  // coordinator writes into the files before the load

enum : uint64_t { kVerify = 1, kFinish = 2 };

/// The creator: a VMM allocation holding pattern kSeedDev; sends its
/// address; on kVerify answers whether it holds kSeedFile (directly and
/// through cuMemcpyDtoH).
int creator(int sock) {
  FC_REQ(init_primary() == CUDA_SUCCESS);
  VmmBuffer a;
  FC_REQ(vmm_create(kSize, &a) == CUDA_SUCCESS);
  auto v = pattern(kSize, kSeedDev);
  FC_REQ(cuMemcpyHtoD(a.ptr, v.data(), kSize) == CUDA_SUCCESS);
  FC_REQ(send_u64(sock, a.ptr));
  for (;;) {
    uint64_t cmd = 0;
    FC_REQ(recv_u64(sock, &cmd));
    if (cmd == kVerify) {
      auto want = pattern(kSize, kSeedFile);
      std::vector<uint8_t> got(kSize);
      bool ok = memcmp(reinterpret_cast<const void*>(a.ptr), want.data(), kSize) == 0 &&
                cuMemcpyDtoH(got.data(), a.ptr, kSize) == CUDA_SUCCESS && got == want;
      FC_REQ(send_u64(sock, ok ? 1 : 0));
    } else if (cmd == kFinish) {
      FC_REQ(vmm_destroy(a) == CUDA_SUCCESS);
      return send_u64(sock, 1) ? 0 : 1;
    } else {
      return 1;
    }
  }
}

/// Mappings (/proc/PID/maps) and descriptors (/proc/PID/fd) of PID that
/// name a part file of this test.
int part_traces(pid_t pid) {
  int n = proc_traces(pid, "memfd:cusnap-part");
  if (n) fprintf(stderr, "process %d still holds %d mapping(s)/descriptor(s) of part files\n",
                 (int)pid, n);
  return n;
}

/// The same file opened again with other access (as the coordinator opens
/// its part files: write-only to save, read-only to load).
UniqueFd reopen(int fd, int flags) {
  return UniqueFd(open(("/proc/self/fd/" + std::to_string(fd)).c_str(), flags | O_CLOEXEC));
}

std::string read_file(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return {};
  std::string s(static_cast<size_t>(st.st_size), '\0');
  if (pread(fd, s.data(), s.size(), 0) != static_cast<ssize_t>(s.size())) return {};
  return s;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

struct Scenario {
  const char* name;
  std::map<std::string, std::string> env;
  const char* save_path;  ///< expected path= of the save; nullptr: the save fails
  const char* load_path;  ///< expected path= of the load
  bool truncated_load = false;
};

/// The bytes of the first good save, to compare the others with.
std::vector<std::string> g_first_files;

/// Gate-open; the creator's allocation holds the files' bytes (restored) or
/// not; it frees everything and exits 0.
bool open_and_finish(Shim& s, Child& c, bool restored) {
  REQB(s.gate_open().ok);
  uint64_t v = 0;
  REQB(send_u64(c.sock, kVerify) && recv_u64(c.sock, &v) && v == (restored ? 1 : 0));
  REQB(send_u64(c.sock, kFinish) && recv_u64(c.sock, &v) && v == 1);
  REQB(c.join() == 0);
  c.pid = -1;
  return true;
}

bool run_scenario(const Scenario& sc) {
  fprintf(stderr, "--- scenario %s\n", sc.name);
  const std::string log = g_dir + "/copy-" + sc.name + ".log";
  std::vector<std::string> set;
  for (auto& [k, v] : sc.env) {
    setenv(k.c_str(), v.c_str(), 1);
    set.push_back(k);
  }
  setenv("CUSNAP_SHIM_COPY_LOG", log.c_str(), 1);
  Child c = spawn(creator);
  for (auto& k : set) unsetenv(k.c_str());
  unsetenv("CUSNAP_SHIM_COPY_LOG");
  struct Reap {
    Child& c;
    ~Reap() { c.kill(); }
  } reap{c};
  REQB(c.pid > 0);
  uint64_t addr = 0;
  REQB(recv_u64(c.sock, &addr));
  Shim s;
  REQB(s.connect(c.pid));
  proto::ShimRecords rec;
  REQB(s.inspect(&rec));
  REQB(rec.allocations.size() == 1);
  const uint64_t id = rec.allocations[0].id;
  REQB(s.gate_close().ok);
  REQB(s.drain().ok);

  // Save, handing the parts over write-only.
  std::vector<UniqueFd> files;
  std::vector<UniqueFd> wr;
  std::vector<int> wfds;
  for (size_t k = 0; k < kParts; ++k) {
    files.emplace_back(memfd_create(("cusnap-part-" + std::to_string(k)).c_str(), MFD_CLOEXEC));
    REQB(files.back());
    wr.push_back(reopen(files.back().get(), O_WRONLY));
    REQB(wr.back());
    wfds.push_back(wr.back().get());
  }
  proto::Done d = s.parts(proto::kMsgShimSave, id, wfds);
  wr.clear();
  REQB(part_traces(c.pid) == 0);
  auto logged = lines_of(log);
  if (!sc.save_path) {
    // The direct path was demanded and refused: an error, nothing behind,
    // and the allocation is not saved (a release leaves it alone).
    REQB(refused_with(d, "direct I/O"));
    REQB(logged.size() == 1 && logged[0].find("save ") == 0 &&
         logged[0].find("result=0") == std::string::npos);
    REQB(s.release("created").ok);
    // The allocation still holds the creator's bytes (not the file's).
    return open_and_finish(s, c, false);
  }
  REQB(d.ok && d.bytes == kSize);
  REQB(logged.size() == 1);
  fprintf(stderr, "  %s\n", logged[0].c_str());
  REQB(logged[0].find("save bytes=" + std::to_string(kSize) + " parts=3 ") == 0);
  REQB(logged[0].find(std::string(" path=") + sc.save_path + " ") != std::string::npos);
  REQB(logged[0].find("result=0") != std::string::npos);
  // The part layout: 8 + 8 + 6 MiB of the pattern, in order.
  auto want = pattern(kSize, kSeedDev);
  std::vector<std::string> saved;
  for (size_t k = 0; k < kParts; ++k) {
    saved.push_back(read_file(files[k].get()));
    size_t len = k + 1 < kParts ? kPer : kSize - k * kPer;
    REQB(saved[k].size() == len);
    REQB(memcmp(saved[k].data(), want.data() + k * kPer, len) == 0);
  }
  if (g_first_files.empty()) g_first_files = saved;
  REQB(saved == g_first_files);  // byte-identical whichever path wrote them
  REQB(s.release("created").ok);

  if (sc.truncated_load) {
    // The last part one page short: refused, naming it; nothing behind.
    std::vector<UniqueFd> shortf;
    std::vector<int> sfds;
    for (size_t k = 0; k < kParts; ++k) {
      shortf.emplace_back(memfd_create(("cusnap-part-short-" + std::to_string(k)).c_str(),
                                       MFD_CLOEXEC));
      REQB(shortf.back());
      size_t len = saved[k].size() - (k + 1 == kParts ? 4096 : 0);
      REQB(write(shortf.back().get(), saved[k].data(), len) == (ssize_t)len);
      sfds.push_back(shortf.back().get());
    }
    REQB(refused_with(s.parts(proto::kMsgShimLoad, id, sfds), "truncated"));
    REQB(part_traces(c.pid) == 0);
  }

  // New bytes in the files; load from read-only descriptors.
  auto fresh = pattern(kSize, kSeedFile);
  std::vector<UniqueFd> rd;
  std::vector<int> rfds;
  for (size_t k = 0; k < kParts; ++k) {
    size_t len = saved[k].size();
    REQB(pwrite(files[k].get(), fresh.data() + k * kPer, len, 0) == (ssize_t)len);
    rd.push_back(reopen(files[k].get(), O_RDONLY));
    REQB(rd.back());
    rfds.push_back(rd.back().get());
  }
  const size_t before = lines_of(log).size();
  d = s.parts(proto::kMsgShimLoad, id, rfds);
  REQB(d.ok && d.bytes == kSize);
  rd.clear();
  REQB(part_traces(c.pid) == 0);
  logged = lines_of(log);
  REQB(logged.size() == before + 1);
  fprintf(stderr, "  %s\n", logged.back().c_str());
  REQB(logged.back().find("load bytes=" + std::to_string(kSize) + " parts=3 ") == 0);
  REQB(logged.back().find(std::string(" path=") + sc.load_path + " ") != std::string::npos);
  REQB(logged.back().find("result=0") != std::string::npos);
  REQB(s.reimport().ok);
  return open_and_finish(s, c, true);
}

int run() {
  const std::map<std::string, std::string> none;
  const Scenario scenarios[] = {
      {"on", {{"CUSNAP_SHIM_DIRECT_IO", "on"}}, "direct", "direct"},
      {"off", {{"CUSNAP_SHIM_DIRECT_IO", "off"}}, "staging", "staging"},
      {"default", none, "staging", "staging"},
      {"auto", {{"CUSNAP_SHIM_DIRECT_IO", "auto"}}, "direct", "direct", true},
      {"auto-refused",
       {{"CUSNAP_SHIM_DIRECT_IO", "auto"}, {"FAKECUDA_HOST_REGISTER_FILES", "refuse"}},
       "staging",
       "staging",
       true},
      // The second registration of each process fails: the save mixes paths;
      // the load (registrations 12.. go through) is direct.
      {"auto-second-fails",
       {{"CUSNAP_SHIM_DIRECT_IO", "auto"}, {"FAKECUDA_FAIL", "cuMemHostRegister:2:2"}},
       "mixed",
       "direct"},
      {"on-refused",
       {{"CUSNAP_SHIM_DIRECT_IO", "on"}, {"FAKECUDA_HOST_REGISTER_FILES", "refuse"}},
       nullptr,
       nullptr},
  };
  for (const Scenario& sc : scenarios) REQ(run_scenario(sc));
  return 0;
}

}  // namespace

int main() {
  // Small windows and chunks, several workers: every copy takes several.
  setenv("CUSNAP_SHIM_DIRECT_MIB", "2", 0);
  setenv("CUSNAP_SHIM_STAGING_MIB", "1", 0);
  setenv("CUSNAP_SHIM_COPY_THREADS", "3", 0);
  return coordinator_main("shim.track.direct", "direct", run);
}
