// The simulated driver's process-wide state.
//
// Lock order: Gate::mu (gate.h) is never held while Driver::mu is taken by the
// same thread for long; Driver::mu protects every table below. No thread holds
// Driver::mu while talking to another process's control socket.
#pragma once

#define __CUDA_API_VERSION_INTERNAL
#include "cudaapi/cuda_headers.h"
#include "device_env.h"

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#define FC_EXPORT extern "C" __attribute__((visibility("default")))

namespace fc {

/// Allocation and mapping granularity (minimum and recommended).
constexpr size_t kGranularity = size_t{2} << 20;
// kMaxDevices: device_env.h.

struct Device {
  std::string name;
  CUuuid uuid{};
  size_t total_mem = 0;
  size_t used = 0;  ///< bytes of allocations created on this device
  /// The machine's index of this device: the dev<N> of its memfds, under
  /// which the ledger and NVML count them (ledger.h). Its ordinal until a
  /// restore remaps the device onto another of the machine's (by UUID).
  int ledger_index = 0;
};

/// A context, primary or created. Handles are pointers to these.
struct Context {
  CUdevice dev = 0;
  unsigned flags = 0;
  bool primary = false;
  int primary_refs = 0;  ///< retain count, primary contexts only
  unsigned long long id = 0;
};

struct Stream {
  CUcontext ctx = nullptr;
  unsigned flags = 0;
  int priority = 0;
};
struct GraphNode;
struct CaptureSeq;
struct Event {
  unsigned flags = 0;
  bool recorded = false;
  double time_ms = 0;
  /// Last recorded on a capturing stream (capture.cpp): a captured event. It
  /// holds that capture (expired once the capture ended) and the stream's
  /// dependencies at the record, instead of work to wait for.
  bool captured = false;
  std::weak_ptr<CaptureSeq> capture;
  std::vector<GraphNode*> capture_deps;
};
struct Module {
  int functions = 0;
};
struct Function {
  CUmodule module = nullptr;
  std::string name;        ///< as passed to cuModuleGetFunction (cuFuncGetName)
  bool handshake = false;  ///< "ncclDevKernel_Handshake*": an asynchronous kernel (kernels.cpp)
};

enum class AllocKind { kVmm, kLegacy, kIpcImport, kMulticast };

struct McBinding {
  CUdevice dev;
  size_t mc_offset;
  uint64_t mem_handle;  ///< 0 for address bindings
  CUdeviceptr mem_ptr;
  size_t mem_offset;
  size_t size;
};

/// A physical allocation: one memfd named "fakecuda:<creator-pid>:<creator-id>".
struct Allocation {
  uint64_t id = 0;  ///< handle value in this process
  AllocKind kind = AllocKind::kVmm;
  int fd = -1;  ///< -1 while checkpointed
  size_t size = 0;
  CUdevice dev = 0;
  pid_t creator = 0;
  uint64_t creator_id = 0;
  bool imported = false;  ///< created by another process
  dev_t st_dev = 0;
  ino_t st_ino = 0;
  CUmemAllocationProp prop{};
  const void* owner = nullptr;  ///< a cuMemAlloc block's context (its Context*)
  /// A cuMemAlloc block's bytes as asked for (of a legacy IPC import, the
  /// exporter's block's), 0 for other kinds: the size the driver reports of
  /// the block, whose mapping is rounded up to kGranularity (find_known,
  /// memory.h).
  size_t requested = 0;
  int handle_refs = 0;    ///< create/import/retain minus release
  int map_refs = 0;       ///< live mappings
  void* saved = nullptr;  ///< bytes while checkpointed (anonymous mapping)
  // Multicast objects only.
  unsigned mc_num_devices = 0;
  std::vector<CUdevice> mc_devices;
  std::vector<McBinding> mc_bindings;
};

/// Whether a is memory the driver maps for the application itself, no VMM
/// mapping to it: a cuMemAlloc block or a legacy IPC open of one. The VMM
/// calls refuse it (cuMemUnmap, cuMemSetAccess, cuMemRetainAllocationHandle;
/// measured on an H100: served-block-h100.log, alloc_sizes.cpp ipc_attrs and
/// ctx_attrs). nullptr: false.
inline bool driver_block(const Allocation* a) {
  return a && (a->kind == AllocKind::kLegacy || a->kind == AllocKind::kIpcImport);
}

/// One virtual address range reserved by cuMemAddressReserve (or internally).
struct Reservation {
  size_t size = 0;
  bool internal = false;  ///< made for cuMemAlloc / IPC open; user may not free it
};

/// A mapping of (part of) an allocation at a device address.
struct Mapping {
  size_t size = 0;
  uint64_t alloc = 0;
  size_t offset = 0;
  unsigned char access[kMaxDevices] = {};  ///< CUmemAccess_flags per device
  int prot = 0;                            ///< current host protection
  bool sync_memops = false;                ///< CU_POINTER_ATTRIBUTE_SYNC_MEMOPS (alloc.cpp)
};

/// A legacy IPC mapping opened from another process.
struct IpcOpen {
  int refs = 0;
  pid_t creator = 0;
  uint64_t creator_id = 0;
  const void* owner = nullptr;  ///< the context it was opened in (its Context*)
};

struct Graph;

/// A node of a graph (graphs.cpp). Handles are pointers to these; the node
/// is owned by its graph.
struct GraphNode {
  Graph* graph = nullptr;
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_KERNEL;
  std::vector<GraphNode*> deps;  ///< nodes of the same graph, added before this one
  // Kernel nodes.
  CUfunction func = nullptr;
  CUcontext ctx = nullptr;  ///< where it was captured or added (may be NULL)
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned shared_mem = 0;
  bool handshake = false;
  uint64_t words[3] = {};           ///< handshake arguments, by value
  void* params[3] = {};             ///< kernelParams: points into words
  // Child graph nodes: the node's own clone, owned by the node.
  Graph* child = nullptr;
};

/// A graph: nodes in insertion order (a valid execution order, since a
/// node's dependencies exist before it).
struct Graph {
  std::vector<GraphNode*> nodes;
  GraphNode* parent = nullptr;  ///< the child-graph node owning it, if any
};

/// An instantiated graph: its kernel nodes flattened (child graphs inlined),
/// a snapshot taken at instantiation (or update).
struct ExecKernel {
  CUfunction func = nullptr;
  bool handshake = false;
  uint64_t words[3] = {};
};
/// One node of a graph's structure, depth first (graphs.cpp); type -1 ends
/// a child graph.
struct ShapeEntry {
  int type = -1;
  CUfunction func = nullptr;  ///< kernel nodes
  std::vector<size_t> deps;   ///< indices in the node's own graph
};
struct GraphExec {
  std::vector<ExecKernel> kernels;
  std::vector<ShapeEntry> shape;  ///< what cuGraphExecUpdate must find again
  unsigned long long flags = 0;
};

/// A stream's identity as a map key: (Context*, StreamKind, id) of its
/// StreamKey (stream_key_id).
using StreamKeyId = std::tuple<Context*, int, uintptr_t>;

/// One capture sequence (capture.cpp), from cuStreamBeginCapture on its
/// origin stream to cuStreamEndCapture there; other streams join it by
/// waiting on an event recorded in it. Invalidated, it stays until ended.
struct CaptureSeq {
  Graph* graph = nullptr;
  unsigned long long id = 0;
  bool invalidated = false;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  long tid = 0;  ///< the thread that began it
  StreamKeyId origin;
  /// The dependencies of joined streams destroyed during the capture: their
  /// work must still be joined back into the origin.
  std::vector<GraphNode*> left;
};

/// A stream taking part in a capture: its origin stream or a joined stream.
struct Capture {
  std::shared_ptr<CaptureSeq> seq;
  std::vector<GraphNode*> deps;  ///< what the stream's next captured node depends on
};

struct HostAlloc {
  size_t size = 0;
  unsigned flags = 0;
  bool registered = false;  ///< cuMemHostRegister: not ours to free
};

struct Driver {
  std::mutex mu;
  std::atomic<bool> initialized{false};
  /// This process was forked from one that had called cuInit (or from such a
  /// child): cuInit fails CUDA_ERROR_NOT_INITIALIZED here for good, as the
  /// real driver's does (tests/gpu/probes/fork_after_init.cpp), unless
  /// FAKECUDA_FORK_REINIT=1. The checkpoint API works all the same.
  bool forked_after_init = false;
  /// cuInit failed CUDA_ERROR_OPERATING_SYSTEM for want of descriptors (at
  /// most 5 could be opened): it fails so for good in this process, as the
  /// real driver's does, though not in a child forked later (devices.cpp).
  std::atomic<bool> init_failed_for_good{false};
  bool multicast = false;
  std::vector<Device> devices;
  std::vector<Context*> primary;  ///< one per device, never freed
  std::set<Context*> contexts;    ///< every live context incl. primaries
  std::set<Stream*> streams;
  std::set<Event*> events;
  std::set<Module*> modules;
  std::set<Function*> functions;
  std::map<uint64_t, Allocation> allocs;
  std::map<uintptr_t, Reservation> reservations;
  std::map<uintptr_t, Mapping> mappings;
  std::map<uintptr_t, IpcOpen> ipc_opens;  ///< by mapped base address
  std::map<uintptr_t, HostAlloc> host_allocs;
  std::set<std::pair<Context*, Context*>> peer_access;  ///< (context, peer) enabled
  std::set<Graph*> graphs;        ///< every live graph, child graphs included
  std::set<GraphNode*> graph_nodes;
  std::set<GraphExec*> graph_execs;
  std::map<StreamKeyId, Capture> captures;  ///< every capturing stream (stream_key_id)
  unsigned long long next_capture_id = 1;
  uint64_t next_alloc_id = 1;
  unsigned long long next_ctx_id = 1;
  /// Set by a successful cuCheckpointProcessRestore of this process: its
  /// contexts are no longer time-sliced with other processes' (kernels.cpp).
  bool restored = false;
  /// Set when a cuCheckpointProcessRestore of this process found no device
  /// memory for it: as on the real driver (measured on an H200, driver
  /// 580.159.04), the process stays CHECKPOINTED and every later restore
  /// fails CUDA_ERROR_OPERATING_SYSTEM, free memory or not.
  bool restore_refused = false;
};

/// The one driver state of this process.
Driver& driver();

/// Thread's context stack; top is current.
std::vector<CUcontext>& ctx_stack();

/// Current context or nullptr.
Context* current_ctx();

bool valid_device(CUdevice dev);
bool valid_ctx(CUcontext ctx);
/// Stream handle check; NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD are valid.
bool valid_stream(CUstream s);

/// Starts the control server thread (control_server.cpp).
CUresult start_control_server();
/// Forgets the control server after fork (the thread did not survive it).
void control_server_after_fork();

// ---- Asynchronous kernels (kernels.cpp) ------------------------------------
// Functions named "ncclDevKernel_Handshake*" launch as handshake kernels that
// run on one background thread per process: store `step` into *my_flag, then
// wait until *peer_flag >= step. Everything else still launches as a no-op.
// Lock order: the kernel queue's lock is a leaf: it is never held together
// with Driver::mu or Gate::mu; none of the functions below may be called with
// Driver::mu or Gate::mu held.

constexpr const char* kHandshakePrefix = "ncclDevKernel_Handshake";

enum class StreamKind { kUser, kLegacy, kPerThread };

/// Where stream work is ordered: a created stream, a context's legacy NULL
/// stream, or one thread's per-thread default stream of a context.
struct StreamKey {
  Context* ctx = nullptr;
  StreamKind kind = StreamKind::kLegacy;
  uintptr_t id = 0;       ///< Stream* (kUser), thread id (kPerThread), 0 (kLegacy)
  bool blocking = true;   ///< synchronizes with the legacy stream
};

inline StreamKeyId stream_key_id(const StreamKey& k) {
  return {k.ctx, static_cast<int>(k.kind), k.id};
}

/// The kernel parameters of a handshake kernel.
struct HandshakeArgs {
  CUdeviceptr my_flag = 0;
  CUdeviceptr peer_flag = 0;
  uint64_t step = 0;
};

/// Resolves a valid stream handle; `ptsz`: NULL names the per-thread stream.
/// False when a NULL/legacy/per-thread handle has no current context.
/// Precondition: Driver::mu held.
bool resolve_stream(CUstream s, bool ptsz, StreamKey* out);

/// Queues a handshake kernel behind the work it must follow; returns at once.
void kernel_enqueue(const StreamKey& key, const HandshakeArgs& args);
/// True while work is pending that an operation on `key` would wait for.
bool stream_busy(const StreamKey& key);
/// Waits for that work (the waiting thread leaves the checkpoint gate while it
/// waits and passes it again afterwards); returns the stream's sticky error.
CUresult stream_wait(const StreamKey& key);
/// The stream's sticky error (a faulted kernel), CUDA_SUCCESS if none.
CUresult stream_error(const StreamKey& key);
/// Waits for every pending kernel of a context; returns the first sticky error
/// of its streams.
CUresult ctx_wait(Context* ctx);
/// Hook for operations on a stream outside streams.cpp (copies, memsets):
/// resolves `s` (Driver::mu taken here) and waits for its pending kernels.
/// On a capturing stream it waits for nothing, invalidates the capture and
/// returns CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (copies are not captured).
CUresult stream_order(CUstream s, bool ptsz);
/// Hook for cuCtxSynchronize: validates ctx (NULL: current) and waits; while
/// ctx has a capturing stream it waits for nothing (capture_ctx_sync).
CUresult ctx_synchronize(CUcontext ctx);
/// Events: record the work pending on key; query/wait for it.
void event_set_deps(const void* event, const StreamKey* key);
bool event_busy(const void* event);
void event_wait(const void* event);
/// Waits until no kernel is pending in this process (the driver checkpoint).
void kernels_wait_idle();
/// Number of kernels pending in this process (tests, logging).
size_t kernels_pending();

// ---- Stream capture and graphs (capture.cpp, graphs.cpp) ------------------

/// Grid, block and shared memory of a launch.
struct LaunchDims {
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned shared_mem = 0;
};

/// Reads a handshake kernel's arguments from kernelParams or `extra`
/// (streams.cpp); false when they are missing.
bool handshake_args(void** params, void** extra, HandshakeArgs* a);

/// Stream capture (capture.cpp). Precondition of each: Driver::mu held.
/// The capture the stream key takes part in (as its origin or joined), or
/// nullptr.
Capture* capture_of(const StreamKey& key);
/// A launch on a capturing stream: appends a kernel node that depends on the
/// stream's dependencies, which become that node
/// (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED once invalidated). c == capture_of(key).
CUresult capture_launch(Capture* c, const StreamKey& key, CUfunction f, const LaunchDims& dims,
                        void** params, void** extra);
/// An operation that cannot be captured on `key`: when the stream captures,
/// invalidates the capture and returns CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
/// otherwise CUDA_SUCCESS.
CUresult capture_refuse(const StreamKey& key);
/// A potentially unsafe call (cuThreadExchangeStreamCaptureMode) made by this
/// thread: cuMemAlloc, cuMemFree, cuMemAllocHost, or cuStreamSynchronize /
/// cuStreamQuery of a stream outside capture. When an ACTIVE capture
/// prohibits it (one of this thread's not begun RELAXED; while this thread's
/// mode is GLOBAL, also another thread's begun GLOBAL), invalidates every
/// such capture and returns CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; otherwise
/// CUDA_SUCCESS.
CUresult capture_unsafe_call();
/// cuCtxSynchronize of ctx: while a stream of ctx takes part in an ACTIVE
/// capture, in any mode and from any thread, invalidates each such capture
/// and returns CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; otherwise CUDA_SUCCESS.
CUresult capture_ctx_sync(Context* ctx);
/// A stream is destroyed. The origin's capture ends (every stream leaves it,
/// its graph is freed); a joined stream leaves its capture, whose end still
/// requires that stream's work to be joined back.
void capture_forget(const StreamKey& key);
/// cuEventRecord(WithFlags) of e on `key` (NULL: a stream without a context).
/// On a capturing stream e becomes a captured event: it holds the stream's
/// dependencies and nothing is recorded for execution (*captured is set).
/// Elsewhere e stops being a captured event and *captured is cleared.
CUresult capture_record(const StreamKey* key, Event* e, unsigned flags, bool* captured);
/// cuStreamWaitEvent(key, e, flags) as far as capture is concerned: joins a
/// stream into the capture of a captured event, adds an event's
/// dependencies to a capturing stream, or fails as the driver does. Sets
/// *ordinary when neither the stream captures nor e is a captured event:
/// the caller waits for e's work.
CUresult capture_wait(const StreamKey& key, Event* e, unsigned flags, bool* ordinary);
/// Whether cuEventQuery / cuEventSynchronize may use e: a captured event
/// gives CUDA_ERROR_CAPTURED_EVENT while its capture is under way (and
/// invalidates it), CUDA_ERROR_INVALID_VALUE once it ended.
CUresult capture_event_use(Event* e);

/// Graph helpers (graphs.cpp). Precondition: Driver::mu held.
/// A new, empty graph; `parent`: the child-graph node that owns it.
Graph* graph_new(GraphNode* parent);
/// Frees g, its nodes and their child graphs; a capture into g is
/// invalidated. NULL is ignored.
void graph_free(Graph* g);
/// Appends a node of `type` with `deps` (nodes of g).
GraphNode* graph_add_node(Graph* g, CUgraphNodeType type, std::vector<GraphNode*> deps);
/// Appends a kernel node of the valid function f; a handshake kernel's
/// arguments are read from params/extra (CUDA_ERROR_INVALID_VALUE when
/// missing: nothing is added).
CUresult graph_add_kernel(Graph* g, std::vector<GraphNode*> deps, CUfunction f, CUcontext ctx,
                          const LaunchDims& dims, void** params, void** extra, GraphNode** out);

}  // namespace fc
