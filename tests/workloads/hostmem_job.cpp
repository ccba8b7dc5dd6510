// cusnap-hostmem-job: a thread writes pinned host memory all the time, with
// no driver call, while the main thread uses the device.
//
//   cusnap-hostmem-job [--kind alloc|register] [--mib N] [--interval-ms M]
//                      [--max-count C]
//
// Pins N MiB (default 8) of host memory: --kind alloc takes it from
// cuMemHostAlloc (DEVICEMAP, as NCCL's buffers and work queue), --kind
// register pins an anonymous mapping with cuMemHostRegister. A writer thread
// keeps storing a running sequence number into one 8-byte word per 4 KiB page,
// page after page, about every 50 us, and keeps the same values in private
// (unpinned) memory. It makes no driver call, so nothing stops it while the
// job's GPU state is locked, checkpointed or restored, as NCCL's proxy thread
// goes on moving bytes between its sockets and pinned buffers.
// The main thread, every M ms (default 100): copies the pinned memory to the
// device and back (cuMemcpyHtoD/DtoH of one page), then compares every page
// of the pinned memory with the private copy under the writer's lock, and
// prints "count N ok". A page that differs prints "MISMATCH page P holds X,
// the process wrote Y" and exits 3: something other than the process changed
// its own memory.
//
// Exit status: 2 a driver call failed, 3 a mismatch, 0 after --max-count.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "workload_util.h"

namespace {

constexpr size_t kPage = 4096;
const char* const kWho = "cusnap-hostmem-job";

struct Options {
  bool registered = false;
  size_t mib = 8;
  long interval_ms = 100;
  long max_count = 0;
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "%s: %s\nusage: cusnap-hostmem-job [--kind alloc|register] [--mib N] "
               "[--interval-ms M] [--max-count C]\n",
               kWho, msg);
  std::exit(64);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + a).c_str());
    std::string v = argv[++i];
    if (a == "--kind") {
      if (v != "alloc" && v != "register") usage("--kind is alloc or register");
      o.registered = v == "register";
      continue;
    }
    long n = std::strtol(v.c_str(), nullptr, 10);
    if (n < 0) usage(("negative value for " + a).c_str());
    if (a == "--mib") {
      if (n == 0) usage("--mib must be at least 1");
      o.mib = size_t(n);
    } else if (a == "--interval-ms")
      o.interval_ms = n;
    else if (a == "--max-count")
      o.max_count = n;
    else
      usage(("unknown option " + a).c_str());
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  workload::init_device(kWho);
  const size_t bytes = o.mib << 20, pages = bytes / kPage;
  void* host = nullptr;
  if (o.registered) {
    host = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (host == MAP_FAILED) {
      std::perror("mmap");
      return 2;
    }
    WL_CHECK(cuMemHostRegister(host, bytes, 0), kWho);
  } else {
    WL_CHECK(cuMemHostAlloc(&host, bytes, CU_MEMHOSTALLOC_DEVICEMAP), kWho);
  }
  std::memset(host, 0, bytes);
  auto* words = static_cast<volatile uint64_t*>(host);
  std::vector<uint64_t> mine(pages, 0);
  CUdeviceptr dev;
  WL_CHECK(cuMemAlloc(&dev, kPage), kWho);
  std::vector<unsigned char> back(kPage);

  std::mutex mu;
  std::thread writer([&] {
    uint64_t seq = 0;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu);
        ++seq;
        const size_t p = seq % pages;
        words[p * kPage / 8] = seq;
        mine[p] = seq;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  writer.detach();
  std::printf("ready kind %s pinned %zu MiB at %p\n", o.registered ? "register" : "alloc", o.mib,
              host);

  for (long count = 1; o.max_count == 0 || count <= o.max_count; ++count) {
    WL_CHECK(cuMemcpyHtoD(dev, host, kPage), kWho);
    WL_CHECK(cuMemcpyDtoH(back.data(), dev, kPage), kWho);
    {
      std::lock_guard<std::mutex> lock(mu);
      for (size_t p = 0; p < pages; ++p) {
        const uint64_t got = words[p * kPage / 8];
        if (got != mine[p]) {
          std::printf("MISMATCH page %zu holds %llu, the process wrote %llu\n", p,
                      (unsigned long long)got, (unsigned long long)mine[p]);
          std::exit(3);
        }
      }
    }
    std::printf("count %ld ok\n", count);
    std::this_thread::sleep_for(std::chrono::milliseconds(o.interval_ms));
  }
  return 0;
}
