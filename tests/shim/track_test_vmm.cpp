// shim_track_test scenarios on VMM allocations shared by descriptor
// (tickets): a creator and importers in both directions and among four
// processes, aliases of one driver handle, access unions and refused
// overlaps, descriptors that are not tickets, and multicast objects.
// Helpers: track_test.h.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "tests/shim/track_test.h"

namespace track_test {

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
    FC_REQ(h3 == h1);  // the handle it was mapped with, as the driver's, one more reference
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
    // Retain after the last release gets a driver handle again, under the
    // handle's value.
    CUmemGenericAllocationHandle h4;
    FC_REQ(cuMemRetainAllocationHandle(&h4, reinterpret_cast<void*>(p)) == CUDA_SUCCESS);
    FC_REQ(h4 == h1);
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

/// NCCL's free of a cuMem buffer (ncclCuMemFree): retain the handle of the
/// mapping, release it, read the range, unmap it, release the same value
/// again (the handle the buffer was created and mapped with), free the
/// reservation. Every step succeeds and nothing is left, as on the driver,
/// whose retain returns the handle used to map the memory; before, the shim's
/// retain made a new handle, the second release failed INVALID_HANDLE, and
/// NCCL leaked the buffer. The same on a peer's imported mapping (NCCL's
/// deregistration). A cuMemAlloc block the shim serves is refused, as the
/// driver refuses one (INVALID_VALUE).
int nccl_free() {
  REQ_OK(init_primary());
  auto free_like_nccl = [](CUdeviceptr ptr) -> int {
    CUmemGenericAllocationHandle h = 0;
    REQ_OK(cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(ptr)));
    REQ_OK(cuMemRelease(h));
    size_t size = 0;
    REQ_OK(cuMemGetAddressRange(nullptr, &size, ptr));
    REQ_OK(cuMemUnmap(ptr, size));
    REQ_OK(cuMemRelease(h));
    REQ_OK(cuMemAddressFree(ptr, size));
    proto::ShimRecords r;
    REQ(inspect(getpid(), &r));
    REQ(r.allocations.empty() && r.mappings.empty());
    return 0;
  };
  VmmBuffer a;
  REQ(make_buffer(kMiB2, &a) == 0);
  fill(a.ptr, a.size, 0x3C);
  const int t = export_ticket(a.handle);
  Child c = spawn([&](int sock) {
    FC_REQ(init_primary() == CUDA_SUCCESS);
    int got = recv_fd(sock);
    CUmemGenericAllocationHandle h;
    FC_REQ(import_fd(got, &h) == CUDA_SUCCESS);
    close(got);
    CUdeviceptr p;
    FC_REQ(vmm_map_handle(h, kMiB2, &p) == CUDA_SUCCESS);
    FC_REQ(all(p, kMiB2, 0x3C));
    FC_REQ(free_like_nccl(p) == 0);
    return 0;
  });
  REQ(send_fd(c.sock, t));
  close(t);
  REQ(c.join() == 0);
  REQ(free_like_nccl(a.ptr) == 0);

  CUdeviceptr d = 0;
  REQ_OK(cuMemAlloc(&d, 1 << 20));
  CUmemGenericAllocationHandle h = 0;
  REQ(cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(d)) == CUDA_ERROR_INVALID_VALUE);
  REQ_OK(cuMemFree(d));
  return 0;
}

}  // namespace track_test
