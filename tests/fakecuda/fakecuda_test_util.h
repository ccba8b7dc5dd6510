// Helpers for the simulated driver's unit tests: forked children (each starts
// with a fresh driver and reads the environment again at cuInit), descriptor
// passing, and checks that work inside a child.
#pragma once

#include <cuda.h>
#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <functional>

/// CUDA 13.1 device-explicit multicast binds (not in the 13.0 headers).
extern "C" CUresult cuMulticastBindMem_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
                                          size_t mcOffset, CUmemGenericAllocationHandle memHandle,
                                          size_t memOffset, size_t size, unsigned long long flags);
extern "C" CUresult cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
                                           size_t mcOffset, CUdeviceptr memptr, size_t size,
                                           unsigned long long flags);

namespace fctest {

/// Inside a forked child: prints the failed condition and returns 1 from fn.
#define FC_REQ(cond)                                                                      \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      fprintf(stderr, "child %d: %s:%d: %s\n", (int)getpid(), __FILE__, __LINE__, #cond); \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)

/// cuInit, device 0's primary context retained and made current.
CUresult init_primary(CUcontext* ctx = nullptr);

/// Runs fn in a forked child and returns its exit status (0 = passed).
int run_child(const std::function<int()>& fn);

/// A forked child talking to the parent over a socket pair.
struct Child {
  pid_t pid = -1;
  int sock = -1;  ///< parent's end
  int status = 127 << 8;  ///< its wait status once joined; a child never started failed
  /// Waits for the child; returns its exit status (127 when spawn could not
  /// start it; the same again when joined twice).
  int join();
  /// Ends a child still there (SIGKILL) and reaps it; nothing once joined.
  void kill();
};
/// Starts fn(sock) in a child; fn's return value is its exit status.
Child spawn(const std::function<int(int sock)>& fn);

/// The driver's whole checkpoint cycle on pid, as the coordinator runs it:
/// lock (timeout_ms), checkpoint, restore, unlock. The first failure's result.
CUresult driver_cycle(pid_t pid, unsigned timeout_ms);

bool send_u64(int sock, uint64_t v);
bool recv_u64(int sock, uint64_t* v);
bool send_fd(int sock, int fd);
int recv_fd(int sock);

/// A POSIX-fd-exportable VMM allocation of device 0, reserved, mapped, RW.
struct VmmBuffer {
  CUmemGenericAllocationHandle handle = 0;
  CUdeviceptr ptr = 0;
  size_t size = 0;
};
CUresult vmm_create(size_t size, VmmBuffer* out);
CUresult vmm_map_handle(CUmemGenericAllocationHandle h, size_t size, CUdeviceptr* ptr);
CUresult vmm_destroy(const VmmBuffer& b);

}  // namespace fctest
