// cusnap-share-job: two processes sharing one device allocation, the case the
// driver's process checkpoint cannot restore by itself (cusnap restores it
// through the shim; without the shim it refuses the job).
//
//   cusnap-share-job [--mib N] [--interval-ms M] [--share-after PATH] [--private-mib P]
//
// Forks first (before any driver call). The parent creates an exportable VMM
// allocation (cuMemCreate, POSIX file descriptor handle), writes a pattern,
// and passes the exported descriptor to the child over a Unix socket; the
// child imports and maps it. Layout and checks: share_util.h. Every
// iteration each process verifies the creator's constant pattern, fills its
// own slot with its counter and reads it back, and reads the other's slot
// (every word may only grow). It prints "count N ok" and "seen S" (the
// importer: "importer count N ok", "importer seen S"), S being the smallest
// counter value of the other process found in the shared bytes. Exit status
// 2 when a driver call fails, 3 when a byte is wrong, 4 (parent) when the
// importer ended. --share-after PATH: both processes set up their context
// (the parent also creates and fills the allocation), print "waiting", and
// the parent exports it only once PATH exists: a job that begins to share
// device memory while it runs. --private-mib P: each process also holds P
// MiB of device memory of its own (cuMemAlloc, filled once), which the
// driver's checkpoint copies: a test on the real driver lengthens that
// checkpoint with it, to act while it runs.
#include <unistd.h>

#include "share_util.h"

using namespace workload::share;

int main(int argc, char** argv) {
  Args args(argc, argv, "cusnap-share-job", {},
            {"--mib", "--interval-ms", "--share-after", "--private-mib"});
  const size_t private_mib = size_t(args.num("--private-mib", 0));
  size_t mib = size_t(args.num("--mib", 4));
  long interval_ms = args.num("--interval-ms", 100);
  const std::string share_after = args.str("--share-after");
  setvbuf(stdout, nullptr, _IOLBF, 0);
  auto [importer, child, sock] = fork_pair();
  const char* who = importer ? "cusnap-share-job importer" : "cusnap-share-job";
  const char* prefix = importer ? "importer " : "";
  CUdevice dev = workload::init_device(who);
  size_t size = vmm_size(dev, mib, who);
  if (private_mib) {
    CUdeviceptr own = 0;
    const size_t bytes = private_mib << 20;
    if (cuMemAlloc(&own, bytes) != CUDA_SUCCESS || cuMemsetD8(own, 0xA5, bytes) != CUDA_SUCCESS) {
      std::fprintf(stderr, "%s: cannot hold %zu MiB of its own\n", who, private_mib);
      return 2;
    }
  }

  CUdeviceptr ptr;
  if (importer) {
    if (!share_after.empty()) std::printf("importer waiting\n");
    int fd = recv_fd(sock);
    if (fd < 0) {
      std::fprintf(stderr, "%s: no descriptor from the exporter\n", who);
      return 2;
    }
    ptr = import_and_map(dev, fd, size, who);
  } else {
    CUmemGenericAllocationHandle h = create_exportable(dev, size, &ptr, who);
    Region(ptr, size, 0, who).fill();
    if (!share_after.empty()) {
      std::printf("waiting\n");
      while (access(share_after.c_str(), F_OK) != 0) usleep(10000);
    }
    int fd = export_fd(h, who);
    send_fd(sock, fd);
    close(fd);
  }
  close(sock);
  Region r(ptr, size, 0, who);
  pair_loop(r, importer, prefix, child, interval_ms);
}
