// context_ipc.cpp: whether a legacy IPC open (cuIpcOpenMemHandle) goes with
// the context it was made in, as the context's cuMemAlloc blocks do
// (context_blocks.cpp). A child (forked before cuInit) fills a 64 MiB
// cuMemAlloc block with 7s and exports it; the parent opens it in a created
// context and destroys that context, then opens it in the primary context and
// resets that (cudaDeviceReset); after each, it asks the driver about the
// opened address (pointer attribute, address range), closes it, and opens it
// again. Last, with a created context alive and holding an open of the
// handle, it opens the same handle twice in that context (the driver counts
// the opens and returns one address) and once in the primary context (the
// driver documents that an exporting process's handles may be opened by one
// context per device). Run on the driver alone and under `cusnap
// launch` (where the shim serves the block and the open), and by scripts/gpu-test-shim.sh with and
// without the shim (the output must be the same).
// Build: g++ -O1 -o context_ipc context_ipc.cpp -I$CUDA/include -L$CUDA/lib64/stubs -lcuda
#include <cuda.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "probe_util.h"

static const size_t kBytes = size_t(64) << 20;

static int child(int to_parent, int from_parent) {
  if (!init_primary()) return 1;
  CUdeviceptr a = 0;
  CUipcMemHandle h{};
  if (cuMemAlloc(&a, kBytes) != CUDA_SUCCESS || cuMemsetD8(a, 7, kBytes) != CUDA_SUCCESS ||
      cuCtxSynchronize() != CUDA_SUCCESS || cuIpcGetMemHandle(&h, a) != CUDA_SUCCESS)
    return 1;
  if (write(to_parent, &h, sizeof(h)) != sizeof(h)) return 1;
  char go;
  if (read(from_parent, &go, 1) != 1) return 1;
  std::printf("exporter: cuMemFree of the block at the end: %s\n", name(cuMemFree(a)));
  std::fflush(stdout);  // the child ends with _exit
  return 0;
}

/// What the driver says of the opened address p after its context went.
static void after(const char* what, CUdeviceptr p, CUipcMemHandle h) {
  CUcontext c = nullptr;
  CUdeviceptr base = 0;
  size_t size = 0;
  std::printf("   after %s: CONTEXT of it %s", what,
              name(cuPointerGetAttribute(&c, CU_POINTER_ATTRIBUTE_CONTEXT, p)));
  std::printf(", cuMemGetAddressRange %s", name(cuMemGetAddressRange(&base, &size, p)));
  std::printf(", cuIpcCloseMemHandle %s\n", name(cuIpcCloseMemHandle(p)));
  CUdeviceptr q = 0;
  const CUresult r = cuIpcOpenMemHandle(&q, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  unsigned char byte = 0;
  std::printf("   open again: %s", name(r));
  if (r == CUDA_SUCCESS) {
    const CUresult copied = cuMemcpyDtoH(&byte, q, 1);
    std::printf(", first byte %s %d", name(copied), byte);
    std::printf(", close %s", name(cuIpcCloseMemHandle(q)));
  }
  std::printf("\n");
}

int main() {
  int up[2], down[2];
  if (pipe(up) != 0 || pipe(down) != 0) return 1;
  const pid_t pid = fork();
  if (pid == 0) _exit(child(up[1], down[0]));
  CUipcMemHandle h{};
  if (read(up[0], &h, sizeof(h)) != sizeof(h)) return 1;
  if (cuInit(0) != CUDA_SUCCESS) return 1;
  CUdevice dev;
  cuDeviceGet(&dev, 0);
  CUcontext own = nullptr, primary = nullptr;
  cuDevicePrimaryCtxRetain(&primary, dev);
  cuCtxCreate(&own, nullptr, 0, dev);
  CUdeviceptr p = 0;
  unsigned char byte = 0;
  std::printf("created context: open %s",
              name(cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)));
  CUresult copied = cuMemcpyDtoH(&byte, p, 1);
  std::printf(", first byte %s %d", name(copied), byte);
  std::printf(", cuCtxDestroy %s\n", name(cuCtxDestroy(own)));
  cuCtxSetCurrent(primary);
  after("the destroy", p, h);

  CUdeviceptr p2 = 0;
  std::printf("primary context: open %s",
              name(cuIpcOpenMemHandle(&p2, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)));
  byte = 0;
  copied = cuMemcpyDtoH(&byte, p2, 1);
  std::printf(", first byte %s %d", name(copied), byte);
  std::printf(", cuDevicePrimaryCtxReset %s\n", name(cuDevicePrimaryCtxReset(dev)));
  cuDevicePrimaryCtxRetain(&primary, dev);
  cuCtxSetCurrent(primary);
  after("the reset", p2, h);

  // One handle, two contexts of the same device, both alive.
  CUcontext a = nullptr;
  cuCtxCreate(&a, nullptr, 0, dev);
  CUdeviceptr x = 0, y = 0, z = 0;
  std::printf("two contexts: open in a created context %s",
              name(cuIpcOpenMemHandle(&x, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)));
  const CUresult again = cuIpcOpenMemHandle(&y, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  std::printf(", again there %s (%s address)\n", name(again),
              again != CUDA_SUCCESS ? "no"
              : y == x              ? "the same"
                                    : "another");
  cuCtxSetCurrent(primary);
  const CUresult other = cuIpcOpenMemHandle(&z, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  std::printf("   open in the primary context %s (%s address)", name(other),
              other != CUDA_SUCCESS ? "no"
              : z == x              ? "the same"
                                    : "another");
  if (other == CUDA_SUCCESS) {
    byte = 0;
    copied = cuMemcpyDtoH(&byte, z, 1);
    std::printf(", first byte %s %d", name(copied), byte);
    std::printf(", close %s", name(cuIpcCloseMemHandle(z)));
  }
  std::printf("\n");
  cuCtxSetCurrent(a);
  std::printf("   in the created context: close %s", name(cuIpcCloseMemHandle(x)));
  if (again == CUDA_SUCCESS) std::printf(", close again %s", name(cuIpcCloseMemHandle(y)));
  byte = 0;
  copied = cuMemcpyDtoH(&byte, x, 1);
  std::printf(", then a copy from it %s, cuCtxDestroy %s\n", name(copied), name(cuCtxDestroy(a)));
  cuCtxSetCurrent(primary);

  std::fflush(stdout);
  if (write(down[1], "g", 1) != 1) return 1;
  int status = 0;
  waitpid(pid, &status, 0);
  std::printf("exporter exit status %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return 0;
}
