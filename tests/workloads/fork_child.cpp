// cusnap-fork-child: a CUDA process that forks a child which starts CUDA of
// its own after the fork.
//
//   cusnap-fork-child [--mib M] [--interval-ms T] [--exec-child | --idle-child]
//
// The parent initialises the driver, allocates M MiB (default 2; at least
// 1 MiB more than the slots) with cuMemAlloc and fills it with a pattern
// (share_util.h's layout, allocation index 0), then forks. The child calls
// cuInit itself, allocates and fills its own block (index 1). Each then
// loops: verifies its constant pattern, fills a slot with its counter and
// reads it back, prints "parent count N ok" / "child count N ok" (after
// "parent ready pid P" / "child ready pid P"), sleeps T ms (default 100).
// --exec-child: the child re-executes this program before touching the
// driver. Without it the child re-executes only when its cuInit fails
// CUDA_ERROR_NOT_INITIALIZED, as the real driver's does in a child forked from
// a process that initialised it (measured on an H200,
// tests/gpu/probes/fork_after_init.cpp; the simulated driver does the same).
// --idle-child: the child never calls the driver (as a data-loader worker
// forked from a CUDA process): it maps the driver, its state query answers
// CUDA_ERROR_NOT_INITIALIZED; it prints "child idle N" every T ms.
//
// Exit status: 2 a driver call failed, 3 a byte was wrong, 4 the other
// process ended, 64 bad usage.
#include <sys/wait.h>
#include <unistd.h>

#include "share_util.h"

using namespace workload::share;

namespace {

/// Allocates and fills this process's block (index 0 parent, 1 child).
Region make_region(bool child_role, size_t mib) {
  const char* who = child_role ? "cusnap-fork-child child" : "cusnap-fork-child parent";
  workload::init_device(who);
  size_t size = std::max<size_t>(mib << 20, kConstant + (1 << 20));
  CUdeviceptr ptr;
  WL_CHECK(cuMemAlloc(&ptr, size), who);
  Region r(ptr, size, child_role ? 1 : 0, who);
  r.fill();
  return r;
}

[[noreturn]] void loop(Region r, bool child_role, long interval_ms, pid_t child) {
  const char* prefix = child_role ? "child " : "parent ";
  pid_t parent = getppid();
  std::printf("%sready pid %d\n", prefix, int(getpid()));
  for (long count = 1;; ++count) {
    r.verify_constant_all(count);
    r.write_slot(kCreatorSlot, uint32_t(count), false, count);
    std::printf("%scount %ld ok\n", prefix, count);
    if (!child_role && waitpid(child, nullptr, WNOHANG) == child) std::exit(4);
    if (child_role && getppid() != parent) std::exit(4);
    usleep(useconds_t(interval_ms * 1000));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args args(argc, argv, "cusnap-fork-child", {"--exec-child", "--idle-child", "--child-role"},
            {"--mib", "--interval-ms"});
  size_t mib = size_t(args.num("--mib", 2));
  long interval_ms = args.num("--interval-ms", 100);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (args.flag("--child-role")) loop(make_region(true, mib), true, interval_ms, 0);
  // Fork with the driver initialised and memory allocated in the parent.
  Region parent = make_region(false, mib);
  pid_t child = fork();
  if (child < 0) {
    std::perror("cusnap-fork-child: fork");
    return 2;
  }
  if (child > 0) loop(parent, false, interval_ms, child);
  if (args.flag("--idle-child")) {
    const pid_t first_parent = getppid();
    std::printf("child idle ready pid %d\n", int(getpid()));
    for (long count = 1; getppid() == first_parent; ++count) {
      std::printf("child idle %ld\n", count);
      usleep(useconds_t(interval_ms * 1000));
    }
    return 4;
  }
  bool exec_child = args.flag("--exec-child");
  if (!exec_child && cuInit(0) == CUDA_ERROR_NOT_INITIALIZED) {
    std::fprintf(stderr,
                 "cusnap-fork-child child: the driver refuses cuInit after fork; re-executing\n");
    exec_child = true;
  }
  if (exec_child) {
    std::string m = std::to_string(mib), t = std::to_string(interval_ms);
    execl("/proc/self/exe", argv[0], "--child-role", "--mib", m.c_str(), "--interval-ms",
          t.c_str(), static_cast<char*>(nullptr));
    std::perror("cusnap-fork-child: exec");
    return 2;
  }
  loop(make_region(true, mib), true, interval_ms, 0);
}
