// Shared-memory tracking under the preloaded shim, against the simulated
// driver. One scenario per invocation (`shim_track_test NAME`, one ctest
// each); every scenario asserts the shim's records through its control socket.
// Children are forked: each is a fork child of the shim too (records dropped,
// registered again on its first CUDA activity).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "proto/control.h"
#include "proto/shim_messages.h"
#include "proto/wire.h"
#include "tests/fakecuda/fakecuda_test_util.h"

using namespace fctest;
using cusnap::UniqueFd;
namespace proto = cusnap::proto;

namespace {

std::string g_dir;
constexpr size_t kMiB2 = 2u << 20;

#define REQ(cond)                                                                            \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      fprintf(stderr, "[%d] %s:%d: failed: %s\n", (int)getpid(), __FILE__, __LINE__, #cond); \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)
#define REQ_OK(expr) REQ((expr) == CUDA_SUCCESS)

bool inspect(pid_t pid, proto::ShimRecords* out) {
  UniqueFd fd;
  std::string err;
  if (!proto::connect_unix(proto::shim_control_socket(g_dir, pid), std::chrono::seconds(5), &fd,
                           &err)) {
    fprintf(stderr, "inspect %d: %s\n", (int)pid, err.c_str());
    return false;
  }
  proto::Channel ch(std::move(fd), std::chrono::seconds(5));
  proto::Message m;
  if (!ch.send(proto::kMsgShimInspect, proto::Empty{}, &err) || !ch.recv(&m, &err) ||
      m.type != proto::kMsgShimRecords || !m.get(out, &err)) {
    fprintf(stderr, "inspect %d: %s\n", (int)pid, err.c_str());
    return false;
  }
  return out->format == proto::kShimRecordsFormat && out->pid == pid;
}

const proto::AllocationRecord* find_origin(const proto::ShimRecords& r, const char* origin,
                                           int64_t creator = 0) {
  for (auto& a : r.allocations)
    if (a.origin == origin && (creator == 0 || a.creator_pid == creator)) return &a;
  return nullptr;
}

/// A tracked (logical) POSIX-fd allocation of `size` on device 0, mapped RW.
int make_buffer(size_t size, VmmBuffer* b) {
  return vmm_create(size, b) == CUDA_SUCCESS ? 0 : 1;
}

int export_ticket(CUmemGenericAllocationHandle h) {
  int fd = -1;
  if (cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != 0)
    return -1;
  return fd;
}

CUresult import_fd(int fd, CUmemGenericAllocationHandle* h) {
  return cuMemImportFromShareableHandle(h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
}

bool is_logical(uint64_t h) {
  return (h >> 48) == 0xC5A9;
}

void fill(CUdeviceptr p, size_t n, uint8_t v) {
  memset(reinterpret_cast<void*>(p), v, n);
}
bool all(CUdeviceptr p, size_t n, uint8_t v) {
  auto* b = reinterpret_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; i += 4096)
    if (b[i] != v) return false;
  return b[n - 1] == v;
}

// --- scenarios -------------------------------------------------------------

/// Creator and importer in both directions, bytes flowing both ways.
int share2() {
  REQ_OK(init_primary());
  VmmBuffer a;
  REQ(make_buffer(kMiB2, &a) == 0);
  REQ(is_logical(a.handle));
  fill(a.ptr, a.size, 0x11);
  Child c = spawn([&](int sock) {
    FC_REQ(init_primary() == CUDA_SUCCESS);
    int t = recv_fd(sock);
    FC_REQ(t >= 0);
    CUmemGenericAllocationHandle h = 0;
    FC_REQ(import_fd(t, &h) == CUDA_SUCCESS);
    close(t);
    FC_REQ(is_logical(h));
    CUdeviceptr p = 0;
    FC_REQ(vmm_map_handle(h, kMiB2, &p) == CUDA_SUCCESS);
    FC_REQ(all(p, kMiB2, 0x11));
    fill(p, kMiB2, 0x22);
    VmmBuffer b;
    FC_REQ(vmm_create(kMiB2, &b) == CUDA_SUCCESS);
    fill(b.ptr, b.size, 0x33);
    int tb = export_ticket(b.handle);
    FC_REQ(tb >= 0);
    FC_REQ(send_fd(sock, tb));
    close(tb);
    proto::ShimRecords r;
    FC_REQ(inspect(getpid(), &r));
    auto* imp = find_origin(r, "imported", getppid());
    FC_REQ(imp && imp->handles == 1 && imp->size == kMiB2);
    auto* cre = find_origin(r, "created");
    FC_REQ(cre && cre->exported && cre->creator_pid == getpid());
    FC_REQ(r.mappings.size() == 2);
    FC_REQ(r.mappings[0].access.size() == 1 && r.mappings[0].access[0].flags == 3);
    uint64_t done = 0;
    FC_REQ(recv_u64(sock, &done) && done == 1);
    FC_REQ(all(b.ptr, kMiB2, 0x44));
    FC_REQ(cuMemUnmap(p, kMiB2) == CUDA_SUCCESS);
    FC_REQ(cuMemRelease(h) == CUDA_SUCCESS);
    FC_REQ(cuMemRelease(h) == CUDA_ERROR_INVALID_HANDLE);  // stale
    FC_REQ(inspect(getpid(), &r));
    FC_REQ(find_origin(r, "imported") == nullptr);
    FC_REQ(send_u64(sock, 2));
    FC_REQ(recv_u64(sock, &done));
    return 0;
  });
  int t = export_ticket(a.handle);
  REQ(t >= 0);
  REQ(send_fd(c.sock, t));
  close(t);
  int tb = recv_fd(c.sock);
  REQ(tb >= 0);
  REQ(all(a.ptr, kMiB2, 0x22));
  CUmemGenericAllocationHandle hb = 0;
  REQ_OK(import_fd(tb, &hb));
  close(tb);
  CUdeviceptr pb = 0;
  REQ_OK(vmm_map_handle(hb, kMiB2, &pb));
  REQ(all(pb, kMiB2, 0x33));
  fill(pb, kMiB2, 0x44);
  proto::ShimRecords r;
  REQ(inspect(getpid(), &r));
  REQ(find_origin(r, "imported", c.pid) != nullptr);
  auto* cre = find_origin(r, "created");
  REQ(cre && cre->exported && cre->handles == 1);
  REQ(send_u64(c.sock, 1));
  uint64_t v = 0;
  REQ(recv_u64(c.sock, &v) && v == 2);
  REQ(send_u64(c.sock, 3));
  REQ(c.join() == 0);
  REQ_OK(cuMemUnmap(pb, kMiB2));
  REQ_OK(cuMemRelease(hb));
  REQ_OK(vmm_destroy(a));
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.empty() && r.mappings.empty());
  return 0;
}

/// Four processes; each creates one allocation and imports the three others
/// (tickets travel through the parent, which only forwards them).
int share4() {
  constexpr int kN = 4;
  std::vector<Child> kids;
  for (int i = 0; i < kN; ++i) {
    kids.push_back(spawn([i](int sock) {
      FC_REQ(init_primary() == CUDA_SUCCESS);
      VmmBuffer b;
      FC_REQ(vmm_create(kMiB2, &b) == CUDA_SUCCESS);
      fill(b.ptr, b.size, uint8_t(0x50 + i));
      int t = export_ticket(b.handle);
      FC_REQ(t >= 0 && send_fd(sock, t));
      close(t);
      std::vector<CUdeviceptr> ptrs;
      for (int j = 0; j < kN - 1; ++j) {
        uint64_t idx = 0;
        FC_REQ(recv_u64(sock, &idx));
        int tj = recv_fd(sock);
        FC_REQ(tj >= 0);
        CUmemGenericAllocationHandle h;
        FC_REQ(import_fd(tj, &h) == CUDA_SUCCESS);
        close(tj);
        CUdeviceptr p;
        FC_REQ(vmm_map_handle(h, kMiB2, &p) == CUDA_SUCCESS);
        FC_REQ(all(p, kMiB2, uint8_t(0x50 + idx)));
        ptrs.push_back(p);
      }
      proto::ShimRecords r;
      FC_REQ(inspect(getpid(), &r));
      int imported = 0;
      for (auto& a : r.allocations) imported += a.origin == "imported";
      FC_REQ(imported == kN - 1 && r.mappings.size() == kN);
      FC_REQ(send_u64(sock, 1));
      uint64_t done;
      FC_REQ(recv_u64(sock, &done));  // keep the export alive until all imported
      return 0;
    }));
  }
  std::vector<int> tickets;
  for (auto& k : kids) tickets.push_back(recv_fd(k.sock));
  for (int i = 0; i < kN; ++i)
    for (int j = 0; j < kN; ++j)
      if (i != j) {
        REQ(send_u64(kids[i].sock, j));
        REQ(send_fd(kids[i].sock, tickets[j]));
      }
  for (auto& k : kids) {
    uint64_t v = 0;
    REQ(recv_u64(k.sock, &v) && v == 1);
  }
  for (auto& k : kids) send_u64(k.sock, 1);
  for (int t : tickets) close(t);
  for (auto& k : kids) REQ(k.join() == 0);
  return 0;
}

/// Repeated imports and retain alias one driver handle; stale and foreign
/// logical handles are refused; the last logical handle releases it.
int alias() {
  REQ_OK(init_primary());
  VmmBuffer a;
  REQ(make_buffer(kMiB2, &a) == 0);
  Child c = spawn([&](int sock) {
    FC_REQ(init_primary() == CUDA_SUCCESS);
    int t = recv_fd(sock);
    CUmemGenericAllocationHandle h1, h2, h3;
    FC_REQ(import_fd(t, &h1) == CUDA_SUCCESS);
    FC_REQ(import_fd(t, &h2) == CUDA_SUCCESS);
    FC_REQ(h1 != h2 && is_logical(h1) && is_logical(h2));
    CUdeviceptr p;
    FC_REQ(vmm_map_handle(h1, kMiB2, &p) == CUDA_SUCCESS);
    FC_REQ(cuMemRetainAllocationHandle(&h3, reinterpret_cast<void*>(p + 4096)) == CUDA_SUCCESS);
    FC_REQ(is_logical(h3) && h3 != h1 && h3 != h2);
    FC_REQ(cuMemRetainAllocationHandle(nullptr, reinterpret_cast<void*>(p)) ==
           CUDA_ERROR_INVALID_VALUE);
    proto::ShimRecords r;
    FC_REQ(inspect(getpid(), &r));
    FC_REQ(r.allocations.size() == 1 && r.allocations[0].handles == 3);
    CUmemAllocationProp prop{};
    FC_REQ(cuMemGetAllocationPropertiesFromHandle(&prop, h2) == CUDA_SUCCESS);
    FC_REQ(prop.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    FC_REQ(cuMemRelease(h1) == CUDA_SUCCESS);
    FC_REQ(cuMemRelease(h2) == CUDA_SUCCESS);
    FC_REQ(cuMemRelease(h3) == CUDA_SUCCESS);
    // Released but still mapped: the record stays, the bytes too.
    FC_REQ(inspect(getpid(), &r));
    FC_REQ(r.allocations.size() == 1 && r.allocations[0].handles == 0 && r.mappings.size() == 1);
    FC_REQ(all(p, kMiB2, 0x77));
    // Retain after the last release gets a driver handle again.
    CUmemGenericAllocationHandle h4;
    FC_REQ(cuMemRetainAllocationHandle(&h4, reinterpret_cast<void*>(p)) == CUDA_SUCCESS);
    FC_REQ(cuMemRelease(h4) == CUDA_SUCCESS);
    FC_REQ(cuMemRelease(h1) == CUDA_ERROR_INVALID_HANDLE);
    FC_REQ(cuMemRelease(0xC5A9000012345678ull) == CUDA_ERROR_INVALID_HANDLE);
    FC_REQ(cuMemMap(p, kMiB2, 0, h2, 0) == CUDA_ERROR_INVALID_VALUE);  // overlaps
    FC_REQ(cuMemUnmap(p, kMiB2) == CUDA_SUCCESS);
    FC_REQ(inspect(getpid(), &r));
    FC_REQ(r.allocations.empty() && r.mappings.empty());
    close(t);
    return 0;
  });
  proto::ShimRecords r;
  REQ(inspect(getpid(), &r));
  const uint64_t calls = r.sharing_calls;
  fill(a.ptr, a.size, 0x77);
  int t = export_ticket(a.handle);
  REQ(send_fd(c.sock, t));
  close(t);
  REQ(c.join() == 0);
  // The creator imports its own ticket: an alias too.
  t = export_ticket(a.handle);
  CUmemGenericAllocationHandle own;
  REQ_OK(import_fd(t, &own));
  close(t);
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.size() == 1 && r.allocations[0].handles == 2);
  REQ(r.sharing_calls == calls + 3);  // two exports and an import, before the driver
  REQ_OK(cuMemRelease(own));
  REQ_OK(vmm_destroy(a));
  return 0;
}

/// Access unions; every refused overlap; NULL outputs and export flags.
int access_unions() {
  REQ_OK(init_primary());
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle h1, h2;
  REQ(cuMemCreate(nullptr, kMiB2, &prop, 0) == CUDA_ERROR_INVALID_VALUE);
  REQ_OK(cuMemCreate(&h1, 2 * kMiB2, &prop, 0));
  REQ_OK(cuMemCreate(&h2, kMiB2, &prop, 0));
  CUdeviceptr base;
  REQ_OK(cuMemAddressReserve(&base, 8 * kMiB2, 0, 0, 0));
  REQ_OK(cuMemMap(base, 2 * kMiB2, 0, h1, 0));
  REQ_OK(cuMemMap(base + 2 * kMiB2, kMiB2, 0, h2, 0));
  CUmemAccessDesc d{};
  d.location = prop.location;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
  REQ_OK(cuMemSetAccess(base, 2 * kMiB2, &d, 1));
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  REQ_OK(cuMemSetAccess(base, 3 * kMiB2, &d, 1));  // two whole mappings
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
  REQ_OK(cuMemSetAccess(base, 2 * kMiB2, &d, 1));  // the union keeps read-write
  // Partial overlaps are refused before the driver sees them.
  REQ(cuMemSetAccess(base, kMiB2, &d, 1) == CUDA_ERROR_INVALID_VALUE);
  REQ(cuMemSetAccess(base + kMiB2, 2 * kMiB2, &d, 1) == CUDA_ERROR_INVALID_VALUE);
  REQ(cuMemSetAccess(base, kMiB2, nullptr, 1) == CUDA_ERROR_INVALID_VALUE);
  REQ(cuMemMap(base + kMiB2, kMiB2, 0, h2, 0) == CUDA_ERROR_INVALID_VALUE);
  REQ(cuMemMap(base, 8 * kMiB2, 0, h1, 0) == CUDA_ERROR_INVALID_VALUE);
  REQ(cuMemUnmap(base, kMiB2) == CUDA_ERROR_INVALID_VALUE);
  REQ(cuMemUnmap(base + kMiB2, 2 * kMiB2) == CUDA_ERROR_INVALID_VALUE);
  int fd = -1;
  REQ(cuMemExportToShareableHandle(&fd, h1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1) ==
      CUDA_ERROR_INVALID_VALUE);
  REQ(cuMemExportToShareableHandle(nullptr, h1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
      CUDA_ERROR_INVALID_VALUE);
  REQ(import_fd(0, nullptr) == CUDA_ERROR_INVALID_VALUE);
  proto::ShimRecords r;
  REQ(inspect(getpid(), &r));
  REQ(r.mappings.size() == 2);
  for (auto& m : r.mappings) {
    REQ(m.access.size() == 1);
    REQ(m.access[0].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    REQ(m.access[0].type == CU_MEM_LOCATION_TYPE_DEVICE && m.access[0].id == 0);
  }
  // Other handle types pass through untouched (driver handles, not logical).
  CUmemAllocationProp plain = prop;
  plain.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  CUmemGenericAllocationHandle hp;
  REQ_OK(cuMemCreate(&hp, kMiB2, &plain, 0));
  REQ(!is_logical(hp));
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.size() == 2);
  REQ_OK(cuMemRelease(hp));
  REQ_OK(cuMemUnmap(base, 3 * kMiB2));  // several whole mappings at once
  REQ_OK(cuMemRelease(h1));
  REQ_OK(cuMemRelease(h2));
  REQ_OK(cuMemAddressFree(base, 8 * kMiB2));
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.empty() && r.mappings.empty());
  return 0;
}

/// Descriptors that are not tickets: counted; malformed tickets and
/// descriptors of the wrong kind refused; counts fall when released.
int foreign() {
  REQ_OK(init_primary());
  Child c = spawn([&](int sock) {
    unsetenv("CUSNAP_RUNTIME_DIR");  // an untracked process: real descriptors
    FC_REQ(init_primary() == CUDA_SUCCESS);
    VmmBuffer b;
    FC_REQ(vmm_create(kMiB2, &b) == CUDA_SUCCESS);
    FC_REQ(!is_logical(b.handle));
    fill(b.ptr, b.size, 0x5A);
    int fd = -1;
    FC_REQ(cuMemExportToShareableHandle(&fd, b.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                        0) == CUDA_SUCCESS);
    FC_REQ(send_fd(sock, fd));
    uint64_t v;
    FC_REQ(recv_u64(sock, &v));
    return 0;
  });
  int fd = recv_fd(c.sock);
  REQ(fd >= 0);
  proto::ShimRecords r;
  REQ(inspect(getpid(), &r));
  const uint64_t calls = r.sharing_calls;  // every import below counts, failed or not
  CUmemGenericAllocationHandle h;
  REQ_OK(import_fd(fd, &h));
  REQ(is_logical(h));
  CUdeviceptr p;
  REQ_OK(vmm_map_handle(h, kMiB2, &p));
  REQ(all(p, kMiB2, 0x5A));
  REQ(inspect(getpid(), &r));
  REQ(r.foreign_imports_alive == 1 && r.foreign_imports_total == 1);
  REQ(r.sharing_calls == calls + 1);
  REQ(find_origin(r, "foreign") != nullptr);
  // A memfd named like a ticket with the wrong contents.
  int bad = memfd_create("cusnap-ticket", MFD_CLOEXEC);
  REQ(write(bad, "garbage", 7) == 7);
  CUmemGenericAllocationHandle hb;
  REQ(import_fd(bad, &hb) == CUDA_ERROR_INVALID_VALUE);
  proto::Ticket t{};
  memcpy(t.magic, proto::kTicketMagic, 8);
  t.version = 99;
  t.size = sizeof(t);
  REQ(pwrite(bad, &t, sizeof(t), 0) == sizeof(t));
  REQ(ftruncate(bad, sizeof(t)) == 0);
  REQ(import_fd(bad, &hb) == CUDA_ERROR_INVALID_VALUE);
  // A well-formed ticket naming a process that serves nothing.
  t.version = proto::kTicketVersion;
  t.creator_pid = c.pid;
  t.allocation = 1;
  snprintf(t.socket, sizeof(t.socket), "%s/no-such.sock", g_dir.c_str());
  REQ(pwrite(bad, &t, sizeof(t), 0) == sizeof(t));
  REQ(import_fd(bad, &hb) == CUDA_ERROR_INVALID_HANDLE);
  close(bad);
  // Descriptors of the wrong kind go to the driver, which refuses them.
  int pipefd[2];
  REQ(pipe(pipefd) == 0);
  REQ(import_fd(pipefd[0], &hb) != CUDA_SUCCESS);
  int dn = open("/dev/null", O_RDONLY);
  REQ(import_fd(dn, &hb) != CUDA_SUCCESS);
  REQ(import_fd(-1, &hb) != CUDA_SUCCESS);
  close(dn);
  close(pipefd[0]);
  close(pipefd[1]);
  REQ(inspect(getpid(), &r));
  REQ(r.foreign_imports_alive == 1 && r.foreign_imports_total == 1);
  REQ(r.sharing_calls == calls + 7);
  REQ_OK(cuMemUnmap(p, kMiB2));
  REQ_OK(cuMemRelease(h));
  REQ(inspect(getpid(), &r));
  REQ(r.foreign_imports_alive == 0 && r.foreign_imports_total == 1 && r.allocations.empty());
  close(fd);
  send_u64(c.sock, 1);
  REQ(c.join() == 0);
  return 0;
}

/// Legacy IPC on cuMemAlloc memory: the same address on repeated opens in one
/// context, bytes both ways, records on both sides.
int ipc() {
  REQ_OK(init_primary());
  CUdeviceptr d;
  REQ_OK(cuMemAlloc(&d, 3 << 20));  // not a multiple of the granularity
  fill(d, 3 << 20, 0x61);
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
    FC_REQ(init_primary() == CUDA_SUCCESS);
    proto::ShimRecords rr;
    FC_REQ(inspect(getpid(), &rr));
    const uint64_t child_calls = rr.sharing_calls;
    CUdeviceptr p1 = 0, p2 = 0;
    FC_REQ(cuIpcOpenMemHandle(&p1, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
    FC_REQ(cuIpcOpenMemHandle(&p2, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
    FC_REQ(p1 == p2 && p1 != 0);
    FC_REQ(all(p1, 3 << 20, 0x61));
    fill(p1, 3 << 20, 0x62);
    FC_REQ(inspect(getpid(), &rr));
    FC_REQ(rr.sharing_calls == child_calls + 2);
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
  for (CUstreamCaptureMode mode : {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL}) {
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

/// Flags the records give device `dev` on the mapping at `addr` (0: none).
uint32_t recorded_access(const proto::ShimRecords& r, uint64_t addr, int32_t dev) {
  for (auto& m : r.mappings)
    if (m.address == addr)
      for (auto& a : m.access)
        if (a.type == CU_MEM_LOCATION_TYPE_DEVICE && a.id == dev) return a.flags;
  return 0;
}

unsigned long long driver_access(CUdeviceptr p, int dev) {
  CUmemLocation loc{};
  loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
  loc.id = dev;
  unsigned long long f = ~0ull;
  if (cuMemGetAccess(&f, &loc, p) != CUDA_SUCCESS) return ~0ull;
  return f;
}

/// Peer access reaches cuMemAlloc blocks served by VMM mappings: device 1's
/// context enables access to device 0's context; device 0's blocks (existing
/// and new) get read-write for device 1, in the driver and in the records;
/// disabling revokes what peer access alone granted, never what the
/// application set itself. The enable also goes through the pointer
/// cuGetProcAddress hands out (the runtime's cudaDeviceEnablePeerAccess path).
int peer() {
  REQ_OK(cuInit(0));
  CUdevice dev0, dev1;
  REQ_OK(cuDeviceGet(&dev0, 0));
  REQ_OK(cuDeviceGet(&dev1, 1));
  CUcontext c0, c1;
  REQ_OK(cuDevicePrimaryCtxRetain(&c0, dev0));
  REQ_OK(cuDevicePrimaryCtxRetain(&c1, dev1));
  const unsigned long long RW = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const size_t n = 1 << 20;

  REQ_OK(cuCtxSetCurrent(c0));
  CUdeviceptr before;  // a block of device 0 made before peer access
  REQ_OK(cuMemAlloc(&before, n));
  fill(before, n, 0x31);
  REQ(driver_access(before, 0) == RW && driver_access(before, 1) == 0);

  REQ_OK(cuCtxSetCurrent(c1));
  CUdeviceptr own1;  // device 1's own block: device 0 never enables access
  REQ_OK(cuMemAlloc(&own1, n));
  REQ(cuCtxEnablePeerAccess(c1, 0) == CUDA_ERROR_INVALID_DEVICE);
  REQ_OK(cuCtxEnablePeerAccess(c0, 0));
  REQ(cuCtxEnablePeerAccess(c0, 0) == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
  REQ(driver_access(before, 1) == RW);
  REQ(driver_access(own1, 0) == 0);
  REQ(all(before, n, 0x31));  // read from device 1's context
  fill(before, n, 0x32);      // and written
  proto::ShimRecords r;
  REQ(inspect(getpid(), &r));
  REQ(recorded_access(r, before, 1) == RW && recorded_access(r, before, 0) == RW);
  REQ(recorded_access(r, own1, 0) == 0);

  REQ_OK(cuCtxSetCurrent(c0));
  CUdeviceptr after, kept;  // blocks of device 0 made while peer access is on
  REQ_OK(cuMemAlloc(&after, n));
  REQ_OK(cuMemAlloc(&kept, n));
  REQ(driver_access(after, 1) == RW && driver_access(kept, 1) == RW);
  CUmemAccessDesc mine{};  // the application grants `kept` itself as well
  mine.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  mine.location.id = 1;
  mine.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  REQ_OK(cuMemSetAccess(kept, 2 << 20, &mine, 1));
  REQ(all(before, n, 0x32));

  REQ_OK(cuCtxSetCurrent(c1));
  REQ_OK(cuCtxDisablePeerAccess(c0));
  REQ(cuCtxDisablePeerAccess(c0) == CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  REQ(driver_access(before, 1) == 0 && driver_access(after, 1) == 0);
  REQ(driver_access(before, 0) == RW && driver_access(after, 0) == RW);
  REQ(driver_access(kept, 1) == RW);
  REQ(inspect(getpid(), &r));
  REQ(recorded_access(r, before, 1) == 0 && recorded_access(r, after, 1) == 0);
  REQ(recorded_access(r, kept, 1) == RW && recorded_access(r, before, 0) == RW);

  // Enabled again through the resolver's pointer, as the runtime calls it.
  void* fn = nullptr;
  CUdriverProcAddressQueryResult st;
  REQ_OK(cuGetProcAddress_v2("cuCtxEnablePeerAccess", &fn, 12000, 0, &st));
  REQ(fn != nullptr);
  auto enable = reinterpret_cast<CUresult (*)(CUcontext, unsigned)>(fn);
  REQ_OK(enable(c0, 0));
  REQ(driver_access(before, 1) == RW && driver_access(after, 1) == RW);
  REQ(inspect(getpid(), &r));
  REQ(recorded_access(r, before, 1) == RW && recorded_access(r, after, 1) == RW);
  REQ_OK(cuCtxDisablePeerAccess(c0));
  REQ(driver_access(before, 1) == 0 && driver_access(kept, 1) == RW);

  REQ_OK(cuMemFree(own1));
  REQ_OK(cuCtxSetCurrent(c0));
  REQ_OK(cuMemFree(before));
  REQ_OK(cuMemFree(after));
  REQ_OK(cuMemFree(kept));
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.empty() && r.mappings.empty());
  return 0;
}

/// A multicast group of three members (FAKECUDA_MULTICAST=1, three devices):
/// logical member handles translated, both bind ABIs recorded.
int multicast() {
  REQ_OK(init_primary());
  int n = 0;
  REQ_OK(cuDeviceGetCount(&n));
  REQ(n >= 3);
  CUmulticastObjectProp mp{};
  mp.numDevices = 3;
  mp.size = kMiB2;
  mp.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  proto::ShimRecords r;
  REQ(inspect(getpid(), &r));
  const uint64_t calls = r.sharing_calls;
  CUmemGenericAllocationHandle mc;
  REQ_OK(cuMulticastCreate(&mc, &mp));
  for (int dev = 0; dev < 3; ++dev) REQ_OK(cuMulticastAddDevice(mc, dev));
  REQ(inspect(getpid(), &r));
  REQ(r.sharing_calls == calls + 4);
  CUmemGenericAllocationHandle mem[3];
  for (int dev = 0; dev < 3; ++dev) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    REQ_OK(cuMemCreate(&mem[dev], kMiB2, &prop, 0));
    REQ(is_logical(mem[dev]));
  }
  REQ_OK(cuMulticastBindMem(mc, 0, mem[0], 0, kMiB2, 0));
  REQ_OK(cuMulticastBindMem_v2(mc, 1, 0, mem[1], 0, kMiB2, 0));
  REQ_OK(cuMulticastBindMem_v2(mc, 2, 0, mem[2], 0, kMiB2, 0));
  REQ(cuMulticastBindMem_v2(mc, 2, 0, 0xC5A9000000FFFFFFull, 0, kMiB2, 0) ==
      CUDA_ERROR_INVALID_HANDLE);
  CUdeviceptr va;
  REQ_OK(cuMemAddressReserve(&va, kMiB2, 0, 0, 0));
  REQ_OK(cuMemMap(va, kMiB2, 0, mc, 0));
  REQ(inspect(getpid(), &r));
  REQ(r.multicast.size() == 1);
  auto& m = r.multicast[0];
  REQ(m.handle == mc && m.num_devices == 3 && m.devices == std::vector<int32_t>({0, 1, 2}));
  REQ(m.bindings.size() == 3);
  REQ(m.bindings[0].abi == 1 && m.bindings[0].device == 0);
  REQ(m.bindings[1].abi == 2 && m.bindings[1].device == 1);
  REQ(m.bindings[2].abi == 2 && m.bindings[2].device == 2);
  for (auto& b : m.bindings) REQ(b.allocation != 0);
  REQ(r.mappings.size() == 1 && r.mappings[0].multicast == mc);
  REQ_OK(cuMulticastUnbind(mc, 1, 0, kMiB2));
  REQ(inspect(getpid(), &r));
  REQ(r.multicast[0].bindings.size() == 2);
  REQ_OK(cuMemUnmap(va, kMiB2));
  REQ_OK(cuMemAddressFree(va, kMiB2));
  REQ_OK(cuMulticastUnbind(mc, 0, 0, kMiB2));
  REQ_OK(cuMulticastUnbind(mc, 2, 0, kMiB2));
  REQ_OK(cuMemRelease(mc));
  for (auto h : mem) REQ_OK(cuMemRelease(h));
  REQ(inspect(getpid(), &r));
  REQ(r.multicast.empty() && r.allocations.empty());
  return 0;
}

/// Fork children drop inherited records and register on their first CUDA
/// activity, including a cuGetProcAddress resolution.
int forkchild() {
  REQ_OK(init_primary());
  VmmBuffer a;
  REQ(make_buffer(kMiB2, &a) == 0);
  Child c = spawn([&](int sock) {
    // First activity: a resolution, not cuInit.
    void* fn = nullptr;
    CUdriverProcAddressQueryResult st;
    FC_REQ(cuGetProcAddress_v2("cuMemCreate", &fn, 12000, 0, &st) == CUDA_SUCCESS || fn == nullptr);
    proto::ShimRecords r;
    FC_REQ(inspect(getpid(), &r));
    FC_REQ(r.allocations.empty() && r.mappings.empty());
    FC_REQ(init_primary() == CUDA_SUCCESS);
    FC_REQ(cuMemRelease(a.handle) == CUDA_ERROR_INVALID_HANDLE);  // the parent's
    VmmBuffer b;
    FC_REQ(vmm_create(kMiB2, &b) == CUDA_SUCCESS);
    FC_REQ(inspect(getpid(), &r));
    FC_REQ(r.allocations.size() == 1 && r.allocations[0].creator_pid == getpid());
    // A grandchild too.
    Child g = spawn([](int) {
      FC_REQ(init_primary() == CUDA_SUCCESS);
      proto::ShimRecords rg;
      FC_REQ(inspect(getpid(), &rg));
      FC_REQ(rg.allocations.empty());
      return 0;
    });
    FC_REQ(g.join() == 0);
    (void)sock;
    return 0;
  });
  REQ(c.join() == 0);
  proto::ShimRecords r;
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.size() == 1 && r.allocations[0].handles == 1);
  REQ_OK(vmm_destroy(a));
  return 0;
}

/// A creator inside a long driver call (FAKECUDA_DELAY) still serves an import.
int busy_creator() {
  Child c = spawn([](int sock) {
    setenv("FAKECUDA_DELAY", "cuCtxSynchronize:4000", 1);
    FC_REQ(init_primary() == CUDA_SUCCESS);
    VmmBuffer b;
    FC_REQ(vmm_create(kMiB2, &b) == CUDA_SUCCESS);
    fill(b.ptr, b.size, 0x0B);
    int t = export_ticket(b.handle);
    FC_REQ(send_fd(sock, t));
    FC_REQ(cuCtxSynchronize() == CUDA_SUCCESS);  // 4 s inside the driver
    uint64_t v;
    FC_REQ(recv_u64(sock, &v));
    return 0;
  });
  REQ_OK(init_primary());
  int t = recv_fd(c.sock);
  REQ(t >= 0);
  usleep(200 * 1000);  // the creator is inside cuCtxSynchronize now
  auto t0 = std::chrono::steady_clock::now();
  CUmemGenericAllocationHandle h;
  REQ_OK(import_fd(t, &h));
  auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  fprintf(stderr, "import while the creator is busy: %lld ms\n", (long long)ms);
  REQ(ms < 2000);
  CUdeviceptr p;
  REQ_OK(vmm_map_handle(h, kMiB2, &p));
  REQ(all(p, kMiB2, 0x0B));
  send_u64(c.sock, 1);
  REQ(c.join() == 0);
  close(t);
  return 0;
}

/// Raw bytes to a socket, then close.
bool poke(const std::string& path, const std::string& bytes, bool read_reply) {
  UniqueFd fd;
  std::string err;
  if (!proto::connect_unix(path, std::chrono::seconds(2), &fd, &err)) return false;
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = send(fd.get(), bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;
    off += size_t(n);
  }
  if (read_reply) {
    char buf[256];
    pollfd p{fd.get(), POLLIN, 0};
    poll(&p, 1, 3000);
    (void)!read(fd.get(), buf, sizeof(buf));
  }
  return true;
}

/// Peers that die mid-exchange, malformed and oversized messages on both
/// sockets, a creator that dies: the shim keeps serving and never crashes.
int hostile() {
  setenv("CUSNAP_CONTROL_TIMEOUT", "1", 1);
  REQ_OK(init_primary());
  VmmBuffer a;
  REQ(make_buffer(kMiB2, &a) == 0);
  fill(a.ptr, a.size, 0x3C);
  const std::string peer = proto::shim_peer_socket(g_dir, getpid());
  const std::string ctl = proto::shim_control_socket(g_dir, getpid());
  auto u32 = [](uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); };
  std::vector<std::string> junk = {
      u32(0xFFFFFFFF),                                // over the 32 MiB limit
      u32(33u << 20) + "x",                           // just over, with a byte
      u32(10) + "abc",                                // truncated, then closed
      u32(3) + "\xc1\xc1\xc1",                        // not msgpack
      u32(2) + "\x91\x01",                            // wrong shape
      proto::frame(proto::encode_body("fetch", 42)),  // payload of the wrong type
      proto::frame(proto::encode_body("fetch", proto::Empty{})) + "zz",  // trailing frame bytes
      proto::frame(proto::encode_body("no-such-request", proto::Empty{})),
      proto::frame(std::string("\x93\x63\xa5\x66\x65\x74\x63\x68\x80", 9)),  // version 99
      u32(0),
  };
  for (auto& j : junk) {
    REQ(poke(peer, j, true));
    REQ(poke(ctl, j, true));
  }
  // A peer that connects and dies without a word, while another imports.
  pid_t dier = fork();
  if (dier == 0) {
    UniqueFd fd;
    std::string err;
    proto::connect_unix(peer, std::chrono::seconds(2), &fd, &err);
    send(fd.get(), "\x10\x00", 2, MSG_NOSIGNAL);
    _exit(0);  // dies mid-frame
  }
  waitpid(dier, nullptr, 0);
  // Fetch for an allocation never exported / another start time: refused.
  {
    UniqueFd fd;
    std::string err;
    REQ(proto::connect_unix(peer, std::chrono::seconds(2), &fd, &err));
    proto::Channel ch(std::move(fd), std::chrono::seconds(3));
    REQ(ch.send(proto::kMsgFetch, proto::FetchRequest{1, 999}, &err));
    proto::Message m;
    proto::FetchReply rep;
    REQ(ch.recv(&m, &err) && m.type == proto::kMsgFetched && m.get(&rep, &err));
    REQ(!rep.ok && !m.fd);
  }
  // Unknown control requests are answered, not dropped.
  {
    UniqueFd fd;
    std::string err;
    REQ(proto::connect_unix(ctl, std::chrono::seconds(2), &fd, &err));
    proto::Channel ch(std::move(fd), std::chrono::seconds(3));
    REQ(ch.send("frobnicate", proto::Empty{}, &err));
    proto::Message m;
    proto::Done done;
    REQ(ch.recv(&m, &err) && m.type == proto::kMsgDone && m.get(&done, &err) && !done.ok);
    REQ(ch.send(proto::kMsgGateClose, proto::GateRequest{1000}, &err));
    REQ(ch.recv(&m, &err) && m.get(&done, &err) && done.ok);
    REQ(ch.send(proto::kMsgGateOpen, proto::Empty{}, &err));
    REQ(ch.recv(&m, &err) && m.get(&done, &err) && done.ok);
  }
  // Still serving: a child imports and reads.
  Child c = spawn([&](int sock) {
    FC_REQ(init_primary() == CUDA_SUCCESS);
    int t = recv_fd(sock);
    CUmemGenericAllocationHandle h;
    FC_REQ(import_fd(t, &h) == CUDA_SUCCESS);
    CUdeviceptr p;
    FC_REQ(vmm_map_handle(h, kMiB2, &p) == CUDA_SUCCESS);
    FC_REQ(all(p, kMiB2, 0x3C));
    return 0;
  });
  int t = export_ticket(a.handle);
  REQ(send_fd(c.sock, t));
  REQ(c.join() == 0);
  // A creator that is gone: its tickets fail cleanly.
  Child dead = spawn([](int sock) {
    FC_REQ(init_primary() == CUDA_SUCCESS);
    VmmBuffer b;
    FC_REQ(vmm_create(kMiB2, &b) == CUDA_SUCCESS);
    int tt = export_ticket(b.handle);
    FC_REQ(send_fd(sock, tt));
    return 0;
  });
  // A "creator" that accepts and dies without answering: the import ends
  // within the exchange timeout.
  {
    const std::string fake = g_dir + "/fake-peer.sock";
    int pfd[2];
    REQ(pipe(pfd) == 0);
    pid_t fk = fork();
    if (fk == 0) {
      UniqueFd l, conn;
      std::string err;
      if (!proto::listen_unix(fake, 0600, &l, &err)) _exit(1);
      (void)!write(pfd[1], "r", 1);
      pollfd pl{l.get(), POLLIN, 0};
      poll(&pl, 1, 5000);
      proto::accept_unix(l.get(), &conn, &err);
      char b[4];
      (void)!read(conn.get(), b, sizeof(b));  // half a request, then gone
      _exit(0);
    }
    char r;
    REQ(read(pfd[0], &r, 1) == 1);
    int tk = memfd_create("cusnap-ticket", MFD_CLOEXEC);
    proto::Ticket t{};
    memcpy(t.magic, proto::kTicketMagic, 8);
    t.version = proto::kTicketVersion;
    t.size = sizeof(t);
    t.creator_pid = fk;
    t.creator_start = 1;
    t.allocation = 1;
    t.bytes = kMiB2;
    snprintf(t.socket, sizeof(t.socket), "%s", fake.c_str());
    REQ(pwrite(tk, &t, sizeof(t), 0) == sizeof(t));
    auto t0 = std::chrono::steady_clock::now();
    CUmemGenericAllocationHandle hk;
    REQ(import_fd(tk, &hk) == CUDA_ERROR_INVALID_HANDLE);
    REQ(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(4));
    waitpid(fk, nullptr, 0);
    close(tk);
    close(pfd[0]);
    close(pfd[1]);
  }
  int td = recv_fd(dead.sock);
  REQ(td >= 0);
  REQ(dead.join() == 0);
  CUmemGenericAllocationHandle h;
  REQ(import_fd(td, &h) == CUDA_ERROR_INVALID_HANDLE);
  proto::ShimRecords r;
  REQ(inspect(getpid(), &r));
  REQ(r.allocations.size() == 1);
  close(td);
  close(t);
  REQ_OK(vmm_destroy(a));
  return 0;
}

/// Outside cusnap (no runtime directory) the shim tracks nothing.
int passthrough() {
  unsetenv("CUSNAP_RUNTIME_DIR");
  REQ_OK(init_primary());
  VmmBuffer a;
  REQ(make_buffer(kMiB2, &a) == 0);
  REQ(!is_logical(a.handle));
  REQ(access(proto::shim_control_socket(g_dir, getpid()).c_str(), F_OK) != 0);
  REQ_OK(vmm_destroy(a));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: shim_track_test SCENARIO\n");
    return 2;
  }
  char tmpl[] = "/tmp/cusnap-track.XXXXXX";
  if (!mkdtemp(tmpl)) return 2;
  g_dir = tmpl;
  setenv("CUSNAP_RUNTIME_DIR", tmpl, 1);
  signal(SIGPIPE, SIG_IGN);
  const std::map<std::string, int (*)()> scenarios = {
      {"share2", share2},
      {"share4", share4},
      {"alias", alias},
      {"access", access_unions},
      {"foreign", foreign},
      {"ipc", ipc},
      {"multicast", multicast},
      {"fork", forkchild},
      {"busy_creator", busy_creator},
      {"hostile", hostile},
      {"passthrough", passthrough},
      {"peer", peer},
      {"free_in_capture", free_in_capture},
      {"alloc_in_capture", alloc_in_capture},
  };
  auto it = scenarios.find(argv[1]);
  int rc = it == scenarios.end() ? 2 : it->second();
  std::string cmd = "rm -rf '" + g_dir + "'";
  if (system(cmd.c_str()) != 0) {
  }
  fprintf(stderr, "%s: %s\n", argv[1], rc == 0 ? "passed" : "FAILED");
  return rc;
}
