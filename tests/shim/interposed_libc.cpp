// The shim when C library calls it makes are slow or fail, under the
// preloaded shim against the simulated driver: ctest
// shim.track.interposed_libc. This program defines close and pthread_create
// itself (exported: the shim's calls reach them first), slowed or failed only
// where a workload asks for it.
//   - the close of a regular file that came with a request (a part file of a
//     save) takes 1.5 s, as on NFS or FUSE when a close writes the file's
//     pages back: a fork of the workload meanwhile is not held up (before:
//     the listener closed it holding the lock that the fork's prepare
//     handler takes, and the fork waited for the whole close)
//   - no thread for the control listener (pthread_create fails for the
//     shim's second thread, after the peer listener's started): neither of
//     the shim's sockets stays bound, the workload holds no socket of the
//     shim's, the peer listener ends, and its driver calls work, untracked
//     (before: both sockets stayed bound and open with nothing accepting on
//     the control one, so a coordinator waited out its timeout there)
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/fakecuda/fakecuda_test_util.h"
#include "tests/shim/ckpt_client.h"
#include "tests/shim/workload_cmds.h"

using namespace fctest;
using namespace ckpt_client;
using cmds::command;
using cmds::ms_since;
using Clock = std::chrono::steady_clock;

namespace {

/// The name of the file whose close is slowed (in the runtime directory).
constexpr const char* kSlowName = "slow-close.part";
constexpr long kSlowCloseMs = 1500;

std::atomic<bool> g_slow_close{false};     // armed: the next close of kSlowName is slow
std::atomic<bool> g_close_started{false};  // that close has begun
std::atomic<int> g_fail_shim_thread{0};    // the shim's thread to refuse (1: its first), 0: none
std::atomic<int> g_shim_threads{0};

bool names_slow_file(int fd) {
  char link[64], target[512];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, target, sizeof target - 1);
  if (n <= 0) return false;
  target[n] = 0;
  return strstr(target, kSlowName) != nullptr;
}

bool in_shim(void* fn) {
  Dl_info info{};
  return dladdr(fn, &info) != 0 && info.dli_fname && strstr(info.dli_fname, "cusnap_shim");
}

}  // namespace

extern "C" int close(int fd) {
  if (g_slow_close.load() && names_slow_file(fd)) {
    g_slow_close = false;
    g_close_started = true;
    struct timespec ts {
      kSlowCloseMs / 1000, (kSlowCloseMs % 1000) * 1000 * 1000
    };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
  }
  return static_cast<int>(syscall(SYS_close, fd));
}

extern "C" int pthread_create(pthread_t* t, const pthread_attr_t* attr, void* (*fn)(void*),
                              void* arg) {
  using Fn = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_create"));
  if (!real) return ENOSYS;
  const int fail = g_fail_shim_thread.load();
  if (fail > 0 && in_shim(reinterpret_cast<void*>(fn)) && ++g_shim_threads == fail) return EAGAIN;
  return real(t, attr, fn, arg);
}

namespace {

enum Cmd : uint64_t {
  kInit = 1,       // context (the shim starts its listeners)
  kArmSlowClose,   // the next close of kSlowName is slow; a thread forks once it began
  kForkMs,         // joins that thread; replies the ms its fork took (~0: no slow close came)
  kFailCtlThread,  // (before kInit) the shim's second thread, the control listener's, fails
  kDriver,         // replies 1 when an allocation and its free succeed
};

pthread_t g_forker{};
uint64_t g_fork_ms = ~0ull;

void* forker(void*) {
  const auto t0 = Clock::now();
  while (!g_close_started.load()) {
    if (ms_since(t0) > 5000) return nullptr;
    usleep(1000);
  }
  usleep(20000);  // well inside the close
  const auto f0 = Clock::now();
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  g_fork_ms = static_cast<uint64_t>(ms_since(f0));
  if (pid > 0) waitpid(pid, nullptr, 0);
  return nullptr;
}

int act(uint64_t cmd, uint64_t* value) {
  switch (cmd) {
    case kInit:
      FC_REQ(init_primary() == CUDA_SUCCESS);
      return 0;
    case kArmSlowClose:
      g_slow_close = true;
      FC_REQ(pthread_create(&g_forker, nullptr, forker, nullptr) == 0);
      return 0;
    case kForkMs:
      FC_REQ(pthread_join(g_forker, nullptr) == 0);
      *value = g_fork_ms;
      return 0;
    case kFailCtlThread:
      g_fail_shim_thread = 2;
      return 0;
    case kDriver: {
      CUdeviceptr p = 0;
      *value = cuMemAlloc(&p, 1 << 20) == CUDA_SUCCESS && cuMemFree(p) == CUDA_SUCCESS ? 1 : 0;
      return 0;
    }
    default:
      return 1;
  }
}

int workload(int sock) {
  return cmds::serve(sock, act);
}

Child g_job, g_nothread;
int g_tracked_threads = 0;  // of a workload whose shim started both listeners

/// How many of pid's descriptors are sockets bound to one of paths
/// (/proc/net/unix names each socket's inode and address).
int shim_sockets_held(pid_t pid, const std::vector<std::string>& paths) {
  std::set<std::string> inodes;
  std::ifstream unix_table("/proc/net/unix");
  for (std::string line; std::getline(unix_table, line);) {
    std::istringstream in(line);
    std::string field, inode, path;
    for (int i = 0; i < 6 && in >> field; ++i) {
    }
    if (!(in >> inode >> path)) continue;  // the 7th field, then the address
    if (std::find(paths.begin(), paths.end(), path) != paths.end()) inodes.insert(inode);
  }
  int n = 0;
  for (auto& [fd, target] : cmds::descriptors_of(pid))
    n += target.rfind("socket:[", 0) == 0 && inodes.count(target.substr(8, target.size() - 9)) > 0;
  return n;
}

/// pid's threads.
int threads_of(pid_t pid) {
  int n = 0;
  if (DIR* d = opendir(("/proc/" + std::to_string(pid) + "/task").c_str())) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

/// A save whose part file's close is slow: the workload's fork meanwhile is not held up.
int slow_close() {
  g_job = spawn(workload);
  REQ(g_job.pid > 0);
  REQ(command(g_job, kInit));
  g_tracked_threads = threads_of(g_job.pid);  // the shim's two listeners among them
  REQ(command(g_job, kArmSlowClose));
  const std::string path = g_dir + "/" + kSlowName;
  UniqueFd f(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  REQ(f);
  Shim c;
  REQ(c.connect(g_job.pid));
  // Refused (the gate is open): the file that came with it is closed all the same.
  REQ(refused_with(c.save(1, f.get()), "the gate is open"));
  uint64_t fork_ms = ~0ull;
  REQ(command(g_job, kForkMs, &fork_ms));
  fprintf(stderr, "a fork of the workload while the shim closes a part file for %ld ms: %lld ms\n",
          kSlowCloseMs, (long long)fork_ms);
  REQ(fork_ms != ~0ull);  // the slow close came, and the fork with it
  REQ(fork_ms < 1000);    // not held for the close's 1.5 s
  proto::ShimRecords r;
  REQ(c.inspect(&r));  // and the listener goes on
  REQ(cmds::finish(g_job));
  return 0;
}

/// The shim's control listener gets no thread: it starts nothing.
int no_listener_thread() {
  g_nothread = spawn(workload);
  REQ(g_nothread.pid > 0);
  REQ(command(g_nothread, kFailCtlThread));
  REQ(command(g_nothread, kInit));
  const std::string ctl = proto::shim_control_socket(g_dir, g_nothread.pid);
  const std::string peer = proto::shim_peer_socket(g_dir, g_nothread.pid);
  const bool ctl_bound = access(ctl.c_str(), F_OK) == 0;
  const bool peer_bound = access(peer.c_str(), F_OK) == 0;
  const int held = shim_sockets_held(g_nothread.pid, {ctl, peer});
  // The peer listener, which had started, ends.
  const auto t0 = Clock::now();
  int threads = threads_of(g_nothread.pid);
  for (; threads > g_tracked_threads - 2 && ms_since(t0) < 5000; usleep(10000))
    threads = threads_of(g_nothread.pid);
  fprintf(stderr,
          "no thread for the control listener: control socket %s, peer socket %s, %d of the "
          "shim's sockets held, %d threads (%d with both listeners)\n",
          ctl_bound ? "bound" : "gone", peer_bound ? "bound" : "gone", held, threads,
          g_tracked_threads);
  REQ(!ctl_bound && !peer_bound);
  REQ(held == 0);
  REQ(g_tracked_threads > 2 && threads == g_tracked_threads - 2);
  uint64_t ok = 0;
  REQ(command(g_nothread, kDriver, &ok) && ok == 1);
  REQ(cmds::finish(g_nothread));
  return 0;
}

int run() {
  REQ(slow_close() == 0);
  REQ(no_listener_thread() == 0);
  return 0;
}

}  // namespace

int main() {
  return coordinator_main("shim.track.interposed_libc", "libc", run, [] {
    g_job.kill();
    g_nothread.kill();
  });
}
