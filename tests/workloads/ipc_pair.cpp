// cusnap-ipc-pair: two processes sharing a cuMemAlloc block through legacy
// IPC (cuIpcGetMemHandle / cuIpcOpenMemHandle).
//
//   cusnap-ipc-pair [--mib M] [--interval-ms T]
//
// Forks first (before any driver call). The parent allocates M MiB (default
// 2; at least 1 MiB more than the slots) with cuMemAlloc, fills it (layout
// and checks: share_util.h), and sends cuIpcGetMemHandle's 64 bytes and the
// size to the child over a socketpair. The child opens the handle twice (the
// second open must return the same address) and closes one of the two.
// Every iteration each process verifies the parent's constant pattern,
// fills its own slot with its counter and reads it back, and reads the other
// process's slot (every word may only grow); it prints "creator count N ok"
// and "creator seen S" (the child: "importer ..."), S being the smallest
// counter value of the other process found in the shared bytes, after
// "creator ready pid P" / "importer ready pid P".
//
// Exit status: 2 a driver call failed, 3 a byte was wrong (or the second open
// gave another address), 4 the other process ended, 64 bad usage.
#include <unistd.h>

#include "share_util.h"

using namespace workload::share;

namespace {

struct HandleMsg {
  CUipcMemHandle handle;
  uint64_t size;
};

}  // namespace

int main(int argc, char** argv) {
  Args args(argc, argv, "cusnap-ipc-pair", {}, {"--mib", "--interval-ms"});
  size_t mib = size_t(args.num("--mib", 2));
  long interval_ms = args.num("--interval-ms", 100);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  auto [importer, child, sock] = fork_pair();
  const char* who = importer ? "cusnap-ipc-pair importer" : "cusnap-ipc-pair creator";
  const char* prefix = importer ? "importer " : "creator ";
  workload::init_device(who);

  HandleMsg msg{};
  CUdeviceptr ptr;
  if (importer) {
    if (recv_bytes(sock, &msg, sizeof msg) == -2) {
      std::fprintf(stderr, "%s: no handle from the creator\n", who);
      return 2;
    }
    WL_CHECK(cuIpcOpenMemHandle(&ptr, msg.handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), who);
    CUdeviceptr again;
    WL_CHECK(cuIpcOpenMemHandle(&again, msg.handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), who);
    if (again != ptr) {
      std::fprintf(stderr, "%s: the second open gave 0x%llx, the first 0x%llx\n", who,
                   (unsigned long long)again, (unsigned long long)ptr);
      return 3;
    }
    WL_CHECK(cuIpcCloseMemHandle(again), who);
  } else {
    msg.size = std::max<size_t>(mib << 20, kConstant + (1 << 20));
    WL_CHECK(cuMemAlloc(&ptr, msg.size), who);
    Region(ptr, msg.size, 0, who).fill();
    WL_CHECK(cuIpcGetMemHandle(&msg.handle, ptr), who);
    send_bytes(sock, &msg, sizeof msg);
  }
  close(sock);
  Region r(ptr, msg.size, 0, who);
  pair_loop(r, importer, prefix, child, interval_ms);
}
