// Messages between shims (peer sockets) and between the coordinator and a shim
// (control socket), and the two fixed-layout blobs the shim hands to
// applications: export tickets and legacy IPC handles. Carried by wire.h.
//
// Sockets, in the job's runtime directory ($CUSNAP_RUNTIME_DIR), mode 0600,
// one pair per CUDA process; a connection from a uid that is neither root nor
// the shim's own uid is closed unanswered:
//   shim-peer.<pid>.sock   importer -> creator   fetch      FetchRequest
//                          creator  -> importer  fetched    FetchReply (+ the real descriptor when
//                          ok)
//   shim-ctl.<pid>.sock    client   -> shim      inspect    Empty
//                          shim     -> client    records    ShimRecords
//                          client   -> shim      gate-close GateRequest / gate-open GateOpen
//                          shim     -> client    done       Done
//   The checkpoint of shared memory (gate closed; docs/shim.md "Checkpoint"):
//                          client   -> shim      drain      Empty  (device work finished)
//                          client   -> shim      save       AllocationRequest + a file to write
//                          client   -> shim      release    ReleaseRequest
//                          client   -> shim      load       AllocationRequest + a file to read
//                          client   -> shim      reimport   Empty
//                          shim     -> client    done       Done (bytes: bytes copied)
//   The cut across collective ranks (gate open; docs/design.md "Cut"):
//                          client   -> shim      cut        CutRequest (arm [+ hold_ms], target,
//                                                           status, release)
//                          shim     -> client    cut-state  CutState
//   any other request type on the control socket is answered `done` ok=false
//   ("unknown request"), so clients can probe for newer requests.
#pragma once

#include <cstdint>
#include <cstring>
#include <msgpack.hpp>
#include <string>
#include <vector>

namespace cusnap::proto {

inline constexpr const char* kMsgFetch = "fetch";
inline constexpr const char* kMsgFetched = "fetched";
inline constexpr const char* kMsgShimInspect = "inspect";
inline constexpr const char* kMsgShimRecords = "records";
inline constexpr const char* kMsgGateClose = "gate-close";
inline constexpr const char* kMsgGateOpen = "gate-open";
inline constexpr const char* kMsgDone = "done";
/// drain answers done with code EBUSY when a stream capture is under way in
/// the process (synchronizing would invalidate it): nothing changed, and the
/// drain may succeed once the gate has been open long enough for it to end.
inline constexpr const char* kMsgShimDrain = "drain";
inline constexpr const char* kMsgShimSave = "save";
inline constexpr const char* kMsgShimRelease = "release";
inline constexpr const char* kMsgShimLoad = "load";
inline constexpr const char* kMsgShimReimport = "reimport";
inline constexpr const char* kMsgShimCut = "cut";
inline constexpr const char* kMsgShimCutState = "cut-state";

/// Version of ShimRecords; bump on any incompatible change.
inline constexpr uint32_t kShimRecordsFormat = 1;

/// A GPU's UUID as nvidia-smi and the driver's checkpoint arguments name it:
/// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (16 bytes, lower-case hex).
std::string format_gpu_uuid(const unsigned char bytes[16]);

/// Socket names inside the runtime directory.
std::string shim_peer_socket(const std::string& runtime_dir, int64_t pid);
std::string shim_control_socket(const std::string& runtime_dir, int64_t pid);

/// Importer -> creator: the real descriptor of one of the creator's allocations.
struct FetchRequest {
  uint64_t creator_start = 0;  ///< the creator's start time the ticket names
  uint64_t allocation = 0;     ///< the creator's allocation id
  MSGPACK_DEFINE_MAP(creator_start, allocation);
};

/// Creator -> importer. ok: the descriptor travels with this message.
struct FetchReply {
  bool ok = false;
  uint64_t size = 0;
  std::string error;
  uint64_t generation = 0;  ///< of the allocation the descriptor names (AllocationRecord)
  MSGPACK_DEFINE_MAP(ok, size, error, generation);
};

struct GateRequest {
  uint64_t timeout_ms = 10000;
  MSGPACK_DEFINE_MAP(timeout_ms);
};

/// drain: timeout_ms bounds the wait for the process's device work (0 or
/// absent, as an older client sends: the gate's hold, CUSNAP_CUT_HOLD_MS;
/// never without end, since the listener that waits is the one that opens
/// the gate). Past it the
/// shim answers done with code ETIMEDOUT and goes on serving, the drain left
/// to finish on its own thread (a kernel may wait on a thread the gate
/// holds, and end only once the gate opens).
struct DrainRequest {
  uint64_t timeout_ms = 0;
  MSGPACK_DEFINE_MAP(timeout_ms);
};

/// gate-open: keep_cut keeps the cut across collective ranks armed, so held
/// collective launches stay held (a retried quiesce); otherwise opening the
/// gate lets them go. An empty map (older clients) is keep_cut false.
struct GateOpen {
  bool keep_cut = false;
  MSGPACK_DEFINE_MAP(keep_cut);
};

struct Done {
  bool ok = false;
  int32_t code = 0;  ///< errno-style detail (0, ETIMEDOUT, EALREADY, ...)
  std::string error;
  uint64_t bytes = 0;  ///< save/load: bytes copied
  MSGPACK_DEFINE_MAP(ok, code, error, bytes);
};

/// save: write the bytes of one allocation created here (AllocationRecord::id)
/// into the descriptor that travels with the request, from offset 0. load:
/// recreate a released allocation, fill it from the descriptor, map it again
/// at every recorded address with the recorded access.
/// The bytes may be split into parts, one file each (part k: the k-th
/// stretch of whole staging chunks, see the shim's track_copy.h): one request
/// per part, in order, each with its file; the shim answers ok to each and
/// does the work on the last.
struct AllocationRequest {
  uint64_t allocation = 0;
  uint32_t part = 0;
  uint32_t parts = 1;
  MSGPACK_DEFINE_MAP(allocation, part, parts);
};
inline constexpr uint32_t kMaxParts = 64;

/// release: "imported" unmaps and releases every imported allocation (the
/// address reservations stay); "created" every created one that was saved.
struct ReleaseRequest {
  std::string origin;
  MSGPACK_DEFINE_MAP(origin);
};

/// The cut: collective kernel launches (NCCL's, by kernel name) are counted
/// per GPU of the launching context. "arm" holds every later collective
/// launch and answers the counts; "target" lets launches on each GPU on
/// until its count reaches target, then holds again; "status" answers the counts; "release" (and
/// gate-open) lets every held launch go. A held launch waits outside the gate. The answer to
/// "status" names the GPUs (format_gpu_uuid) of the contexts the process
/// launched its collectives in, at most kMaxCutDevices. "arm" may carry
/// hold_ms, how long the coordinator may still need the cut (its operation's
/// timeout): a launch then holds for at least that long before the shim drops
/// the cut by itself. Optional: absent or 0 (an older client), the shim's own
/// limit ($CUSNAP_CUT_HOLD_MS) alone applies; an older shim ignores it.
struct CutRequest {
  std::string op;
  uint64_t target = 0;
  uint64_t hold_ms = 0;
  MSGPACK_DEFINE_MAP(op, target, hold_ms);
};
/// The most a "arm" request's hold_ms is taken for (a day).
inline constexpr uint64_t kMaxCutHoldMs = 24ull * 3600 * 1000;

struct CutState {
  bool ok = false;
  std::string error;
  bool armed = false;
  /// Launches let through (some may still be in the driver): the most on one GPU.
  uint64_t reserved = 0;
  /// Launches that returned successfully: the fewest on a GPU in use (with
  /// launches let through, or one holding, and not left behind: docs/shim.md).
  uint64_t launched = 0;
  uint64_t target = 0;
  uint32_t held = 0;                 ///< threads holding at a collective launch now
  std::vector<std::string> devices;  ///< GPUs the collectives ran on
  MSGPACK_DEFINE_MAP(ok, error, armed, reserved, launched, target, held, devices);
};
inline constexpr size_t kMaxCutDevices = 64;

/// One location's access flags (CUmemLocation type/id, CUmemAccess_flags).
struct AccessRecord {
  int32_t type = 0;
  int32_t id = 0;
  uint32_t flags = 0;
  MSGPACK_DEFINE_MAP(type, id, flags);
  bool operator==(const AccessRecord&) const = default;
};

/// A tracked allocation. origin: "created" (this process made it), "imported"
/// (through a ticket or a legacy IPC handle), "foreign" (a descriptor that was
/// not a ticket). The creator triple names the allocation across processes.
struct AllocationRecord {
  uint64_t id = 0;  ///< this process's id for it (mappings refer to it)
  std::string origin;
  int64_t creator_pid = 0;
  uint64_t creator_start = 0;
  uint64_t creator_id = 0;
  uint64_t size = 0;
  int32_t device = 0;
  uint32_t handles = 0;   ///< logical handles alive
  bool exported = false;  ///< the creator's export cache holds its descriptor
  bool legacy = false;    ///< serves cuMemAlloc memory (legacy IPC capable)
  /// Which incarnation of the allocation this is: the creator counts the
  /// times a checkpoint created it again, an importer holds the count of the
  /// descriptor it imported. After a rebuild every importer's must equal its
  /// creator's (the only field a rebuild changes).
  uint64_t generation = 0;
  MSGPACK_DEFINE_MAP(id, origin, creator_pid, creator_start, creator_id, size, device, handles,
                     exported, legacy, generation);
};

struct MappingRecord {
  uint64_t address = 0;
  uint64_t size = 0;
  uint64_t offset = 0;
  uint64_t allocation = 0;           ///< AllocationRecord::id; 0 for a multicast object
  uint64_t multicast = 0;            ///< MulticastRecord::handle mapped here, if any
  std::vector<AccessRecord> access;  ///< union of granted access, one per location
  MSGPACK_DEFINE_MAP(address, size, offset, allocation, multicast, access);
};

/// A legacy IPC mapping this process opened.
struct IpcRecord {
  uint64_t address = 0;
  uint64_t size = 0;
  uint64_t allocation = 0;  ///< AllocationRecord::id
  uint32_t opens = 0;
  MSGPACK_DEFINE_MAP(address, size, allocation, opens);
};

struct McBindingRecord {
  int32_t device = -1;  ///< device bound (v1 ABI: the member's own device; -1 unknown)
  uint32_t abi = 1;     ///< 1: cuMulticastBind*, 2: cuMulticastBind*_v2 (CUDA 13.1)
  uint64_t mc_offset = 0;
  uint64_t allocation = 0;  ///< AllocationRecord::id; 0 for an address binding
  uint64_t address = 0;     ///< for an address binding
  uint64_t mem_offset = 0;
  uint64_t size = 0;
  MSGPACK_DEFINE_MAP(device, abi, mc_offset, allocation, address, mem_offset, size);
};

struct MulticastRecord {
  uint64_t handle = 0;  ///< the driver's multicast handle in this process
  uint64_t size = 0;
  uint32_t num_devices = 0;
  uint64_t flags = 0;
  std::vector<int32_t> devices;
  std::vector<McBindingRecord> bindings;
  MSGPACK_DEFINE_MAP(handle, size, num_devices, flags, devices, bindings);
};

/// Everything one shim knows, as inspection returns it and the manifest stores it.
struct ShimRecords {
  uint32_t format = kShimRecordsFormat;
  int64_t pid = 0;
  uint64_t start_time = 0;
  std::vector<AllocationRecord> allocations;
  std::vector<MappingRecord> mappings;
  std::vector<IpcRecord> ipc;
  std::vector<MulticastRecord> multicast;
  uint64_t foreign_imports_alive = 0;
  uint64_t foreign_imports_total = 0;
  /// Calls that share device memory (export, import, IPC handle or open,
  /// multicast create or add device) the application began, counted before
  /// they reach the driver: once the driver has locked the process, a count
  /// unchanged since an earlier look means no sharing began in between.
  uint64_t sharing_calls = 0;
  /// cuMemAlloc blocks the shim could not serve as shareable memory and left
  /// to the driver (untracked), alive; IPC handles of them handed out (an
  /// opener counts each as a foreign import); why the first was left to the
  /// driver. Absent (0, empty) in records of earlier versions.
  uint64_t driver_blocks = 0;
  uint64_t driver_ipc_exports = 0;
  std::string driver_block_why;
  /// Served blocks and legacy IPC opens whose mapping is longer than the
  /// bytes asked, whose copies are range-checked (the shim's copy check);
  /// 0 in records of earlier versions.
  uint64_t tailed_blocks = 0;
  MSGPACK_DEFINE_MAP(format, pid, start_time, allocations, mappings, ipc, multicast,
                     foreign_imports_alive, foreign_imports_total, sharing_calls, driver_blocks,
                     driver_ipc_exports, driver_block_why, tailed_blocks);
};

/// The largest size a record may give an allocation, a mapping or a
/// multicast object: 256 TiB, beyond any GPU's memory, so that sums and
/// offsets of valid records cannot overflow.
inline constexpr uint64_t kMaxRecordBytes = 1ull << 48;

/// The longest ShimRecords::driver_block_why records may hold.
inline constexpr size_t kMaxDriverBlockWhy = 128;

/// Checks records a shim sent or a checkpoint holds beyond their types:
/// every origin known, every size at most kMaxRecordBytes, no address or
/// offset whose range wraps around. false + *why (the first fault) otherwise.
bool records_valid(const ShimRecords& r, std::string* why);

/// An export ticket: the whole content of the memfd an export returns.
struct Ticket {
  char magic[8];  ///< kTicketMagic
  uint32_t version;
  uint32_t size;  ///< sizeof(Ticket)
  int64_t creator_pid;
  uint64_t creator_start;
  uint64_t allocation;
  uint64_t bytes;
  char socket[108];  ///< the creator's peer socket, NUL-terminated
};
inline constexpr char kTicketMagic[8] = {'C', 'U', 'S', 'N', 'A', 'P', 'T', 'K'};
inline constexpr uint32_t kTicketVersion = 1;
/// The name the ticket memfd carries (in /proc/PID/fd: "/memfd:cusnap-ticket").
inline constexpr const char* kTicketMemfdName = "cusnap-ticket";

/// Checks a ticket read from a memfd (n bytes); false + *err when malformed.
bool ticket_valid(const void* data, size_t n, Ticket* out, std::string* err);

/// The 64 bytes of a CUipcMemHandle the shim gives out for tracked memory.
struct IpcHandleBlob {
  char magic[8];  ///< kIpcMagic
  int64_t creator_pid;
  uint64_t creator_start;
  uint64_t allocation;
  uint64_t offset;  ///< of the requested pointer inside the allocation
  uint64_t size;    ///< of the cuMemAlloc block's mapping (whole granules)
  /// The bytes asked of the block, what the driver's block is (and what an
  /// opener's queries and copies see, as on the driver); 0 (a handle of a
  /// shim before it): size.
  uint64_t asked;
  uint64_t reserved[1];
};
static_assert(sizeof(IpcHandleBlob) == 64);
inline constexpr char kIpcMagic[8] = {'C', 'U', 'S', 'N', 'I', 'P', 'C', '1'};

}  // namespace cusnap::proto
