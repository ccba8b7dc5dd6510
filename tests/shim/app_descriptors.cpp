// The application's own descriptors and loader, under the preloaded shim
// against the simulated driver: ctest shim.track.app. The shim must neither
// change nor stall what the application does:
//   - a forked child closes every descriptor from 3 up (close_range, as
//     daemons and spawn helpers do), opens files of its own (they take the
//     numbers of the shim's sockets), and its first CUDA activity is a
//     resolution: its files stay open (before: the shim's reset of the child
//     closed two of them, by the numbers it had inherited)
//   - the process closes every descriptor from 3 up after tracking started,
//     listens on Unix sockets of its own in the freed numbers, and someone
//     connects to the shim's socket paths: the application accepts every
//     connection of its own clients (before: the shim's listeners, woken,
//     took two of them)
//   - a library loaded by dlopen whose constructor calls the driver while
//     another thread makes the process's first driver call: both finish
//     (before: a deadlock between the shim's loader lock and the dynamic
//     loader's)
//   - cuGetProcAddress_v2 refused by the driver (flags it does not take):
//     the caller's pointer and status stay as the driver leaves them,
//     untouched (before: the shim wrote SUCCESS and NULL)
//   - a thread releases the last handle of an exported allocation, the
//     driver's release taking 2 s (FAKECUDA_DELAY); meanwhile another thread
//     opens a file of its own at the number of the shim's export descriptor
//     (a close-every-descriptor loop followed by an open): the file stays
//     open (before: the shim checked the number before the driver's release
//     and closed it after, closing the application's file)
// Run as one process per case: `shim_app_test CASE`.
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <cuda.h>

namespace {

#define REQ(cond)                                                             \
  do {                                                                        \
    if (!(cond)) {                                                            \
      std::fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond); \
      return 1;                                                               \
    }                                                                         \
  } while (0)

std::string g_dir;  // the runtime directory (the shim's sockets)

void close_from_3() {
  ::syscall(SYS_close_range, 3U, ~0U, 0U);
}

/// n files of the application's, with their identities.
struct OwnFiles {
  int fd[6];
  struct stat st[6];
  bool open_all() {
    for (int i = 0; i < 6; ++i)
      if ((fd[i] = ::open("/proc/self/exe", O_RDONLY)) < 0 || ::fstat(fd[i], &st[i]) != 0)
        return false;
    return true;
  }
  bool intact() const {
    for (int i = 0; i < 6; ++i) {
      struct stat now;
      if (::fstat(fd[i], &now) != 0 || now.st_ino != st[i].st_ino || now.st_dev != st[i].st_dev) {
        std::fprintf(stderr, "the application's descriptor %d was closed behind its back\n", fd[i]);
        return false;
      }
    }
    return true;
  }
};

int fork_child() {
  REQ(cuInit(0) == CUDA_SUCCESS);  // tracking starts: two listening sockets
  const pid_t pid = ::fork();
  REQ(pid >= 0);
  if (pid == 0) {
    close_from_3();
    OwnFiles mine;
    if (!mine.open_all()) ::_exit(2);
    void* fn = nullptr;
    CUdriverProcAddressQueryResult st;
    if (cuGetProcAddress("cuDriverGetVersion", &fn, 12000, 0, &st) != CUDA_SUCCESS) ::_exit(3);
    ::_exit(mine.intact() ? 0 : 1);
  }
  int ws = 0;
  REQ(::waitpid(pid, &ws, 0) == pid);
  REQ(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  return 0;
}

int listen_at(const std::string& path) {
  ::unlink(path.c_str());
  const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  if (s < 0 || ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(s, 16) != 0)
    return -1;
  return s;
}

int connect_to(const std::string& path) {
  const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(s);
    return -1;
  }
  return s;
}

int listeners() {
  REQ(cuInit(0) == CUDA_SUCCESS);
  close_from_3();
  constexpr int kN = 8;
  int ls[kN], cl[kN];
  for (int i = 0; i < kN; ++i) REQ((ls[i] = listen_at(g_dir + "/app" + std::to_string(i))) >= 0);
  for (int i = 0; i < kN; ++i) {
    REQ((cl[i] = connect_to(g_dir + "/app" + std::to_string(i))) >= 0);
    REQ(::write(cl[i], "hello", 5) == 5);
  }
  // A coordinator comes by: a connection to each of the shim's sockets.
  DIR* d = ::opendir(g_dir.c_str());
  REQ(d);
  int woke = 0;
  while (dirent* e = ::readdir(d)) {
    if (std::strncmp(e->d_name, "shim-", 5) != 0) continue;
    const int c = connect_to(g_dir + "/" + e->d_name);
    if (c >= 0) ::close(c);
    ++woke;
  }
  ::closedir(d);
  REQ(woke == 2);
  ::usleep(300 * 1000);  // the shim's listeners had their chance
  for (int i = 0; i < kN; ++i) {
    pollfd p{ls[i], POLLIN, 0};
    if (::poll(&p, 1, 0) != 1) {
      std::fprintf(stderr, "the connection to the application's socket %d was taken\n", ls[i]);
      return 1;
    }
    const int c = ::accept(ls[i], nullptr, nullptr);
    char b[8] = {};
    REQ(c >= 0 && ::read(c, b, 5) == 5 && std::strcmp(b, "hello") == 0);
  }
  return 0;
}

void* first_call(void*) {
  ::usleep(100 * 1000);  // inside the plugin's constructor
  return reinterpret_cast<void*>(static_cast<intptr_t>(cuInit(0)));
}

int loader_race(const char* plugin) {
  pthread_t t;
  REQ(::pthread_create(&t, nullptr, first_call, nullptr) == 0);
  void* h = ::dlopen(plugin, RTLD_NOW);  // its constructor calls the driver, 300 ms in
  if (!h) std::fprintf(stderr, "dlopen: %s\n", ::dlerror());
  REQ(h);
  void* rc = nullptr;
  REQ(::pthread_join(t, &rc) == 0);
  REQ(rc == nullptr);  // CUDA_SUCCESS
  auto* said = reinterpret_cast<int*>(::dlsym(h, "cusnap_test_plugin_result"));
  REQ(said && *said == CUDA_SUCCESS);
  return 0;
}

using GetProcV2 = CUresult (*)(const char*, void**, int, cuuint64_t,
                               CUdriverProcAddressQueryResult*);

int proc_address_refused() {
  REQ(cuInit(0) == CUDA_SUCCESS);
  void* h = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  REQ(h);
  auto v2 = reinterpret_cast<GetProcV2>(::dlsym(h, "cuGetProcAddress_v2"));
  REQ(v2);
  // Flags the driver does not take: refused; it leaves both outputs alone.
  // The status holds a value no enumerator has, as uninitialized memory may:
  // set and read as bytes (a load of it as the enum is undefined).
  void* p = reinterpret_cast<void*>(1);
  CUdriverProcAddressQueryResult st;
  const int marker = 77;
  std::memcpy(&st, &marker, sizeof st);
  REQ(v2("cuDriverGetVersion", &p, 12000, ~0ull, &st) != CUDA_SUCCESS);
  REQ(p == reinterpret_cast<void*>(1));
  int after = 0;
  std::memcpy(&after, &st, sizeof st);
  REQ(after == marker);
  // And a good one still answers with a pointer that works.
  p = nullptr;
  REQ(v2("cuDriverGetVersion", &p, 12000, 0, &st) == CUDA_SUCCESS && p);
  REQ(st == CU_GET_PROC_ADDRESS_SUCCESS);
  int v = 0;
  REQ(reinterpret_cast<CUresult (*)(int*)>(p)(&v) == CUDA_SUCCESS && v > 0);
  return 0;
}

/// The number of the shim's export descriptor of this process's allocation:
/// the highest of the descriptors naming the simulated driver's memory file
/// (the shim keeps its own at high numbers; the driver's is low).
int export_number() {
  const std::string tag = "fakecuda:" + std::to_string(::getpid()) + ":";
  int found = -1;
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return -1;
  while (dirent* e = ::readdir(d)) {
    char target[256];
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
    if (n <= 0) continue;
    target[n] = 0;
    if (std::strstr(target, tag.c_str()) && std::atoi(e->d_name) > found)
      found = std::atoi(e->d_name);
  }
  ::closedir(d);
  return found;
}

void* release_handle(void* h) {
  const auto r = cuMemRelease(static_cast<CUmemGenericAllocationHandle>(
      reinterpret_cast<uintptr_t>(h)));  // 2 s inside the driver
  return reinterpret_cast<void*>(static_cast<intptr_t>(r));
}

int release_export() {
  ::setenv("FAKECUDA_DELAY", "cuMemRelease:2000", 1);
  REQ(cuInit(0) == CUDA_SUCCESS);
  CUcontext ctx = nullptr;
  REQ(cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS && cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle h = 0;
  REQ(cuMemCreate(&h, 2u << 20, &prop, 0) == CUDA_SUCCESS);
  int ticket = -1;
  REQ(cuMemExportToShareableHandle(&ticket, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
      CUDA_SUCCESS);
  ::close(ticket);
  const int number = export_number();
  REQ(number >= 0);
  pthread_t t;
  REQ(::pthread_create(&t, nullptr, release_handle,
                       reinterpret_cast<void*>(static_cast<uintptr_t>(h))) == 0);
  ::usleep(500 * 1000);  // the release is inside the driver
  const int own = ::open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  REQ(own >= 0 && ::dup2(own, number) == number);
  struct stat st;
  REQ(::fstat(number, &st) == 0);
  void* rc = nullptr;
  REQ(::pthread_join(t, &rc) == 0);
  REQ(rc == nullptr);  // CUDA_SUCCESS
  struct stat now;
  if (::fstat(number, &now) != 0 || now.st_dev != st.st_dev || now.st_ino != st.st_ino) {
    std::fprintf(stderr, "the application's descriptor %d was closed behind its back\n", number);
    return 1;
  }
  ::close(number);
  ::close(own);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  char tmpl[] = "/tmp/cusnap-app.XXXXXX";
  if (!::mkdtemp(tmpl)) return 2;
  g_dir = tmpl;
  ::setenv("CUSNAP_RUNTIME_DIR", tmpl, 1);
  ::alarm(30);  // a deadlock fails the test instead of hanging it
  const std::string c = argv[1];
  int rc = 2;
  if (c == "fork")
    rc = fork_child();
  else if (c == "listeners")
    rc = listeners();
  else if (c == "loader" && argc > 2)
    rc = loader_race(argv[2]);
  else if (c == "procaddr")
    rc = proc_address_refused();
  else if (c == "release")
    rc = release_export();
  std::system(("rm -rf '" + g_dir + "'").c_str());
  std::fprintf(stderr, "shim.track.app %s: %s\n", c.c_str(), rc == 0 ? "passed" : "FAILED");
  return rc;
}
