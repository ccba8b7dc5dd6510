// shim_track_test scenarios on cuMemAlloc blocks (served by VMM mappings):
// legacy IPC, frees and allocations during stream captures, peer access, the
// driver's cuMemAlloc where the shim cannot serve a block, and what a free
// waits for and answers. Helpers: track_test.h.
#include <dirent.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "tests/fakecuda/kernels_test_util.h"
#include "tests/shim/track_test.h"

namespace track_test {

/// Legacy IPC on cuMemAlloc memory: the same address on repeated opens in one
/// context, bytes both ways, records on both sides. The served block stays a
/// GPUDirect RDMA buffer, as the driver's cuMemAlloc block is, and takes
/// SYNC_MEMOPS (which the driver refuses for VMM memory): the shim sets the
/// context's CU_CTX_SYNC_MEMOPS instead; the pointer queries answer as for
/// the driver's block.
int ipc() {
  REQ_OK(init_primary());
  CUdeviceptr d;
  REQ_OK(cuMemAlloc(&d, 3 << 20));  // not a multiple of the granularity
  fill(d, 3 << 20, 0x61);
  int rdma = 0;
  REQ_OK(cuPointerGetAttribute(&rdma, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, d + 4096));
  REQ(rdma == 1);
  unsigned flags = 0, one = 1;
  REQ_OK(cuCtxGetFlags(&flags));
  REQ(!(flags & CU_CTX_SYNC_MEMOPS));
  REQ_OK(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, d + 4096));
  REQ_OK(cuCtxGetFlags(&flags));
  REQ(flags & CU_CTX_SYNC_MEMOPS);
  // The pointer queries answer as for the driver's block: legacy-IPC
  // capable, no shareable handle types, the size asked for, its context.
  int legacy = 0;
  unsigned long long types = 7;
  size_t range = 0;
  CUcontext ctx = nullptr, cur = nullptr;
  REQ_OK(cuCtxGetCurrent(&cur));
  REQ_OK(cuPointerGetAttribute(&legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, d + 4096));
  REQ_OK(cuPointerGetAttribute(&types, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, d));
  REQ_OK(cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, d));
  REQ_OK(cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, d));
  REQ(legacy == 1 && types == 0 && range == (3u << 20) && ctx == cur);
  CUpointer_attribute which[] = {CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                 CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                 CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES};
  legacy = 0;
  range = 0;
  types = 7;
  void* into[] = {&legacy, &range, &types};
  REQ_OK(cuPointerGetAttributes(3, which, into, d + 4096));
  REQ(legacy == 1 && range == (3u << 20) && types == 0);
  CUdeviceptr base = 0;
  REQ_OK(cuMemGetAddressRange(&base, &range, d + 4096));
  REQ(base == d && range == (3u << 20));
  // Past the bytes asked, in the mapping's last granule: an address the
  // driver does not know (measured: tests/gpu/probes/alloc_sizes.cpp).
  // The refusals write what the driver writes for such an address: 0 in
  // both of cuMemGetAddressRange's variables, nothing in
  // cuPointerGetAttribute's (the mapping's answers were written before).
  const CUdeviceptr past = d + (3 << 20);
  base = 7;
  range = 7;
  REQ(cuMemGetAddressRange(&base, &range, past) == CUDA_ERROR_NOT_FOUND);
  REQ(base == 0 && range == 0);
  range = 7;
  REQ(cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, past) ==
      CUDA_ERROR_INVALID_VALUE);
  REQ(range == 7);
  ctx = nullptr;
  REQ(cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, past) == CUDA_ERROR_INVALID_VALUE);
  REQ(ctx == nullptr);
  REQ(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, past) ==
      CUDA_ERROR_INVALID_VALUE);
  {
    CUipcMemHandle tail;  // measured on an H100 (alloc_sizes.cpp tail)
    REQ(cuIpcGetMemHandle(&tail, past) == CUDA_ERROR_INVALID_VALUE);
  }
  {
    unsigned mem_type = 9;
    int ordinal = 9, mapped = 9;
    unsigned long long id = 9;
    CUdeviceptr start = 9;
    CUpointer_attribute unknown[] = {
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE,      CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        CU_POINTER_ATTRIBUTE_MAPPED,           CU_POINTER_ATTRIBUTE_BUFFER_ID,
        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        CU_POINTER_ATTRIBUTE_CONTEXT};
    range = 9;
    ctx = cur;
    void* out[] = {&mem_type, &ordinal, &mapped, &id, &start, &range, &ctx};
    REQ_OK(cuPointerGetAttributes(7, unknown, out, past));
    REQ(mem_type == 0 && ordinal == -2 && mapped == 0 && id == 0 && start == 0 && range == 0 &&
        ctx == nullptr);
  }
  proto::ShimRecords r;
  REQ(inspect(getpid(), &r));
  const uint64_t calls = r.sharing_calls;
  CUipcMemHandle h;
  REQ_OK(cuIpcGetMemHandle(&h, d));
  REQ(inspect(getpid(), &r));
  REQ(r.sharing_calls == calls + 1);
  REQ(r.allocations.size() == 1 && r.allocations[0].legacy && r.allocations[0].exported);
  REQ(r.allocations[0].size == 4 << 20);
  CUdeviceptr opened_at = 0;
  Child c = spawn([&](int sock) {
    const std::string fail_file = std::string(getenv("CUSNAP_RUNTIME_DIR")) + "/fail-%p";
    setenv("FAKECUDA_FAIL_FILE", fail_file.c_str(), 1);
    FC_REQ(init_primary() == CUDA_SUCCESS);
    proto::ShimRecords rr;
    FC_REQ(inspect(getpid(), &rr));
    const uint64_t child_calls = rr.sharing_calls;
    CUdeviceptr p1 = 0, p2 = 0;
    // An open where no other context of the device has the handle open, and
    // the open again in its own context, ask nothing of the primary context
    // (a retain and release): the next cuDevicePrimaryCtxGetState, armed to
    // fail, is the test's own.
    {
      std::string armed = fail_file;
      armed.replace(armed.find("%p"), 2, std::to_string(getpid()));
      FILE* f = fopen(armed.c_str(), "we");
      FC_REQ(f && fputs("cuDevicePrimaryCtxGetState:1:999\n", f) >= 0 && fclose(f) == 0);
    }
    FC_REQ(cuIpcOpenMemHandle(&p1, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
    FC_REQ(cuIpcOpenMemHandle(&p2, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
    FC_REQ(p1 == p2 && p1 != 0);
    {
      unsigned flags = 0;
      int on = 0;
      FC_REQ(cuDevicePrimaryCtxGetState(0, &flags, &on) == static_cast<CUresult>(999));
    }
    FC_REQ(all(p1, 3 << 20, 0x61));
    // Another context of the device may not open it while this one has it
    // open (measured on an H200: tests/gpu/probes/context_ipc.cpp).
    CUdevice dev = 0;
    CUcontext other = nullptr;
    FC_REQ(cuCtxGetDevice(&dev) == CUDA_SUCCESS);
    FC_REQ(cuCtxCreate(&other, nullptr, 0, dev) == CUDA_SUCCESS);
    CUdeviceptr p3 = 0;
    FC_REQ(cuIpcOpenMemHandle(&p3, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) ==
           CUDA_ERROR_INVALID_HANDLE);
    FC_REQ(cuCtxDestroy(other) == CUDA_SUCCESS);
    FC_REQ(init_primary() == CUDA_SUCCESS);
    fill(p1, 3 << 20, 0x62);
    FC_REQ(inspect(getpid(), &rr));
    FC_REQ(rr.sharing_calls == child_calls + 3);  // the two opens and the refused one
    FC_REQ(rr.ipc.size() == 1 && rr.ipc[0].opens == 2 && rr.ipc[0].address == p1);
    FC_REQ(rr.allocations.size() == 1 && rr.allocations[0].origin == "imported");
    FC_REQ(rr.allocations[0].creator_pid == getppid());
    FC_REQ(send_u64(sock, p1));
    uint64_t v;
    FC_REQ(recv_u64(sock, &v));
    FC_REQ(cuIpcCloseMemHandle(p1) == CUDA_SUCCESS);
    FC_REQ(all(p1, 3 << 20, 0x62));  // still open once
    FC_REQ(cuIpcCloseMemHandle(p1) == CUDA_SUCCESS);
    FC_REQ(inspect(getpid(), &rr));
    FC_REQ(rr.ipc.empty() && rr.allocations.empty() && rr.mappings.empty());
    return 0;
  });
  uint64_t v = 0;
  REQ(recv_u64(c.sock, &v));
  opened_at = v;
  REQ(opened_at != 0);
  REQ(all(d, 3 << 20, 0x62));
  CUdeviceptr self;
  REQ(cuIpcOpenMemHandle(&self, h, 0) == CUDA_ERROR_INVALID_CONTEXT);
  REQ(inspect(getpid(), &r));
  REQ(r.sharing_calls == calls + 2);  // a refused open counts too
  REQ(send_u64(c.sock, 1));
  REQ(c.join() == 0);
  REQ_OK(cuMemFree(d));
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.empty() && r.mappings.empty());
  return 0;
}

/// A free during a stream capture (src/shim/captures.h): the shim's
/// cuMemFree of a block it serves synchronizes the context first, which
/// during a capture fails and invalidates it, while the driver's cuMemFree in
/// a RELAXED capture succeeds. So the block stays until the first free after
/// the capture, and the capture goes on; a second free of it meanwhile is
/// refused; a capture whose stream is destroyed no longer defers.
int free_in_capture() {
  REQ_OK(init_primary());
  CUdeviceptr d = 0, e = 0, f = 0;
  REQ_OK(cuMemAlloc(&d, 1 << 20));
  CUstream s, t;
  REQ_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  REQ_OK(cuStreamCreate(&t, CU_STREAM_NON_BLOCKING));
  REQ_OK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  REQ_OK(cuMemFree(d));
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  REQ_OK(cuStreamIsCapturing(s, &st));
  REQ(st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  REQ(cuMemFree(d) == CUDA_ERROR_INVALID_VALUE);  // freed already
  proto::ShimRecords r;
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.size() == 1 && r.allocations[0].legacy);  // deferred
  CUgraph g = nullptr;
  REQ_OK(cuStreamEndCapture(s, &g));
  REQ(g != nullptr);
  REQ_OK(cuGraphDestroy(g));
  REQ_OK(cuMemAlloc(&e, 1 << 20));
  REQ_OK(cuMemFree(e));  // frees the deferred block first
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.empty() && r.mappings.empty());
  // A capture left behind by a destroyed stream defers nothing.
  REQ_OK(cuMemAlloc(&f, 1 << 20));
  REQ_OK(cuStreamBeginCapture_v2(t, CU_STREAM_CAPTURE_MODE_RELAXED));
  REQ_OK(cuStreamDestroy(t));
  REQ_OK(cuMemFree(f));
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.empty());
  // Nor does one on the default stream of a thread that exited capturing
  // (before: every later free deferred for good), from the moment it is
  // joined (before: for a moment after, about one time in 40).
  CUcontext ctx = nullptr;
  REQ_OK(cuCtxGetCurrent(&ctx));
  for (int i = 0; i < 200; ++i) {
    CUresult began = CUDA_ERROR_UNKNOWN;
    std::thread([&] {
      began = cuCtxSetCurrent(ctx);
      if (began == CUDA_SUCCESS)
        began = cuStreamBeginCapture_v2(CU_STREAM_PER_THREAD, CU_STREAM_CAPTURE_MODE_RELAXED);
    }).join();
    REQ_OK(began);
    REQ_OK(cuMemAlloc(&f, 1 << 20));
    REQ_OK(cuMemFree(f));
    REQ(inspect(getpid(), &r));
    REQ(r.allocations.empty());
  }
  REQ_OK(cuStreamDestroy(s));
  return 0;
}

/// cuMemAlloc and cuMemFree during a capture fare as the driver's: in GLOBAL
/// and THREAD_LOCAL mode they fail STREAM_CAPTURE_UNSUPPORTED and the capture
/// is invalidated (no block served, none freed or deferred), in RELAXED mode
/// the shim serves the block and the capture goes on.
int alloc_in_capture() {
  REQ_OK(init_primary());
  CUstream s;
  REQ_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  proto::ShimRecords r;
  CUdeviceptr before = 0;
  REQ_OK(cuMemAlloc(&before, 1 << 20));
  for (CUstreamCaptureMode mode :
       {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL}) {
    for (bool alloc : {true, false}) {
      REQ_OK(cuStreamBeginCapture_v2(s, mode));
      CUdeviceptr d = 0;
      if (alloc)
        REQ(cuMemAlloc(&d, 1 << 20) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
      else
        REQ(cuMemFree(before) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
      CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
      REQ_OK(cuStreamIsCapturing(s, &st));
      REQ(st == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
      CUgraph g = nullptr;
      REQ(cuStreamEndCapture(s, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
      REQ(inspect(getpid(), &r));
      REQ(r.allocations.size() == 1);  // only the block made before, still there
    }
  }
  REQ_OK(cuMemFree(before));  // after the captures: freed
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.empty());
  REQ_OK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  CUdeviceptr d = 0;
  REQ_OK(cuMemAlloc(&d, 1 << 20));
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  REQ_OK(cuStreamIsCapturing(s, &st));
  REQ(st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.size() == 1 && r.allocations[0].legacy);  // served by the shim
  CUgraph g = nullptr;
  REQ_OK(cuStreamEndCapture(s, &g));
  REQ(g != nullptr);
  REQ_OK(cuGraphDestroy(g));
  REQ_OK(cuMemFree(d));
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.empty());
  REQ_OK(cuStreamDestroy(s));
  return 0;
}

namespace {

/// Flags the records give device `dev` on the mapping at `addr` (0: none).
uint32_t recorded_access(const proto::ShimRecords& r, uint64_t addr, int32_t dev) {
  for (auto& m : r.mappings)
    if (m.address == addr)
      for (auto& a : m.access)
        if (a.type == CU_MEM_LOCATION_TYPE_DEVICE && a.id == dev) return a.flags;
  return 0;
}

/// The access the driver gives the device of context `ctx` to the memory at
/// p: the ACCESS_FLAGS pointer attribute with `ctx` current (the served
/// block's mapping's access, which the shim leaves to the driver); ~0 when
/// the query fails. The current context is left as it was.
unsigned long long access_from(CUcontext ctx, CUdeviceptr p) {
  CUcontext was = nullptr;
  if (cuCtxGetCurrent(&was) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) return ~0ull;
  unsigned v = 0;  // the driver writes the lowest byte
  const CUresult r = cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, p);
  cuCtxSetCurrent(was);
  return r == CUDA_SUCCESS ? v : ~0ull;
}

/// cuMemGetAccess of p for device `dev`: the driver answers 0 for its
/// cuMemAlloc block, which is no VMM mapping (measured on an H100:
/// tests/gpu/probes/alloc_sizes.cpp ctx_attrs), and so must the shim for a
/// block it serves; ~0 when the call fails.
unsigned long long get_access(CUdeviceptr p, int dev) {
  CUmemLocation loc{};
  loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
  loc.id = dev;
  unsigned long long f = ~0ull;
  if (cuMemGetAccess(&f, &loc, p) != CUDA_SUCCESS) return ~0ull;
  return f;
}

/// Initialises the driver and retains the primary contexts of devices 0
/// and 1 (into *c0, *c1); 0, or 1 after saying what failed.
int two_primary_contexts(CUcontext* c0, CUcontext* c1, CUdevice* d0 = nullptr,
                         CUdevice* d1 = nullptr) {
  REQ_OK(cuInit(0));
  CUdevice dev0, dev1;
  REQ_OK(cuDeviceGet(&dev0, 0));
  REQ_OK(cuDeviceGet(&dev1, 1));
  REQ_OK(cuDevicePrimaryCtxRetain(c0, dev0));
  REQ_OK(cuDevicePrimaryCtxRetain(c1, dev1));
  if (d0) *d0 = dev0;
  if (d1) *d1 = dev1;
  return 0;
}

}  // namespace

/// Peer access reaches cuMemAlloc blocks served by VMM mappings: device 1's
/// context enables access to device 0's context; device 0's blocks (existing
/// and new) get read-write for device 1, in the driver (the ACCESS_FLAGS
/// device 1's context reads) and in the records; disabling revokes it. As
/// the driver's own block, a served block answers cuMemGetAccess 0 and
/// refuses cuMemSetAccess (INVALID_VALUE, nothing changed), so peer access
/// is the only way to it. The enable also goes through the pointer
/// cuGetProcAddress hands out (the runtime's cudaDeviceEnablePeerAccess path).
int peer() {
  CUdevice dev0, dev1;
  CUcontext c0, c1;
  REQ(two_primary_contexts(&c0, &c1, &dev0, &dev1) == 0);
  const unsigned long long RW = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const size_t n = 1 << 20;

  REQ_OK(cuCtxSetCurrent(c0));
  CUdeviceptr before;  // a block of device 0 made before peer access
  REQ_OK(cuMemAlloc(&before, n));
  fill(before, n, 0x31);
  REQ(access_from(c0, before) == RW && access_from(c1, before) == 0);
  REQ(get_access(before, 0) == 0 && get_access(before, 1) == 0);
  {  // past its bytes, in the rest of its mapping: no memory, as on the driver
    CUmemLocation loc{};
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = 0;
    unsigned long long f = 7;
    REQ(cuMemGetAccess(&f, &loc, before + n + 4096) == CUDA_ERROR_INVALID_VALUE);
    REQ(f == 7);  // nothing written
    REQ(cuMemGetAccess(nullptr, &loc, before + n + 4096) == CUDA_ERROR_INVALID_VALUE);
  }

  REQ_OK(cuCtxSetCurrent(c1));
  CUdeviceptr own1;  // device 1's own block: device 0 never enables access
  REQ_OK(cuMemAlloc(&own1, n));
  REQ(cuCtxEnablePeerAccess(c1, 0) == CUDA_ERROR_INVALID_DEVICE);
  REQ_OK(cuCtxEnablePeerAccess(c0, 0));
  REQ(cuCtxEnablePeerAccess(c0, 0) == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
  REQ(access_from(c1, before) == RW);
  REQ(access_from(c0, own1) == 0);
  REQ(get_access(before, 1) == 0);  // peer access is no VMM access either
  REQ(all(before, n, 0x31));        // read from device 1's context
  fill(before, n, 0x32);            // and written
  proto::ShimRecords r;
  REQ(inspect(getpid(), &r));
  REQ(recorded_access(r, before, 1) == RW && recorded_access(r, before, 0) == RW);
  REQ(recorded_access(r, own1, 0) == 0);

  REQ_OK(cuCtxSetCurrent(c0));
  CUdeviceptr after, refused;  // blocks of device 0 made while peer access is on
  REQ_OK(cuMemAlloc(&after, n));
  REQ_OK(cuMemAlloc(&refused, n));
  REQ(access_from(c1, after) == RW && access_from(c1, refused) == RW);
  CUmemAccessDesc mine{};  // the application cannot set a block's access itself
  mine.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  mine.location.id = 1;
  mine.flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  REQ(cuMemSetAccess(refused, 2 << 20, &mine, 1) == CUDA_ERROR_INVALID_VALUE);
  REQ(access_from(c1, refused) == RW);  // nothing changed
  REQ(inspect(getpid(), &r));
  REQ(recorded_access(r, refused, 1) == RW);
  REQ(all(before, n, 0x32));

  REQ_OK(cuCtxSetCurrent(c1));
  REQ_OK(cuCtxDisablePeerAccess(c0));
  REQ(cuCtxDisablePeerAccess(c0) == CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  REQ(access_from(c1, before) == 0 && access_from(c1, after) == 0 && access_from(c1, refused) == 0);
  REQ(access_from(c0, before) == RW && access_from(c0, after) == RW);
  REQ(inspect(getpid(), &r));
  REQ(recorded_access(r, before, 1) == 0 && recorded_access(r, after, 1) == 0);
  REQ(recorded_access(r, refused, 1) == 0 && recorded_access(r, before, 0) == RW);
  mine.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;  // nor grant it
  REQ(cuMemSetAccess(before, 2 << 20, &mine, 1) == CUDA_ERROR_INVALID_VALUE);
  REQ(access_from(c1, before) == 0);

  // Enabled again through the resolver's pointer, as the runtime calls it.
  void* fn = nullptr;
  CUdriverProcAddressQueryResult st;
  REQ_OK(cuGetProcAddress_v2("cuCtxEnablePeerAccess", &fn, 12000, 0, &st));
  REQ(fn != nullptr);
  auto enable = reinterpret_cast<CUresult (*)(CUcontext, unsigned)>(fn);
  REQ_OK(enable(c0, 0));
  REQ(access_from(c1, before) == RW && access_from(c1, after) == RW);
  REQ(inspect(getpid(), &r));
  REQ(recorded_access(r, before, 1) == RW && recorded_access(r, after, 1) == RW);
  REQ_OK(cuCtxDisablePeerAccess(c0));
  REQ(access_from(c1, before) == 0 && access_from(c1, refused) == 0);

  REQ_OK(cuMemFree(own1));
  REQ_OK(cuCtxSetCurrent(c0));
  REQ_OK(cuMemFree(before));
  REQ_OK(cuMemFree(after));
  REQ_OK(cuMemFree(refused));
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.empty() && r.mappings.empty());
  return 0;
}

namespace {

/// The system call thread `tid` of this process is blocked in, -1 when it
/// runs or cannot be read (/proc/self/task/TID/syscall).
long blocked_syscall(pid_t tid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/task/%d/syscall", int(tid));
  FILE* f = fopen(path, "r");
  if (!f) return -1;
  long n = -1;
  if (fscanf(f, "%ld", &n) != 1) n = -1;
  fclose(f);
  return n;
}

}  // namespace

/// A block freed while a revocation of peer access to it is under way: its
/// address is not freed before the revocation is done (freed, it could be
/// another block's by the revocation's call, which would then take that
/// block's access away). Each cuMemSetAccess takes 500 ms here
/// (FAKECUDA_DELAY); a thread disables device 1's peer access to device 0,
/// and while it sleeps in the revocation's call, the main thread frees the
/// block: when the free returns, the thread sleeps there no more (without
/// the wait, the free returned with some 500 ms of the sleep to go).
int peer_free_race() {
  // For the thread reading it, the file names that read (or says
  // "running"), where the kernel has it and lets this process read it.
  char own[64], text[64] = "";
  snprintf(own, sizeof own, "/proc/self/task/%d/syscall", int(gettid()));
  if (FILE* f = fopen(own, "r")) {
    if (!fgets(text, sizeof text, f)) text[0] = 0;
    fclose(f);
  }
  if (!(isdigit(static_cast<unsigned char>(text[0])) || strncmp(text, "running", 7) == 0)) {
    fprintf(stderr, "SKIP: %s cannot be read here (%s)\n", own, text[0] ? text : strerror(errno));
    return 77;
  }
  setenv("FAKECUDA_DELAY", "cuMemSetAccess:500", 1);
  CUcontext c0, c1;
  REQ(two_primary_contexts(&c0, &c1) == 0);
  REQ_OK(cuCtxSetCurrent(c1));
  REQ_OK(cuCtxEnablePeerAccess(c0, 0));
  REQ_OK(cuCtxSetCurrent(c0));
  CUdeviceptr blk;
  REQ_OK(cuMemAlloc(&blk, 1 << 20));  // its own access, then device 1's grant
  REQ(access_from(c1, blk) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);

  std::atomic<pid_t> tid{0};
  std::atomic<bool> disabled{false};
  std::atomic<int> disable_result{-1};
  std::thread t([&] {
    tid = gettid();
    CUresult r = cuCtxSetCurrent(c1);
    if (r == CUDA_SUCCESS) r = cuCtxDisablePeerAccess(c0);
    disable_result = int(r);
    disabled = true;
  });
  // The revocation's cuMemSetAccess is the only sleep on the thread's way
  // (clock_nanosleep, or nanosleep).
  bool inside = false;
  for (int i = 0; i < 5000 && !inside && !disabled; ++i) {
    const long n = tid ? blocked_syscall(tid) : -1;
    inside = n == SYS_clock_nanosleep || n == SYS_nanosleep;
    if (!inside) usleep(1000);
  }
  const CUresult freed = inside ? cuMemFree(blk) : CUDA_ERROR_UNKNOWN;
  const long after = blocked_syscall(tid);  // -1 once the thread has ended
  t.join();
  REQ(inside);  // else the thread never slept in the revocation
  REQ_OK(freed);
  REQ(after != SYS_clock_nanosleep && after != SYS_nanosleep);
  REQ(disable_result == CUDA_SUCCESS);
  proto::ShimRecords r;
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.empty() && r.mappings.empty());
  return 0;
}

namespace {

/// The simulated driver's memory files this process made (one per
/// allocation it holds, the driver's cuMemAlloc blocks included).
int own_memory_files() {
  const std::string mine = "memfd:fakecuda:" + std::to_string(getpid()) + ":";
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      char target[256];
      const std::string link = std::string("/proc/self/fd/") + e->d_name;
      const ssize_t len = readlink(link.c_str(), target, sizeof target - 1);
      if (len > 0 && std::string(target, size_t(len)).find(mine) != std::string::npos) ++n;
    }
    closedir(d);
  }
  return n;
}

}  // namespace

/// Where the shim cannot serve a cuMemAlloc block with an exportable
/// allocation (cuMemCreate, cuMemAddressReserve, cuMemMap or cuMemSetAccess
/// fails, or the grant to a device with peer access does: a device nearly
/// full, one without POSIX-fd handles), the driver's own cuMemAlloc serves
/// it, untracked, as with CUSNAP_SHIM_LEGACY_VMM=0: the allocation succeeds,
/// nothing of the attempt is left (no record, no memory), its IPC handle is
/// the driver's, and its free is the driver's. The next block is the
/// shim's again. The records count the block left to the driver (with the
/// call that failed) while it lives, and the IPC handles of it handed out.
/// Before, the driver's error reached the application.
int alloc_fallback() {
  struct Case {
    const char* fail;  // FAKECUDA_FAIL in the child
    bool peer;         // device 1 has peer access to device 0
  };
  const Case cases[] = {{"cuMemCreate:1:2", false},
                        {"cuMemAddressReserve:1:2", false},
                        {"cuMemMap:1:2", false},
                        {"cuMemSetAccess:1:2", false},
                        {"cuMemSetAccess:2:2", true}};  // the peer grant, after the block's own
  for (const Case& k : cases) {
    Child c = spawn([&](int) {
      setenv("FAKECUDA_FAIL", k.fail, 1);
      CUcontext c0 = nullptr, c1 = nullptr;
      FC_REQ(init_primary(&c0) == CUDA_SUCCESS);
      if (k.peer) {
        CUdevice dev1;
        FC_REQ(cuDeviceGet(&dev1, 1) == CUDA_SUCCESS);
        FC_REQ(cuDevicePrimaryCtxRetain(&c1, dev1) == CUDA_SUCCESS);
        FC_REQ(cuCtxSetCurrent(c1) == CUDA_SUCCESS);
        FC_REQ(cuCtxEnablePeerAccess(c0, 0) == CUDA_SUCCESS);
        FC_REQ(cuCtxSetCurrent(c0) == CUDA_SUCCESS);
      }
      FC_REQ(own_memory_files() == 0);
      CUdeviceptr d = 0;
      const CUresult got = cuMemAlloc(&d, 1 << 20);
      if (got != CUDA_SUCCESS) fprintf(stderr, "%s: cuMemAlloc gave %d\n", k.fail, int(got));
      FC_REQ(got == CUDA_SUCCESS && d != 0);
      fill(d, 1 << 20, 0x5A);
      FC_REQ(all(d, 1 << 20, 0x5A));
      proto::ShimRecords r;
      FC_REQ(inspect(getpid(), &r));
      FC_REQ(r.allocations.empty() && r.mappings.empty());  // the driver's block: untracked
      FC_REQ(r.foreign_imports_alive == 0 && r.foreign_imports_total == 0);
      // Counted as left to the driver, with the call that failed.
      const std::string failed = std::string(k.fail).substr(0, std::string(k.fail).find(':'));
      if (r.driver_blocks != 1 || r.driver_ipc_exports != 0 ||
          r.driver_block_why.find(failed) == std::string::npos)
        fprintf(stderr, "%s: driver_blocks %llu, exports %llu, why '%s'\n", k.fail,
                (unsigned long long)r.driver_blocks, (unsigned long long)r.driver_ipc_exports,
                r.driver_block_why.c_str());
      FC_REQ(r.driver_blocks == 1 && r.driver_ipc_exports == 0);
      FC_REQ(r.driver_block_why.find(failed) != std::string::npos);
      FC_REQ(own_memory_files() == 1);  // the driver's block only: the attempt left nothing
      CUipcMemHandle h;
      FC_REQ(cuIpcGetMemHandle(&h, d) == CUDA_SUCCESS);
      FC_REQ(memcmp(h.reserved, proto::kIpcMagic, sizeof(proto::kIpcMagic)) != 0);
      FC_REQ(cuIpcGetMemHandle(&h, d + 4096) == CUDA_SUCCESS);  // inside it: the same block
      FC_REQ(inspect(getpid(), &r));
      FC_REQ(r.driver_blocks == 1 && r.driver_ipc_exports == 2);
      FC_REQ(cuMemFree(d) == CUDA_SUCCESS);
      FC_REQ(own_memory_files() == 0);
      FC_REQ(inspect(getpid(), &r));
      FC_REQ(r.driver_blocks == 0 && r.driver_ipc_exports == 2);  // handed out: stays counted
      FC_REQ(cuMemAlloc(&d, 1 << 20) == CUDA_SUCCESS);  // the shim's again
      FC_REQ(inspect(getpid(), &r));
      FC_REQ(r.allocations.size() == 1 && r.allocations[0].legacy);
      FC_REQ(r.driver_blocks == 0);
      FC_REQ(cuIpcGetMemHandle(&h, d) == CUDA_SUCCESS);  // the shim's handle: not counted
      FC_REQ(memcmp(h.reserved, proto::kIpcMagic, sizeof(proto::kIpcMagic)) == 0);
      FC_REQ(cuMemFree(d) == CUDA_SUCCESS);
      FC_REQ(inspect(getpid(), &r));
      FC_REQ(r.allocations.empty() && r.mappings.empty() && r.driver_ipc_exports == 2);
      return 0;
    });
    REQ(c.join() == 0);
  }
  return 0;
}

/// A handshake kernel on a stream of its own, in the current context,
/// waiting for 300 ms on its peer's flag (a thread sets it): what a free of
/// the block holding its own flag must wait for.
struct HeldKernel {
  CUfunction function = nullptr;
  CUstream stream = nullptr;
  CUdeviceptr flag = 0, peer_flag = 0;  ///< cuMemAlloc blocks the shim serves
  std::thread peer;                     ///< sets peer_flag after 300 ms
  std::atomic<bool> released{false};    ///< set by peer once it has set peer_flag
  uint64_t step = 1;
};

/// Launches k's kernel and starts its peer; 0, or 1 after saying what failed.
int start_held_kernel(HeldKernel* k) {
  k->function = load_function("ncclDevKernel_Handshake");
  REQ(k->function != nullptr);
  REQ_OK(cuStreamCreate(&k->stream, CU_STREAM_NON_BLOCKING));
  REQ_OK(cuMemAlloc(&k->flag, 8));
  REQ_OK(cuMemAlloc(&k->peer_flag, 8));
  *word(k->flag) = 0;
  *word(k->peer_flag) = 0;
  void* args[] = {&k->flag, &k->peer_flag, &k->step};
  REQ_OK(cuLaunchKernel(k->function, 1, 1, 1, 1, 1, 1, 0, k->stream, args, nullptr));
  const CUdeviceptr peer_flag = k->peer_flag;
  k->peer = std::thread([peer_flag, k] {
    usleep(300 * 1000);
    *word(peer_flag) = 1;  // the kernel ends
    k->released = true;
  });
  return 0;
}

/// cuMemFree of a block the shim serves waits for the work of the block's
/// device before the memory goes, as the driver's does, also with another
/// device's context current (a runtime application after cudaSetDevice):
/// a kernel whose flag is in the block ends well. And it answers what the
/// synchronize answers, as the driver's: a sticky error of an earlier kernel;
/// the block is freed all the same (a free that synchronized the current
/// context only would unmap the block under the kernel, which would fail).
int free_sync() {
  CUcontext c0, c1;
  REQ(two_primary_contexts(&c0, &c1) == 0);
  REQ_OK(cuCtxSetCurrent(c0));
  HeldKernel k;
  REQ(start_held_kernel(&k) == 0);
  const CUstream st = k.stream;
  CUdeviceptr flag = k.flag, peer_flag = k.peer_flag;
  std::thread& peer = k.peer;
  REQ_OK(cuCtxSetCurrent(c1));
  const auto t0 = std::chrono::steady_clock::now();
  const CUresult freed = cuMemFree(flag);
  const bool waited = k.released;  // the free returned after the kernel could end
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  peer.join();
  fprintf(stderr, "free from device 1 of a block a kernel of device 0 uses: %lld ms\n",
          (long long)ms);
  REQ_OK(freed);
  REQ(waited);
  REQ_OK(cuCtxSetCurrent(c0));
  REQ_OK(cuStreamSynchronize(st));  // the kernel ended well: its flag stayed until it had

  // The same with the block served in a created context and the device's
  // primary context current: the free waits for the created context's work.
  {
    CUdevice dev0;
    REQ_OK(cuDeviceGet(&dev0, 0));
    CUcontext own = nullptr;
    REQ_OK(cuCtxCreate(&own, nullptr, 0, dev0));
    HeldKernel k2;
    REQ(start_held_kernel(&k2) == 0);
    REQ_OK(cuCtxSetCurrent(c0));
    const auto t1 = std::chrono::steady_clock::now();
    const CUresult freed2 = cuMemFree(k2.flag);
    const bool waited2 = k2.released;
    const auto ms2 =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t1)
            .count();
    k2.peer.join();
    fprintf(stderr,
            "free from the primary context of a block a created context's kernel uses: %lld ms\n",
            (long long)ms2);
    REQ_OK(freed2);
    REQ(waited2);
    REQ_OK(cuCtxSetCurrent(own));
    REQ_OK(cuStreamSynchronize(k2.stream));  // the kernel ended well
    REQ_OK(cuMemFree(k2.peer_flag));
    REQ_OK(cuCtxDestroy(own));
    REQ_OK(cuCtxSetCurrent(c0));
  }

  // A kernel whose flag is at an address nothing maps fails, sticky.
  CUdeviceptr nowhere = 4096;
  void* bad[] = {&nowhere, &peer_flag, &k.step};
  REQ_OK(cuLaunchKernel(k.function, 1, 1, 1, 1, 1, 1, 0, st, bad, nullptr));
  CUdeviceptr d = 0;
  REQ_OK(cuMemAlloc(&d, 1 << 20));
  REQ(cuMemFree(d) == CUDA_ERROR_ILLEGAL_ADDRESS);
  proto::ShimRecords r;
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.size() == 1 && r.mappings.size() == 1);  // peer_flag's: d is gone
  REQ(r.mappings[0].address == peer_flag);
  REQ(cuMemFree(d) == CUDA_ERROR_INVALID_VALUE);  // the driver's answer: freed already
  REQ(cuMemFree(peer_flag) == CUDA_ERROR_ILLEGAL_ADDRESS);
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.empty() && r.mappings.empty());
  return 0;
}

/// cuMemFreeAsync of a block the shim serves frees it in stream order, as the
/// driver frees a cuMemAlloc block there (measured: the driver refuses the
/// shim's VMM-mapped address, INVALID_VALUE, and the block stays mapped): the
/// call returns at once; a kernel queued before the free on the stream, its
/// flag in the block, ends well; a second free is refused; the block and its
/// record go at the first allocation or free after the stream got there.
/// Also the per-thread-stream form; a stream the driver does not know frees
/// nothing; a free while a capture is under way is deferred to the next
/// free; a block left to the driver is the driver's to free, and forgotten.
int free_async() {
  REQ_OK(init_primary());
  HeldKernel k;
  REQ(start_held_kernel(&k) == 0);
  const CUstream st = k.stream;
  CUdeviceptr flag = k.flag, peer_flag = k.peer_flag;
  std::thread& peer = k.peer;
  const auto t0 = std::chrono::steady_clock::now();
  const CUresult freed = cuMemFreeAsync(flag, st);
  const bool waited = k.released;
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  fprintf(stderr, "cuMemFreeAsync of a block a running kernel uses: %lld ms\n", (long long)ms);
  REQ_OK(freed);
  REQ(!waited);  // at once, as the driver's: before the kernel could end
  REQ(cuMemFreeAsync(flag, st) == CUDA_ERROR_INVALID_VALUE);  // freed already
  REQ(cuMemFree(flag) == CUDA_ERROR_INVALID_VALUE);
  peer.join();
  REQ_OK(cuStreamSynchronize(st));  // the kernel ended well: its flag stayed until it had
  proto::ShimRecords r;
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.size() == 2);  // the stream got there; the next allocation or free reaps it
  CUdeviceptr x = 0;
  REQ_OK(cuMemAlloc(&x, 1 << 20));
  REQ_OK(cuMemFree(x));
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.size() == 1 && r.mappings.size() == 1);  // peer_flag's: flag is gone
  REQ(r.mappings[0].address == peer_flag);
  REQ(cuMemsetD8(flag, 1, 8) == CUDA_ERROR_INVALID_VALUE);
  // The per-thread-stream form, as the runtime resolves it, on the
  // per-thread default stream.
  void* fn = nullptr;
  REQ_OK(cuGetProcAddress_v2("cuMemFreeAsync", &fn, 11020,
                             CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, nullptr));
  REQ(fn != nullptr);
  REQ_OK(reinterpret_cast<decltype(&cuMemFreeAsync)>(fn)(peer_flag, nullptr));
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.empty() && r.mappings.empty());

  CUdeviceptr d = 0, e = 0;
  REQ_OK(cuMemAlloc(&d, 1 << 20));
  REQ(cuMemFreeAsync(d, reinterpret_cast<CUstream>(0x5bad)) == CUDA_ERROR_INVALID_HANDLE);
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.size() == 1);  // not freed

  CUstream cs;
  REQ_OK(cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING));
  REQ_OK(cuStreamBeginCapture_v2(cs, CU_STREAM_CAPTURE_MODE_RELAXED));
  REQ_OK(cuMemFreeAsync(d, st));
  REQ(cuMemFreeAsync(d, st) == CUDA_ERROR_INVALID_VALUE);  // freed already
  CUstreamCaptureStatus cap = CU_STREAM_CAPTURE_STATUS_NONE;
  REQ_OK(cuStreamIsCapturing(cs, &cap));
  REQ(cap == CU_STREAM_CAPTURE_STATUS_ACTIVE);  // the capture goes on
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.size() == 1);  // deferred
  CUgraph g = nullptr;
  REQ_OK(cuStreamEndCapture(cs, &g));
  REQ_OK(cuGraphDestroy(g));
  REQ_OK(cuMemAlloc(&e, 1 << 20));
  REQ_OK(cuMemFreeAsync(e, st));  // frees the deferred block first
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.empty() && r.mappings.empty());

  // A checkpoint's drain frees a block freed in stream order once the
  // stream got there, which otherwise goes at the next allocation or free
  // only: a checkpoint does not save it.
  HeldKernel k2;
  REQ(start_held_kernel(&k2) == 0);
  REQ_OK(cuMemFreeAsync(k2.flag, k2.stream));
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.size() == 2);  // the kernel still runs
  REQ(drain_self(5000));           // waits for the kernel
  k2.peer.join();
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.size() == 1 && r.mappings.size() == 1);
  REQ(r.mappings[0].address == k2.peer_flag);
  REQ_OK(cuMemFree(k2.peer_flag));

  Child c = spawn([&](int) {
    setenv("FAKECUDA_FAIL", "cuMemCreate:1:2", 1);
    FC_REQ(init_primary() == CUDA_SUCCESS);
    CUstream s2;
    FC_REQ(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CUdeviceptr b = 0;
    FC_REQ(cuMemAlloc(&b, 1 << 20) == CUDA_SUCCESS);
    proto::ShimRecords q;
    FC_REQ(inspect(getpid(), &q));
    FC_REQ(q.allocations.empty() && q.driver_blocks == 1);  // left to the driver
    FC_REQ(cuMemFreeAsync(b, s2) == CUDA_SUCCESS);
    FC_REQ(cuStreamSynchronize(s2) == CUDA_SUCCESS);
    FC_REQ(inspect(getpid(), &q));
    FC_REQ(q.driver_blocks == 0);
    FC_REQ(cuMemFree(b) == CUDA_ERROR_INVALID_VALUE);  // the driver freed it
    return 0;
  });
  REQ(c.join() == 0);
  return 0;
}

/// A block freed in stream order stays freed while another thread reaps the
/// pending frees: its events are queried (here each query takes 1.5 s,
/// FAKECUDA_DELAY) with the list of pending frees still whole, so a second
/// free of the block meanwhile is refused, as the driver refuses a double
/// free, and the block goes once, with the reaper.
int free_async_reap() {
  Child c = spawn([](int) {
    setenv("FAKECUDA_DELAY", "cuEventQuery:1500", 1);
    FC_REQ(init_primary() == CUDA_SUCCESS);
    CUfunction fn = load_function("ncclDevKernel_Handshake");
    FC_REQ(fn != nullptr);
    CUstream st;
    FC_REQ(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CUdeviceptr flag = 0, peer_flag = 0;
    FC_REQ(cuMemAlloc(&flag, 8) == CUDA_SUCCESS && cuMemAlloc(&peer_flag, 8) == CUDA_SUCCESS);
    *word(flag) = 0;
    *word(peer_flag) = 0;
    uint64_t step = 1;
    void* args[] = {&flag, &peer_flag, &step};
    FC_REQ(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, st, args, nullptr) == CUDA_SUCCESS);
    FC_REQ(cuMemFreeAsync(flag, st) == CUDA_SUCCESS);  // pending: the kernel holds the stream
    *word(peer_flag) = 1;                              // the kernel ends
    FC_REQ(cuStreamSynchronize(st) == CUDA_SUCCESS);
    std::thread reaper([] {
      CUdeviceptr y = 0;  // an allocation reaps the pending frees first
      if (cuMemAlloc(&y, 1 << 20) == CUDA_SUCCESS) cuMemFree(y);
    });
    usleep(400 * 1000);  // the reaper is inside cuEventQuery
    const CUresult again = cuMemFree(flag);
    const CUresult again_async = cuMemFreeAsync(flag, st);
    reaper.join();
    fprintf(stderr, "frees of a pending block while it is reaped: %d, %d\n", int(again),
            int(again_async));
    FC_REQ(again == CUDA_ERROR_INVALID_VALUE);  // freed already
    FC_REQ(again_async == CUDA_ERROR_INVALID_VALUE);
    proto::ShimRecords q;
    FC_REQ(inspect(getpid(), &q));
    FC_REQ(q.allocations.size() == 1 && q.mappings.size() == 1);  // peer_flag's: flag went
    FC_REQ(q.mappings[0].address == peer_flag);
    FC_REQ(cuMemFree(flag) == CUDA_ERROR_INVALID_VALUE);
    FC_REQ(cuMemFree(peer_flag) == CUDA_SUCCESS);
    return 0;
  });
  REQ(c.join() == 0);
  return 0;
}

/// The blocks the shim served in a context go with the context, as the
/// driver's cuMemAlloc blocks do and its VMM memory does not: cuCtxDestroy,
/// cuDevicePrimaryCtxReset (cudaDeviceReset), the primary context's last
/// release; blocks of another context, and a release that is not the last,
/// leave them. SYNC_MEMOPS on a block sets its context's flag.
int context_blocks() {
  REQ_OK(cuInit(0));
  CUdevice dev;
  REQ_OK(cuDeviceGet(&dev, 0));
  CUcontext own = nullptr, primary = nullptr;
  REQ_OK(cuCtxCreate(&own, nullptr, 0, dev));
  CUdeviceptr a = 0, b = 0;
  REQ_OK(cuMemAlloc(&a, 1 << 20));
  REQ_OK(cuDevicePrimaryCtxRetain(&primary, dev));
  REQ_OK(cuCtxSetCurrent(primary));
  REQ_OK(cuMemAlloc(&b, 1 << 20));
  proto::ShimRecords r;
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.size() == 2);
  // SYNC_MEMOPS on a block lands on the block's context, not the current
  // one; the block's attribute reads what was set with any context current,
  // the other block's 0, as on the driver (alloc_sizes.cpp ctx_attrs).
  unsigned one = 1, zero = 0, flags = 0, sync = 7;
  REQ_OK(cuPointerGetAttribute(&sync, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, a));
  REQ(sync == 0);
  REQ_OK(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, a));
  REQ_OK(cuCtxGetFlags(&flags));
  REQ(!(flags & CU_CTX_SYNC_MEMOPS));
  REQ_OK(cuPointerGetAttribute(&sync, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, a + 8));
  REQ(sync == 1);
  REQ_OK(cuPointerGetAttribute(&sync, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, b));
  REQ(sync == 0);
  REQ_OK(cuCtxPushCurrent(own));
  REQ_OK(cuCtxGetFlags(&flags));
  REQ(flags & CU_CTX_SYNC_MEMOPS);
  sync = 0;
  {
    CUpointer_attribute which[1] = {CU_POINTER_ATTRIBUTE_SYNC_MEMOPS};
    void* data[1] = {&sync};
    REQ_OK(cuPointerGetAttributes(1, which, data, a));
    REQ(sync == 1);
  }
  REQ_OK(cuCtxPopCurrent(&own));
  // Cleared, the attribute reads 0 (the context's flag stays: stronger).
  REQ_OK(cuPointerSetAttribute(&zero, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, a));
  REQ_OK(cuPointerGetAttribute(&sync, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, a));
  REQ(sync == 0);
  REQ_OK(cuCtxDestroy(own));
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.size() == 1 && r.mappings.size() == 1 && r.mappings[0].address == b);
  REQ(cuMemFree(a) == CUDA_ERROR_INVALID_VALUE);  // gone with its context
  REQ_OK(cuDevicePrimaryCtxReset(dev));
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.empty() && r.mappings.empty());

  REQ_OK(cuDevicePrimaryCtxRetain(&primary, dev));
  REQ_OK(cuDevicePrimaryCtxRetain(&primary, dev));
  REQ_OK(cuCtxSetCurrent(primary));
  REQ_OK(cuMemAlloc(&b, 1 << 20));
  REQ_OK(cuDevicePrimaryCtxRelease(dev));  // not the last
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.size() == 1);
  REQ_OK(cuDevicePrimaryCtxRelease(dev));
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.empty() && r.mappings.empty());

  // A block of the primary context freed in stream order on a stream of a
  // created context goes with that context: the event that marked the free
  // went with it (before, the free waited on an event gone).
  REQ_OK(cuDevicePrimaryCtxRetain(&primary, dev));
  REQ_OK(cuCtxSetCurrent(primary));
  CUdeviceptr c = 0;
  REQ_OK(cuMemAlloc(&c, 1 << 20));
  CUcontext other = nullptr;
  REQ_OK(cuCtxCreate(&other, nullptr, 0, dev));
  HeldKernel k;
  REQ(start_held_kernel(&k) == 0);
  REQ_OK(cuMemFreeAsync(c, k.stream));
  k.peer.join();
  REQ_OK(cuStreamSynchronize(k.stream));
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.size() == 3);  // c waits for the next allocation or free
  REQ_OK(cuCtxDestroy(other));
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.empty() && r.mappings.empty());  // k's blocks with their context, c too
  REQ_OK(cuDevicePrimaryCtxRelease(dev));
  return 0;
}

namespace {

/// Device 0's primary context, retained, and a context created on it
/// (current after).
bool primary_and_created(CUdevice* dev, CUcontext* primary, CUcontext* own) {
  return cuInit(0) == CUDA_SUCCESS && cuDeviceGet(dev, 0) == CUDA_SUCCESS &&
         cuDevicePrimaryCtxRetain(primary, *dev) == CUDA_SUCCESS &&
         cuCtxCreate(own, nullptr, 0, *dev) == CUDA_SUCCESS;
}

}  // namespace

/// A legacy IPC open goes with the context it was made in, as the driver
/// closes it (measured on an H100: tests/gpu/probes/context_ipc.cpp):
/// cuCtxDestroy and cuDevicePrimaryCtxReset take the shim's open (its import
/// unmapped and released, nothing left to save) and a foreign one (the
/// driver's own, no longer counted against a checkpoint); the address is
/// unknown after, its close refused, and a new open succeeds. Meanwhile
/// another context of the device may not open the handle (measured on an
/// H200), one of another device may. The exporter's block left to the
/// driver stops being counted at its context's reset.
int context_ipc() {
  Child e = spawn([&](int sock) {
    setenv("FAKECUDA_FAIL", "cuMemCreate:2:2", 1);  // the second block is left to the driver
    FC_REQ(init_primary() == CUDA_SUCCESS);
    CUdeviceptr served = 0, driver = 0;
    FC_REQ(cuMemAlloc(&served, 1 << 20) == CUDA_SUCCESS);
    FC_REQ(cuMemAlloc(&driver, 1 << 20) == CUDA_SUCCESS);
    proto::ShimRecords q;
    FC_REQ(inspect(getpid(), &q));
    FC_REQ(q.allocations.size() == 1 && q.driver_blocks == 1);
    fill(served, 1 << 20, 0x71);
    CUipcMemHandle h[2];
    FC_REQ(cuIpcGetMemHandle(&h[0], served) == CUDA_SUCCESS);
    FC_REQ(cuIpcGetMemHandle(&h[1], driver) == CUDA_SUCCESS);
    FC_REQ(write(sock, h, sizeof h) == static_cast<ssize_t>(sizeof h));
    uint64_t done = 0;
    FC_REQ(recv_u64(sock, &done));
    // The block left to the driver goes with its context too: no longer counted.
    CUdevice dev;
    FC_REQ(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
    FC_REQ(cuDevicePrimaryCtxReset(dev) == CUDA_SUCCESS);
    FC_REQ(inspect(getpid(), &q));
    FC_REQ(q.allocations.empty() && q.driver_blocks == 0);
    return 0;
  });
  CUipcMemHandle h[2];
  REQ(read(e.sock, h, sizeof h) == static_cast<ssize_t>(sizeof h));
  CUdevice dev;
  CUcontext own = nullptr, primary = nullptr;
  REQ(primary_and_created(&dev, &primary, &own));
  proto::ShimRecords r;
  for (int reset = 0; reset < 2; ++reset) {
    CUdeviceptr p = 0, f = 0;
    REQ_OK(cuIpcOpenMemHandle(&p, h[0], CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    REQ_OK(cuIpcOpenMemHandle(&f, h[1], CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    REQ(all(p, 1 << 20, 0x71));
    REQ(inspect(getpid(), &r));
    REQ(r.ipc.size() == 2 && r.allocations.size() == 1 && r.foreign_imports_alive == 1);
    // The primary context of the device may not open the same handle
    // meanwhile (the driver's answer, measured on an H200); a context of
    // another device may, and its open stays at the created context's
    // destroy.
    CUdeviceptr kept = 0;
    CUcontext other = nullptr;
    if (!reset) {
      REQ_OK(cuCtxSetCurrent(primary));
      REQ(cuIpcOpenMemHandle(&kept, h[0], CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) ==
          CUDA_ERROR_INVALID_HANDLE);
      CUdevice dev1;
      REQ_OK(cuDeviceGet(&dev1, 1));
      REQ_OK(cuCtxCreate(&other, nullptr, 0, dev1));
      REQ_OK(cuIpcOpenMemHandle(&kept, h[0], CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
      REQ(kept != 0 && kept != p);
      REQ_OK(cuCtxSetCurrent(own));
    }
    if (reset) {
      REQ_OK(cuDevicePrimaryCtxReset(dev));
      REQ_OK(cuDevicePrimaryCtxRetain(&primary, dev));
    } else {
      REQ_OK(cuCtxDestroy(own));
    }
    REQ_OK(cuCtxSetCurrent(primary));
    REQ(inspect(getpid(), &r));
    const size_t left = kept ? 1 : 0;  // the primary context's open
    REQ(r.ipc.size() == left && r.allocations.size() == left && r.mappings.size() == left);
    REQ(r.foreign_imports_alive == 0 && r.foreign_imports_total == unsigned(reset + 1));
    CUdeviceptr base = 0;
    size_t size = 0;
    REQ(cuMemGetAddressRange(&base, &size, p) == CUDA_ERROR_NOT_FOUND);
    REQ(cuIpcCloseMemHandle(p) == CUDA_ERROR_INVALID_VALUE);
    REQ(cuIpcCloseMemHandle(f) == CUDA_ERROR_INVALID_VALUE);
    if (kept) {
      REQ(all(kept, 1 << 20, 0x71));
      REQ_OK(cuCtxSetCurrent(other));
      REQ_OK(cuIpcCloseMemHandle(kept));
      REQ_OK(cuCtxDestroy(other));
      REQ_OK(cuCtxSetCurrent(primary));
      REQ(inspect(getpid(), &r));
      REQ(r.ipc.empty() && r.allocations.empty() && r.mappings.empty());
    }
  }
  REQ(send_u64(e.sock, 1));
  REQ(e.join() == 0);
  return 0;
}

/// Two threads open one handle at the same moment (each open's mapping
/// slowed, so both pass the first look before either is recorded): in two
/// contexts of the device one open succeeds and the other is refused
/// (INVALID_HANDLE), as the driver refuses a second context's open; in one
/// context both succeed at one address, counted twice, as the driver's open
/// of a handle open already. The loser's mapping goes.
int ipc_open_race() {
  setenv("FAKECUDA_DELAY", "cuMemMap:300", 1);
  Child e = spawn([&](int sock) {
    FC_REQ(init_primary() == CUDA_SUCCESS);
    CUdeviceptr d = 0;
    FC_REQ(cuMemAlloc(&d, 1 << 20) == CUDA_SUCCESS);
    fill(d, 1 << 20, 0x73);
    CUipcMemHandle h;
    FC_REQ(cuIpcGetMemHandle(&h, d) == CUDA_SUCCESS);
    FC_REQ(write(sock, &h, sizeof h) == static_cast<ssize_t>(sizeof h));
    uint64_t done = 0;
    FC_REQ(recv_u64(sock, &done));
    return 0;
  });
  CUipcMemHandle h;
  REQ(read(e.sock, &h, sizeof h) == static_cast<ssize_t>(sizeof h));
  CUdevice dev;
  CUcontext own = nullptr, primary = nullptr;
  REQ(primary_and_created(&dev, &primary, &own));
  proto::ShimRecords r;
  for (const bool one_context : {false, true}) {
    CUresult res[2] = {CUDA_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN};
    CUdeviceptr at[2] = {0, 0};
    std::thread t[2];
    for (int i = 0; i < 2; ++i)
      t[i] = std::thread([&, i] {
        if (cuCtxSetCurrent(i == 0 || one_context ? primary : own) == CUDA_SUCCESS)
          res[i] = cuIpcOpenMemHandle(&at[i], h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
      });
    for (auto& th : t) th.join();
    REQ(inspect(getpid(), &r));
    REQ(r.ipc.size() == 1 && r.allocations.size() == 1 && r.mappings.size() == 1);
    REQ(r.tailed_blocks == 1);  // the open that stands: the losing mapping has none
    REQ_OK(cuCtxSetCurrent(primary));
    if (one_context) {
      REQ(res[0] == CUDA_SUCCESS && res[1] == CUDA_SUCCESS);
      REQ(at[0] == at[1] && at[0] != 0 && r.ipc[0].opens == 2);
      REQ(all(at[0], 1 << 20, 0x73));
      REQ_OK(cuIpcCloseMemHandle(at[0]));
      REQ_OK(cuIpcCloseMemHandle(at[1]));
    } else {
      const int won = res[0] == CUDA_SUCCESS ? 0 : 1;
      REQ(res[won] == CUDA_SUCCESS && res[1 - won] == CUDA_ERROR_INVALID_HANDLE);
      REQ(at[1 - won] == 0);  // a refused open writes no address
      REQ(r.ipc[0].address == at[won] && r.ipc[0].opens == 1);
      REQ_OK(cuCtxSetCurrent(won == 0 ? primary : own));
      REQ(all(at[won], 1 << 20, 0x73));
      REQ_OK(cuIpcCloseMemHandle(at[won]));
      REQ_OK(cuCtxSetCurrent(primary));
    }
    REQ(inspect(getpid(), &r));
    REQ(r.ipc.empty() && r.allocations.empty() && r.mappings.empty());
    REQ(r.tailed_blocks == 0);  // the 1 MiB open's tail, with the open that won or both
  }
  REQ_OK(cuCtxDestroy(own));
  REQ(send_u64(e.sock, 1));
  REQ(e.join() == 0);
  return 0;
}

}  // namespace track_test
