// alloc_sizes.cpp: what the driver reports of a cuMemAlloc block's size and
// alignment, for sizes from one byte to a few MiB: cuMemGetAddressRange of
// the block's base and of its last requested byte, the RANGE_SIZE pointer
// attribute, and the base's alignment; then whether an address one past the
// requested size (inside a rounded range) is known, and whether a refused
// query wrote its output variables (there, at a freed block and at a low
// address); for the first block, what the pointer
// attributes answer there, one by one and together. With the
// argument `tail`, only an IPC handle, copies and memsets at and across the
// ends of three blocks (1 MiB, 2 MiB, 65537 bytes). With `ipc_tail`, the
// same at the ends of such blocks as another process opened them from their
// IPC handles (cuIpcOpenMemHandle); with `ipc_attrs`, the pointer attributes
// of such an open at its base and one past its end, and whether it can be
// exported again (cuIpcGetMemHandle), and what cuMemGetAccess and
// cuMemSetAccess do with it; with `ctx_attrs`, which context a block and a
// VMM mapping name when other contexts are current, what
// cuPointerSetAttribute(SYNC_MEMOPS) of a block sets, and what
// cuMemGetAccess and cuMemSetAccess do with a block, its tail, a freed block
// and a VMM mapping; with `peer_attrs` (two GPUs), the access a block answers
// to another device's context before, while and after peer access. Run on the driver alone
// and under `cusnap launch` (where the shim serves the block from a VMM
// allocation), and by scripts/gpu-test-shim.sh with and without the shim (the
// output must be the same). Addresses are not printed: they differ from run
// to run.
// Build: g++ -O1 -o alloc_sizes alloc_sizes.cpp -I$CUDA/include -L$CUDA/lib64/stubs -lcuda
#include <cuda.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "probe_util.h"

/// The largest power of two, up to 2 MiB, that divides p.
static unsigned long long alignment(CUdeviceptr p) {
  unsigned long long a = 1;
  while (a < (2ull << 20) && p % (a * 2) == 0) a *= 2;
  return a;
}

/// What an output variable holds before a query: a failed query that leaves
/// it so wrote nothing.
static constexpr unsigned long long kUntouched = 0x5a5a5a5a5a5a5a5aull;

static void range(const char* what, CUdeviceptr p, CUdeviceptr block) {
  CUdeviceptr base = kUntouched;
  size_t size = kUntouched;
  const CUresult r = cuMemGetAddressRange(&base, &size, p);
  if (r == CUDA_SUCCESS)
    std::printf(" %s: base%s size %zu", what, base == block ? "" : " elsewhere", size);
  else if (base == kUntouched && size == kUntouched)
    std::printf(" %s: %s (untouched)", what, name(r));
  else if (base == 0 || base == kUntouched)
    std::printf(" %s: %s (written: base %s, size %#zx)", what, name(r),
                base == 0 ? "0" : "untouched", size);
  else  // what the driver wrote: an address differs from run to run, its
        // distance from the block does not
    std::printf(" %s: %s (written: base block%+lld, size %#zx)", what, name(r),
                static_cast<long long>(base - block), size);
}

/// An attribute's value as printed: a context as the current one or
/// another, a buffer id as nonzero (both differ from run to run), an
/// address as such, anything else in hex.
static void print_value(CUpointer_attribute a, unsigned long long v) {
  CUcontext cur = nullptr;
  if (a == CU_POINTER_ATTRIBUTE_CONTEXT && v != 0) {
    cuCtxGetCurrent(&cur);
    std::printf(" %s", v == reinterpret_cast<unsigned long long>(cur) ? "the current context"
                                                                      : "another context");
  } else if (a == CU_POINTER_ATTRIBUTE_BUFFER_ID && v != 0) {
    std::printf(" nonzero");
  } else if (v < (1ull << 32) || v > ~0xffffull) {
    std::printf(" %#llx", v);
  } else {
    std::printf(" an address");
  }
}

/// The pointer attributes of p, one at a time and all in one
/// cuPointerGetAttributes (wide enough variables, zeroed first).
static void attributes(CUdeviceptr p) {
  static const struct {
    CUpointer_attribute a;
    const char* name;
  } kAttrs[] = {{CU_POINTER_ATTRIBUTE_CONTEXT, "CONTEXT"},
                {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, "MEMORY_TYPE"},
                {CU_POINTER_ATTRIBUTE_DEVICE_POINTER, "DEVICE_POINTER"},
                {CU_POINTER_ATTRIBUTE_BUFFER_ID, "BUFFER_ID"},
                {CU_POINTER_ATTRIBUTE_IS_MANAGED, "IS_MANAGED"},
                {CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, "DEVICE_ORDINAL"},
                {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, "RANGE_START_ADDR"},
                {CU_POINTER_ATTRIBUTE_RANGE_SIZE, "RANGE_SIZE"},
                {CU_POINTER_ATTRIBUTE_MAPPED, "MAPPED"},
                {CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, "IS_LEGACY_CUDA_IPC_CAPABLE"},
                {CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, "ALLOWED_HANDLE_TYPES"},
                {CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, "ACCESS_FLAGS"},
                {CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, "MEMPOOL_HANDLE"}};
  const unsigned n = sizeof(kAttrs) / sizeof(kAttrs[0]);
  unsigned long long all[n] = {};
  CUpointer_attribute which[n];
  void* data[n];
  for (unsigned i = 0; i < n; ++i) {
    unsigned long long v = kUntouched;
    const CUresult r = cuPointerGetAttribute(&v, kAttrs[i].a, p);
    std::printf("   %-28s %s", kAttrs[i].name, name(r));
    if (r != CUDA_SUCCESS) std::printf(" (%s)", v == kUntouched ? "untouched" : "written");
    // What the driver wrote in a narrower variable: the rest still untouched.
    if ((v >> 8) == (kUntouched >> 8))
      v &= 0xff;
    else if ((v >> 32) == (kUntouched >> 32))
      v &= 0xffffffffull;
    if (r == CUDA_SUCCESS) print_value(kAttrs[i].a, v);
    std::printf("\n");
    which[i] = kAttrs[i].a;
    data[i] = &all[i];
  }
  const CUresult r = cuPointerGetAttributes(n, which, data, p);
  std::printf("   cuPointerGetAttributes: %s\n", name(r));
  for (unsigned i = 0; r == CUDA_SUCCESS && i < n; ++i) {
    std::printf("   %-28s", kAttrs[i].name);
    print_value(kAttrs[i].a, all[i]);
    std::printf("\n");
  }
}

/// cuMemGetAccess of p for device dev, and cuMemSetAccess (read-write for
/// dev) of n bytes and of 2 MiB from p: what the driver says of them for
/// memory that is no VMM mapping to the application.
static void access_calls(const char* what, CUdeviceptr p, size_t n, CUdevice dev) {
  CUmemLocation loc{};
  loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
  loc.id = dev;
  unsigned long long flags = 7;
  const CUresult g = cuMemGetAccess(&flags, &loc, p);
  std::printf("  %s: cuMemGetAccess %s", what, name(g));
  if (g == CUDA_SUCCESS) std::printf(" %llu", flags);
  CUmemAccessDesc acc{};
  acc.location = loc;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  std::printf(", cuMemSetAccess of %zu bytes %s, of 2 MiB %s\n", n,
              name(cuMemSetAccess(p, n, &acc, 1)), name(cuMemSetAccess(p, 2 << 20, &acc, 1)));
}

/// What the driver does with the bytes just past a block of n bytes (for
/// 1 MiB, inside the 2 MiB page it was placed in): an IPC handle of that
/// address, copies and memsets that end there, start there or straddle the
/// block's end. Alone (argument `tail`): a copy the driver accepts that then
/// faults would leave the context unusable.
static void tail_operations(size_t n) {
  // The other side of the copies first, whole pages: the driver places a
  // small block in the rest of an earlier one's page, and one placed past p
  // would make p's end another block's bytes.
  CUdeviceptr p = 0, q = 0;
  if (cuMemAlloc(&q, 4 << 20) != CUDA_SUCCESS || cuMemAlloc(&p, n) != CUDA_SUCCESS) return;
  CUstream st = nullptr;
  if (cuStreamCreate(&st, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return;
  CUcontext ctx = nullptr;
  cuCtxGetCurrent(&ctx);
  unsigned char buf[128] = {};
  CUipcMemHandle h;
  std::printf("past a %zu-byte block:\n", n);
  std::printf("  cuIpcGetMemHandle at the last byte: %s\n", name(cuIpcGetMemHandle(&h, p + n - 1)));
  std::printf("  cuIpcGetMemHandle one past: %s\n", name(cuIpcGetMemHandle(&h, p + n)));
  std::printf("  cuMemcpyHtoD up to the end: %s\n", name(cuMemcpyHtoD(p + n - 16, buf, 16)));
  std::printf("  cuMemsetD8 up to the end: %s\n", name(cuMemsetD8(p + n - 16, 0x5a, 16)));
  std::printf("  cuMemcpyHtoD one past: %s\n", name(cuMemcpyHtoD(p + n, buf, 16)));
  std::printf("  cuMemcpyHtoD across the end: %s\n", name(cuMemcpyHtoD(p + n - 8, buf, 16)));
  std::printf("  cuMemcpyHtoDAsync across the end: %s\n",
              name(cuMemcpyHtoDAsync(p + n - 8, buf, 16, st)));
  std::printf("  cuMemcpyDtoH across the end: %s\n", name(cuMemcpyDtoH(buf, p + n - 8, 16)));
  std::printf("  cuMemcpyDtoD across the end: %s\n", name(cuMemcpyDtoD(q, p + n - 8, 16)));
  std::printf("  cuMemcpy across the end: %s\n", name(cuMemcpy(p + n - 8, q, 16)));
  std::printf("  cuMemcpyPeer across the end: %s\n",
              name(cuMemcpyPeer(q, ctx, p + n - 8, ctx, 16)));
  std::printf("  cuMemsetD8 one past: %s\n", name(cuMemsetD8(p + n, 0x5a, 16)));
  std::printf("  cuMemsetD8 across the end: %s\n", name(cuMemsetD8(p + n - 8, 0x5a, 16)));
  std::printf("  cuMemsetD32 across the end: %s\n", name(cuMemsetD32(p + n - 8, 0x5a5a5a5a, 3)));
  std::printf("  cuMemsetD8Async across the end: %s\n",
              name(cuMemsetD8Async(p + n - 8, 0x5a, 16, st)));
  std::printf("  cuMemsetD2D8 second row across the end: %s\n",
              name(cuMemsetD2D8(p + n - 72, 64, 0x5a, 16, 2)));
  std::printf("  cuMemsetD2D8 second row up to the end: %s\n",
              name(cuMemsetD2D8(p + n - 80, 64, 0x5a, 16, 2)));
  std::printf("  cuStreamSynchronize: %s\n", name(cuStreamSynchronize(st)));
  std::printf("  cuCtxSynchronize: %s\n", name(cuCtxSynchronize()));
  cuStreamDestroy(st);
  std::printf("  free %s %s\n", name(cuMemFree(p)), name(cuMemFree(q)));
}

/// The sizes of the blocks ipc_tail opens.
static const size_t kIpcSizes[] = {size_t(1) << 20, size_t(2) << 20, 65537};

/// The exporter of ipc_tail (forked before cuInit): each block of kIpcSizes,
/// after a 4 MiB one (whole pages, as in tail_operations), filled with 7s,
/// its IPC handle sent once the fill is done. Waits for a byte (or the
/// parent's end), then frees them.
static int ipc_exporter(int to_parent, int from_parent) {
  if (!init_primary()) return 1;
  CUdeviceptr q = 0;
  if (cuMemAlloc(&q, 4 << 20) != CUDA_SUCCESS) return 1;
  CUdeviceptr blocks[3] = {};
  CUipcMemHandle h[3] = {};
  for (int i = 0; i < 3; ++i)
    if (cuMemAlloc(&blocks[i], kIpcSizes[i]) != CUDA_SUCCESS ||
        cuMemsetD8(blocks[i], 7, kIpcSizes[i]) != CUDA_SUCCESS ||
        cuIpcGetMemHandle(&h[i], blocks[i]) != CUDA_SUCCESS)
      return 1;
  if (cuCtxSynchronize() != CUDA_SUCCESS) return 1;
  if (write(to_parent, h, sizeof(h)) != sizeof(h)) return 1;
  char go;
  (void)!read(from_parent, &go, 1);
  for (CUdeviceptr b : blocks) cuMemFree(b);
  cuMemFree(q);
  return 0;
}

/// Copies and memsets at and across the end of an opened block of n bytes.
static void ipc_tail_operations(CUipcMemHandle h, size_t n) {
  CUdeviceptr p = 0, q = 0;
  std::printf("past a %zu-byte block opened from its IPC handle:\n", n);
  const CUresult r = cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  std::printf("  cuIpcOpenMemHandle: %s\n", name(r));
  if (r != CUDA_SUCCESS) return;
  CUstream st = nullptr;
  if (cuMemAlloc(&q, 4 << 20) != CUDA_SUCCESS ||
      cuStreamCreate(&st, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
    std::printf("  cannot set up: close %s\n", name(cuIpcCloseMemHandle(p)));
    if (q) cuMemFree(q);
    return;
  }
  unsigned char buf[128] = {};
  CUdeviceptr base = 0;
  size_t size = 0;
  const CUresult rg = cuMemGetAddressRange(&base, &size, p);
  std::printf("  cuMemGetAddressRange: %s", name(rg));
  if (rg == CUDA_SUCCESS) std::printf(", base%s size %zu", base == p ? "" : " elsewhere", size);
  std::printf("\n");
  // Past a block of whole granules lies whatever the driver placed next:
  // its answers there are not the block's.
  const bool tail = n % (size_t(2) << 20) != 0;
  if (tail)
    std::printf("  cuMemGetAddressRange one past: %s\n",
                name(cuMemGetAddressRange(&base, &size, p + n)));
  std::printf("  cuMemcpyDtoH up to the end: %s", name(cuMemcpyDtoH(buf, p + n - 16, 16)));
  std::printf(", last byte %d\n", buf[15]);
  std::printf("  cuMemsetD8 up to the end: %s\n", name(cuMemsetD8(p + n - 16, 0x5a, 16)));
  if (tail) std::printf("  cuMemcpyDtoH one past: %s\n", name(cuMemcpyDtoH(buf, p + n, 16)));
  std::printf("  cuMemcpyDtoH across the end: %s\n", name(cuMemcpyDtoH(buf, p + n - 8, 16)));
  std::printf("  cuMemcpyHtoD across the end: %s\n", name(cuMemcpyHtoD(p + n - 8, buf, 16)));
  std::printf("  cuMemcpyDtoD across the end: %s\n", name(cuMemcpyDtoD(q, p + n - 8, 16)));
  if (tail) std::printf("  cuMemsetD8 one past: %s\n", name(cuMemsetD8(p + n, 0x5a, 16)));
  std::printf("  cuMemsetD8 across the end: %s\n", name(cuMemsetD8(p + n - 8, 0x5a, 16)));
  std::printf("  cuMemsetD8Async across the end: %s\n",
              name(cuMemsetD8Async(p + n - 8, 0x5a, 16, st)));
  std::printf("  cuStreamSynchronize: %s\n", name(cuStreamSynchronize(st)));
  std::printf("  cuCtxSynchronize: %s\n", name(cuCtxSynchronize()));
  cuStreamDestroy(st);
  std::printf("  close %s, free %s\n", name(cuIpcCloseMemHandle(p)), name(cuMemFree(q)));
}

/// The pointer attributes of an opened block of n bytes, at its base and one
/// past its end, a few more at its base, cuPointerSetAttribute(SYNC_MEMOPS),
/// cuIpcGetMemHandle, cuMemUnmap, cuMemGetAccess and cuMemSetAccess of the
/// open.
static void ipc_attr_queries(CUipcMemHandle h, size_t n) {
  CUdeviceptr p = 0;
  std::printf("a %zu-byte block opened from its IPC handle:\n", n);
  const CUresult r = cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  std::printf("  cuIpcOpenMemHandle: %s\n", name(r));
  if (r != CUDA_SUCCESS) return;
  std::printf("  at its base:\n");
  attributes(p);
  std::printf("  one past its end:\n");
  attributes(p + n);
  // The mapping's own attributes, RDMA, and the synchronous-memops flag.
  static const struct {
    CUpointer_attribute a;
    const char* name;
  } kMore[] = {{CU_POINTER_ATTRIBUTE_MAPPING_SIZE, "MAPPING_SIZE"},
               {CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, "MAPPING_BASE_ADDR"},
               {CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, "IS_GPU_DIRECT_RDMA_CAPABLE"}};
  for (const auto& m : kMore) {
    unsigned long long v = 0;
    const CUresult r = cuPointerGetAttribute(&v, m.a, p);
    std::printf("   %-28s %s", m.name, name(r));
    if (r == CUDA_SUCCESS && m.a == CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR)
      std::printf(" %s", v == p ? "the base" : "elsewhere");
    else if (r == CUDA_SUCCESS)
      std::printf(" %#llx", v);
    std::printf("\n");
  }
  const unsigned sync = 1;
  std::printf("   cuPointerSetAttribute(SYNC_MEMOPS): %s\n",
              name(cuPointerSetAttribute(&sync, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p)));
  unsigned long long back = 7;
  const CUresult rb = cuPointerGetAttribute(&back, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p);
  std::printf("   SYNC_MEMOPS read back: %s %llu\n", name(rb), rb == CUDA_SUCCESS ? back : 7ull);
  CUipcMemHandle again;
  std::printf("  cuIpcGetMemHandle of the open: %s\n", name(cuIpcGetMemHandle(&again, p)));
  std::printf("  cuMemUnmap of the open: %s\n", name(cuMemUnmap(p, n)));
  access_calls("the open", p, n, 0);
  std::printf("  close %s\n", name(cuIpcCloseMemHandle(p)));
}

/// ipc_tail and ipc_attrs: a child exports blocks; this process opens each
/// and runs per_block on it. Each side holds only its own ends of the pipes,
/// so either one ending early ends the other's wait.
static int ipc_blocks(void (*per_block)(CUipcMemHandle, size_t)) {
  int up[2], down[2];
  if (pipe(up) != 0 || pipe(down) != 0) return 1;
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    close(up[0]);
    close(down[1]);
    _exit(ipc_exporter(up[1], down[0]));
  }
  close(up[1]);
  close(down[0]);
  CUipcMemHandle h[3];
  const bool got = read(up[0], h, sizeof(h)) == sizeof(h);
  if (!got) std::printf("the exporter sent no handles\n");
  if (got && !init_primary())
    std::printf("cuInit failed\n");
  else if (got)
    for (int i = 0; i < 3; ++i) per_block(h[i], kIpcSizes[i]);
  std::fflush(stdout);
  close(down[1]);  // the exporter frees its blocks and ends
  close(up[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  std::printf("exporter exit status %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return got ? 0 : 1;
}

/// Which of the probe's contexts c is.
static const char* ctx_name(CUcontext c, CUcontext primary, CUcontext a, CUcontext b) {
  if (c == nullptr) return "none";
  if (c == a) return "A";
  if (c == b) return "B";
  if (c == primary) return "the primary";
  return "another";
}

/// ctx_attrs: the context the driver names (CU_POINTER_ATTRIBUTE_CONTEXT)
/// for a cuMemAlloc block made in a created context A and for a VMM mapping
/// made with A current, asked with A, the primary and another created
/// context B current, one attribute and in cuPointerGetAttributes; then,
/// with B current, the block's SYNC_MEMOPS (and how many bytes the driver
/// writes of it), cuPointerSetAttribute(SYNC_MEMOPS) of the block, what the
/// attribute then reads with each context current, and which contexts'
/// flags have CU_CTX_SYNC_MEMOPS; last, cuMemGetAccess and cuMemSetAccess
/// of the block, of the mapping, of the block's tail and of the block once
/// freed.
static int ctx_attrs() {
  CUdevice dev = 0;
  if (!init_primary(&dev)) return 1;
  CUcontext primary = nullptr, a = nullptr, b = nullptr;
  cuCtxGetCurrent(&primary);
  if (cuCtxCreate(&a, nullptr, 0, dev) != CUDA_SUCCESS ||
      cuCtxCreate(&b, nullptr, 0, dev) != CUDA_SUCCESS) {
    std::printf("cuCtxCreate failed\n");
    return 1;
  }
  cuCtxSetCurrent(a);
  CUdeviceptr blk = 0;
  std::printf("cuMemAlloc(1 MiB) with A current: %s\n", name(cuMemAlloc(&blk, 1 << 20)));
  const CUmemAllocationProp prop = device_prop(dev);
  const CUmemAccessDesc acc = rw_access(prop);
  size_t g = 0;
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr vmm = 0;
  CUresult r = cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r == CUDA_SUCCESS) r = cuMemCreate(&h, g, &prop, 0);
  if (r == CUDA_SUCCESS) r = cuMemAddressReserve(&vmm, g, 0, 0, 0);
  if (r == CUDA_SUCCESS) r = cuMemMap(vmm, g, 0, h, 0);
  const bool mapped = r == CUDA_SUCCESS;
  if (r == CUDA_SUCCESS) r = cuMemSetAccess(vmm, g, &acc, 1);
  std::printf("a VMM mapping made with A current: %s\n", name(r));
  const struct {
    const char* name;
    CUcontext ctx;
  } kCurrent[] = {{"A", a}, {"the primary", primary}, {"B", b}};
  const struct {
    const char* name;
    CUdeviceptr p;
  } kWhere[] = {{"the block", blk}, {"the mapping", r == CUDA_SUCCESS ? vmm : 0}};
  for (const auto& c : kCurrent) {
    cuCtxSetCurrent(c.ctx);
    for (const auto& w : kWhere) {
      if (!w.p) continue;
      CUcontext in = reinterpret_cast<CUcontext>(kUntouched);
      const CUresult q = cuPointerGetAttribute(&in, CU_POINTER_ATTRIBUTE_CONTEXT, w.p);
      CUpointer_attribute which[1] = {CU_POINTER_ATTRIBUTE_CONTEXT};
      CUcontext all = reinterpret_cast<CUcontext>(kUntouched);
      void* data[1] = {&all};
      const CUresult qa = cuPointerGetAttributes(1, which, data, w.p);
      std::printf("  %s current, CONTEXT of %s: %s %s; in cuPointerGetAttributes: %s %s\n", c.name,
                  w.name, name(q), q == CUDA_SUCCESS ? ctx_name(in, primary, a, b) : "-", name(qa),
                  qa == CUDA_SUCCESS ? ctx_name(all, primary, a, b) : "-");
    }
  }
  cuCtxSetCurrent(b);
  {  // before it is set, and how wide the driver writes it
    unsigned long long v = kUntouched;
    const CUresult q = cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, blk);
    const int bytes = (v >> 8) == (kUntouched >> 8)     ? 1
                      : (v >> 16) == (kUntouched >> 16) ? 2
                      : (v >> 32) == (kUntouched >> 32) ? 4
                                                        : 8;
    std::printf("  B current, SYNC_MEMOPS of the block before: %s %llu (%d bytes written)\n",
                name(q), q == CUDA_SUCCESS ? v & ((1ull << (bytes * 8 - 1)) * 2 - 1) : 7ull, bytes);
  }
  const unsigned one = 1;
  std::printf("  B current, cuPointerSetAttribute(SYNC_MEMOPS) of the block: %s\n",
              name(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, blk)));
  for (const auto& c : kCurrent) {
    cuCtxSetCurrent(c.ctx);
    unsigned long long v = 0;  // as wide as the driver may write
    unsigned flags = 0;
    const CUresult q = cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, blk);
    std::printf("  %s current: SYNC_MEMOPS of the block %s %llu\n", c.name, name(q),
                q == CUDA_SUCCESS ? v : 7ull);
    // The shim's way to the guarantee for VMM memory shows here (by design):
    // gpu-test-shim.sh leaves these lines out of its comparison.
    const CUresult f = cuCtxGetFlags(&flags);
    std::printf("  %s current: context flags %s, SYNC_MEMOPS %s\n", c.name, name(f),
                flags & CU_CTX_SYNC_MEMOPS ? "set" : "clear");
  }
  cuCtxSetCurrent(a);
  for (const auto& w : kWhere)
    if (w.p) access_calls(w.name, w.p, 1 << 20, dev);
  // Past the block's bytes, inside the granule it was rounded to (no memory
  // to cuMemGetAddressRange), and a freed block's base.
  access_calls("the block's tail", blk + (1 << 20) + 4096, 4096, dev);
  const CUresult freed = cuMemFree(blk);
  access_calls("the freed block", blk, 1 << 20, dev);
  std::printf("  free %s", name(freed));
  if (mapped) std::printf(", unmap %s", name(cuMemUnmap(vmm, g)));
  if (vmm) cuMemAddressFree(vmm, g);
  if (h) cuMemRelease(h);
  std::printf(", destroy A %s, B %s\n", name(cuCtxDestroy(a)), name(cuCtxDestroy(b)));
  return 0;
}

/// With two GPUs (peer_attrs): what the driver says of device 0's
/// cuMemAlloc blocks to each device's primary context before, while and after
/// device 1's context has peer access to device 0's: the ACCESS_FLAGS pointer
/// attribute with each context current, and cuMemGetAccess for each device;
/// for a block made before the enable and one made while it is on. With one
/// GPU, says so and measures nothing.
static int peer_attrs() {
  int n = 0;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&n) != CUDA_SUCCESS) {
    std::printf("cuInit or cuDeviceGetCount failed\n");
    return 1;
  }
  if (n < 2) {
    std::printf("fewer than two GPUs: nothing measured\n");
    return 0;
  }
  CUdevice d0 = 0, d1 = 0;
  CUcontext c0 = nullptr, c1 = nullptr;
  if (cuDeviceGet(&d0, 0) != CUDA_SUCCESS || cuDeviceGet(&d1, 1) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&c0, d0) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&c1, d1) != CUDA_SUCCESS) {
    std::printf("cannot retain both primary contexts\n");
    return 1;
  }
  int can = 0;
  cuDeviceCanAccessPeer(&can, d1, d0);
  std::printf("device 1 can access device 0: %d\n", can);
  cuCtxSetCurrent(c0);
  CUdeviceptr before = 0, during = 0;
  std::printf("cuMemAlloc(1 MiB) on device 0: %s\n", name(cuMemAlloc(&before, 1 << 20)));
  if (!before) return 1;
  const auto report = [&](const char* when, const char* which, CUdeviceptr p) {
    std::printf("%s, %s:", when, which);
    const struct {
      const char* name;
      CUcontext ctx;
      CUdevice dev;
    } kCtx[] = {{"device 0", c0, d0}, {"device 1", c1, d1}};
    for (const auto& c : kCtx) {
      cuCtxSetCurrent(c.ctx);
      unsigned v = 0;  // the lowest byte is written
      const CUresult q = cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, p);
      std::printf(" ACCESS_FLAGS with %s current %s", c.name, name(q));
      if (q == CUDA_SUCCESS) std::printf(" %u", v & 0xff);
      CUmemLocation loc{};
      loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
      loc.id = c.dev;
      unsigned long long f = 7;
      const CUresult g = cuMemGetAccess(&f, &loc, p);
      std::printf(", cuMemGetAccess for %s %s", c.name, name(g));
      if (g == CUDA_SUCCESS) std::printf(" %llu", f);
      std::printf(";");
    }
    std::printf("\n");
  };
  report("before peer access", "the block", before);
  cuCtxSetCurrent(c1);
  std::printf("device 1's context: cuCtxEnablePeerAccess(device 0's) %s\n",
              name(cuCtxEnablePeerAccess(c0, 0)));
  cuCtxSetCurrent(c0);
  std::printf("cuMemAlloc(1 MiB) on device 0 while it is on: %s\n",
              name(cuMemAlloc(&during, 1 << 20)));
  report("peer access on", "the block made before", before);
  if (during) report("peer access on", "the block made while on", during);
  cuCtxSetCurrent(c1);
  std::printf("device 1's context: cuCtxDisablePeerAccess(device 0's) %s\n",
              name(cuCtxDisablePeerAccess(c0)));
  report("peer access off", "the block made before", before);
  if (during) report("peer access off", "the block made while on", during);
  cuCtxSetCurrent(c0);
  std::printf("free %s", name(cuMemFree(before)));
  if (during) std::printf(" %s", name(cuMemFree(during)));
  std::printf("\n");
  cuDevicePrimaryCtxRelease(d0);
  cuDevicePrimaryCtxRelease(d1);
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "ipc_tail") == 0) return ipc_blocks(ipc_tail_operations);
  if (argc > 1 && std::strcmp(argv[1], "ipc_attrs") == 0) return ipc_blocks(ipc_attr_queries);
  if (argc > 1 && std::strcmp(argv[1], "ctx_attrs") == 0) return ctx_attrs();
  if (argc > 1 && std::strcmp(argv[1], "peer_attrs") == 0) return peer_attrs();
  if (!init_primary()) return 1;
  const size_t sizes[] = {1,
                          100,
                          512,
                          513,
                          4096,
                          65537,
                          (1u << 20) + 1,
                          size_t(2) << 20,
                          (size_t(2) << 20) + 1,
                          size_t(3) << 20};
  if (argc > 1 && std::strcmp(argv[1], "tail") == 0) {
    tail_operations(size_t(1) << 20);  // a tail in the page
    tail_operations(size_t(2) << 20);  // a whole page: no tail
    tail_operations(65537);
    return 0;
  }
  for (size_t n : sizes) {
    CUdeviceptr p = 0;
    const CUresult r = cuMemAlloc(&p, n);
    std::printf("cuMemAlloc(%zu): %s", n, name(r));
    if (r != CUDA_SUCCESS) {
      std::printf("\n");
      continue;
    }
    unsigned long long attr_size = 0;
    const CUresult a = cuPointerGetAttribute(&attr_size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p);
    std::printf(", aligned to %llu", alignment(p));
    range("range", p, p);
    range("last byte", p + n - 1, p);
    range("one past", p + n, p);
    if (a == CUDA_SUCCESS)
      std::printf(", RANGE_SIZE %llu", attr_size);
    else
      std::printf(", RANGE_SIZE %s", name(a));
    if (n == 1) {
      std::printf("\n  one past the requested byte:\n");
      attributes(p + 1);
      std::printf(" ");
    }
    std::printf(", free %s\n", name(cuMemFree(p)));
    if (n == 1) {  // where no memory is: a freed block, a low address
      std::printf(" ");
      range("freed", p, p);
      range("at 4096", 4096, p);
      std::printf("\n");
    }
  }
  return 0;
}
