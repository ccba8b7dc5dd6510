// cuinit_descriptors.cpp: how many descriptors below the soft RLIMIT_NOFILE does the real driver's
// cuInit need? For each K, a fresh process (its parent never called the
// driver) loads libcuda, lowers its soft limit so that exactly K descriptors
// can still be opened, and calls cuInit; then, with the limit raised again,
// cuInit once more in the same process, and in a child forked after the failure.
#include <dirent.h>
#include <dlfcn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>

typedef int (*init_t)(unsigned);
typedef int (*count_t)(int*);
typedef int (*ver_t)(int*);
static init_t cuInit;
static count_t cuDeviceGetCount;
static ver_t cuDriverGetVersion;

static std::set<int> fds() {
  std::set<int> s;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return s;
  int self = dirfd(d);
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') {
      int f = atoi(e->d_name);
      if (f != self) s.insert(f);
    }
  closedir(d);
  return s;
}
static std::string kinds() {
  std::string out;
  char p[64], b[256];
  for (int f : fds()) {
    snprintf(p, sizeof p, "/proc/self/fd/%d", f);
    ssize_t n = readlink(p, b, sizeof b - 1);
    if (n < 0) continue;
    b[n] = 0;
    out += std::to_string(f) + "=" + b + " ";
  }
  return out;
}
int main(int argc, char** argv) {
  int lo = argc > 1 ? atoi(argv[1]) : 0, hi = argc > 2 ? atoi(argv[2]) : 40;
  for (int k = lo; k <= hi; ++k) {
    fflush(stdout);
    pid_t c = fork();
    if (c == 0) {
      void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
      if (!h) {
        printf("dlopen: %s\n", dlerror());
        _exit(1);
      }
      cuInit = (init_t)dlsym(h, "cuInit");
      cuDeviceGetCount = (count_t)dlsym(h, "cuDeviceGetCount");
      cuDriverGetVersion = (ver_t)dlsym(h, "cuDriverGetVersion");
      std::set<int> open = fds();
      rlimit old;
      getrlimit(RLIMIT_NOFILE, &old);
      rlim_t L = 0;
      int freec = 0;
      for (L = 0;; ++L) {
        freec = (int)L -
                (int)std::count_if(open.begin(), open.end(), [&](int f) { return (rlim_t)f < L; });
        if (freec == k + 1) break;
      }
      --L;  // the largest limit with K free
      rlimit low = old;
      low.rlim_cur = L;
      setrlimit(RLIMIT_NOFILE, &low);
      int r = cuInit(0);
      int n = -1, rc = cuDeviceGetCount(&n), v = 0, rv = cuDriverGetVersion(&v);
      setrlimit(RLIMIT_NOFILE, &old);
      std::set<int> now = fds();
      int held = (int)now.size() - (int)open.size();
      printf(
          "free %2d (open %zu, limit %lu): cuInit %d, then cuDeviceGetCount %d (%d), "
          "cuDriverGetVersion %d (%d); descriptors held after: %d",
          k, open.size(), (unsigned long)L, r, rc, n, rv, v, held);
      if (r != 0) {
        fflush(stdout);
        pid_t g = fork();
        if (g == 0) {
          int r3 = cuInit(0), n3 = -1, c3 = cuDeviceGetCount(&n3);
          printf(
              "\n   child forked after the failure, limit raised: cuInit %d, cuDeviceGetCount %d "
              "(%d)",
              r3, c3, n3);
          fflush(stdout);
          _exit(0);
        }
        waitpid(g, nullptr, 0);
        int r2 = cuInit(0), n2 = -1, c2 = cuDeviceGetCount(&n2);
        printf("\n   same process, limit raised: cuInit %d, cuDeviceGetCount %d (%d)", r2, c2, n2);
      }
      if (r == 0 && k == hi) {
        // initialised: with no descriptor left at all, cuInit again
        std::set<int> o2 = fds();
        rlim_t L2 = 0;
        for (L2 = 0;; ++L2)
          if ((int)L2 -
                  (int)std::count_if(o2.begin(), o2.end(), [&](int f) { return (rlim_t)f < L2; }) ==
              1)
            break;
        rlimit z = old;
        z.rlim_cur = L2 - 1;
        setrlimit(RLIMIT_NOFILE, &z);
        int r4 = cuInit(0), n4 = -1, c4 = cuDeviceGetCount(&n4);
        setrlimit(RLIMIT_NOFILE, &old);
        printf("\n   initialised, then no descriptor left: cuInit %d, cuDeviceGetCount %d (%d)", r4,
               c4, n4);
      }
      if (k == hi || (r == 0 && k == lo)) printf("\n   descriptors after: %s", kinds().c_str());
      printf("\n");
      fflush(stdout);
      _exit(0);
    }
    int st;
    waitpid(c, &st, 0);
  }
}
