// cusnap-multicast-job: a multicast group of three members across two
// processes (the simulated driver with FAKECUDA_MULTICAST=1 and three
// devices; never run on a real GPU).
//
//   cusnap-multicast-job [--interval-ms M]
//
// Forks first. The child ("member ") creates the member on device 2, writes
// its pattern and exports it to the parent over a Unix socket. The parent
// ("group ") creates the members on devices 0 and 1, imports the child's,
// creates a multicast object of three devices, binds the three members (the
// first with the CUDA 13.0 ABI, the others with the 13.1 device-explicit one),
// maps the object with access for all three devices. Every iteration the
// parent checks every member's pattern through its own mapping, writes its
// counter through the multicast mapping and reads it back (once more when a
// checkpoint between the two left the object's bytes zero: the simulated
// object keeps its own); the child checks its member. Both print
// "PREFIXcount N ok". Exit 2 on a driver error, 3 on a wrong byte, 4 when the
// other process ended.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "share_util.h"

extern "C" CUresult CUDAAPI cuMulticastBindMem_v2(CUmemGenericAllocationHandle, CUdevice, size_t,
                                                  CUmemGenericAllocationHandle, size_t, size_t,
                                                  unsigned long long);

using namespace workload::share;

namespace {

constexpr int kDevices = 3;

void check_member(CUdeviceptr p, size_t size, unsigned member, long count, const char* who,
                  std::vector<uint8_t>* buf) {
  buf->resize(size);
  WL_CHECK(cuMemcpyDtoH(buf->data(), p, size), who);
  for (size_t i = 0; i < size; ++i)
    if ((*buf)[i] != pattern(member, i)) {
      std::fprintf(stderr, "%s: pattern mismatch at byte %zu of member %u (count %ld)\n", who, i,
                   member, count);
      std::exit(3);
    }
}

CUdeviceptr map_all(CUmemGenericAllocationHandle h, size_t size, const char* who) {
  CUdeviceptr ptr;
  WL_CHECK(cuMemAddressReserve(&ptr, size, 0, 0, 0), who);
  WL_CHECK(cuMemMap(ptr, size, 0, h, 0), who);
  CUmemAccessDesc access[kDevices] = {};
  for (int d = 0; d < kDevices; ++d) {
    access[d].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[d].location.id = d;
    access[d].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  WL_CHECK(cuMemSetAccess(ptr, size, access, kDevices), who);
  return ptr;
}

void fill(CUdeviceptr p, size_t size, unsigned member, const char* who) {
  std::vector<uint8_t> buf(size);
  for (size_t i = 0; i < size; ++i) buf[i] = pattern(member, i);
  WL_CHECK(cuMemcpyHtoD(p, buf.data(), size), who);
}

}  // namespace

int main(int argc, char** argv) {
  Args args(argc, argv, "cusnap-multicast-job", {}, {"--interval-ms"});
  long interval_ms = args.num("--interval-ms", 100);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  auto [child_side, child, sock] = fork_pair();
  const char* who = child_side ? "cusnap-multicast-job member" : "cusnap-multicast-job";
  const char* prefix = child_side ? "member " : "group ";
  workload::init_device(who);
  int n = 0;
  WL_CHECK(cuDeviceGetCount(&n), who);
  if (n < kDevices) {
    std::fprintf(stderr, "%s: needs %d devices, the driver shows %d\n", who, kDevices, n);
    return 2;
  }
  CUmemAllocationProp prop = posix_fd_prop(0);
  size_t gran = 0;
  WL_CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), who);
  const size_t size = gran;
  std::vector<uint8_t> buf;
  pid_t parent = getppid();

  if (child_side) {
    CUdeviceptr p;
    CUmemGenericAllocationHandle h = create_exportable(2, size, &p, who);
    fill(p, size, 2, who);
    int fd = export_fd(h, who);
    send_fd(sock, fd);
    close(fd);
    std::printf("%sready pid %d\n", prefix, int(getpid()));
    for (long count = 1;; ++count) {
      check_member(p, size, 2, count, who, &buf);
      std::printf("%scount %ld ok\n", prefix, count);
      if (getppid() != parent) return 4;
      usleep(useconds_t(interval_ms * 1000));
    }
  }

  CUmemGenericAllocationHandle mem[kDevices];
  CUdeviceptr ptr[kDevices];
  for (int d = 0; d < 2; ++d) {
    mem[d] = create_exportable(d, size, &ptr[d], who);
    fill(ptr[d], size, unsigned(d), who);
  }
  int fd = recv_fd(sock);
  if (fd < 0) {
    std::fprintf(stderr, "%s: no descriptor from the member process\n", who);
    return 2;
  }
  WL_CHECK(cuMemImportFromShareableHandle(&mem[2], reinterpret_cast<void*>(intptr_t(fd)),
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
           who);
  close(fd);
  ptr[2] = map_rw(0, mem[2], size, who);

  CUmulticastObjectProp mp{};
  mp.numDevices = kDevices;
  mp.size = size;
  mp.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle mc;
  WL_CHECK(cuMulticastCreate(&mc, &mp), who);
  for (int d = 0; d < kDevices; ++d) WL_CHECK(cuMulticastAddDevice(mc, d), who);
  WL_CHECK(cuMulticastBindMem(mc, 0, mem[0], 0, size, 0), who);
  for (int d = 1; d < kDevices; ++d)
    WL_CHECK(cuMulticastBindMem_v2(mc, d, 0, mem[d], 0, size, 0), who);
  CUdeviceptr mcp = map_all(mc, size, who);
  std::printf("%sready pid %d\n", prefix, int(getpid()));
  std::vector<uint32_t> words(size / 4), back(size / 4);
  for (long count = 1;; ++count) {
    for (int d = 0; d < kDevices; ++d) check_member(ptr[d], size, unsigned(d), count, who, &buf);
    std::fill(words.begin(), words.end(), uint32_t(count));
    WL_CHECK(cuMemcpyHtoD(mcp, words.data(), size), who);
    WL_CHECK(cuMemcpyDtoH(back.data(), mcp, size), who);
    if (back != words && std::all_of(back.begin(), back.end(), [](uint32_t w) { return w == 0; })) {
      // A checkpoint between the two copies: the simulated object keeps
      // bytes of its own, which the rebuild starts afresh (zero); a real
      // object's bytes are its members', which the checkpoint saves. The
      // mapping must still take a write and give it back.
      std::printf("%smulticast object rebuilt between write and read (count %ld)\n", prefix, count);
      WL_CHECK(cuMemcpyHtoD(mcp, words.data(), size), who);
      WL_CHECK(cuMemcpyDtoH(back.data(), mcp, size), who);
    }
    if (back != words) {
      std::fprintf(stderr, "%s: pattern mismatch through the multicast mapping (count %ld)\n", who,
                   count);
      return 3;
    }
    std::printf("%scount %ld ok\n", prefix, count);
    if (waitpid(child, nullptr, WNOHANG) == child) return 4;
    usleep(useconds_t(interval_ms * 1000));
  }
}
