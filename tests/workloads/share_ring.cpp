// cusnap-share-ring: N processes in a ring, each sharing device memory with
// both neighbours.
//
//   cusnap-share-ring --procs N [--mib M] [--interval-ms T] [--tight]
//
// Forks N-1 children first (before any driver call). Process I creates an
// exportable VMM allocation (cuMemCreate, POSIX file descriptor handle),
// fills it (share_util.h: a constant pattern of I and the byte's offset, two
// counter slots), exports it and passes the descriptor to process I+1 over a
// socketpair (SCM_RIGHTS); it imports process I-1's allocation and maps both.
// Every iteration process I verifies the constant pattern of both
// allocations, writes its counter into the importer slot of I-1's allocation
// and into the creator slot of its own (each read back at once), and reads
// the slots its neighbours write (every word may only grow). It prints
// "ring I ready pid P", then "ring I count N ok" and "ring I seen S" (S: the
// smallest neighbour counter found in the shared bytes) every iteration,
// sleeping T ms (default 100) in between.
//
// --tight: no sleep; every iteration fills both slots with cuMemsetD32,
// copies a rotating 64 KiB of the neighbour's pattern into its own
// allocation with cuMemcpyDtoD and reads it back, reads both neighbour
// slots and a rotating 64 KiB of each constant pattern (every byte read is
// checked); the lines come every 1000 iterations or 100 ms.
//
// Exit status: 2 a driver call failed, 3 a byte was wrong, 4 another
// process of the ring ended, 64 bad usage.
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <array>
#include <string>
#include <vector>

#include "share_util.h"

using namespace workload::share;

namespace {

double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

struct Options {
  int procs = 2;
  size_t mib = 2;
  long interval_ms = 100;
  bool tight = false;
};

void run(const Options& o, unsigned index, int send_sock, int recv_sock,
         const std::vector<pid_t>& children) {
  std::string who = "cusnap-share-ring " + std::to_string(index);
  std::string prefix = "ring " + std::to_string(index) + " ";
  unsigned prev_index = (index + unsigned(o.procs) - 1) % unsigned(o.procs);
  CUdevice dev = workload::init_device(who.c_str());
  size_t size = vmm_size(dev, o.mib, who.c_str());

  CUdeviceptr own_ptr;
  CUmemGenericAllocationHandle h = create_exportable(dev, size, &own_ptr, who.c_str());
  Region own(own_ptr, size, index, who);
  own.fill();
  int fd = export_fd(h, who.c_str());
  send_fd(send_sock, fd);
  close(fd);
  int in = recv_fd(recv_sock);
  if (in < 0) {
    std::fprintf(stderr, "%s: no descriptor from process %u\n", who.c_str(), prev_index);
    std::exit(2);
  }
  Region prev(import_and_map(dev, in, size, who.c_str()), size, prev_index, who);
  close(send_sock);
  close(recv_sock);
  pid_t parent = getppid();
  std::printf("%sready pid %d\n", prefix.c_str(), int(getpid()));

  std::vector<uint8_t> buf(kScratchLen);
  size_t cursor = kConstant;
  double last_print = now_s();
  for (long count = 1;; ++count) {
    uint32_t seen;
    if (!o.tight) {
      own.verify_constant_all(count);
      prev.verify_constant_all(count);
      prev.write_slot(kImporterSlot, uint32_t(count), false, count);
      own.write_slot(kCreatorSlot, uint32_t(count), false, count);
      seen = std::min(own.read_slot(kImporterSlot, count), prev.read_slot(kCreatorSlot, count));
    } else {
      prev.write_slot(kImporterSlot, uint32_t(count), true, count);
      own.write_slot(kCreatorSlot, uint32_t(count), true, count);
      size_t len = std::min(kScratchLen, size - cursor);
      WL_CHECK(cuMemcpyDtoD(own.base() + kScratch, prev.base() + cursor, len), who.c_str());
      WL_CHECK(cuMemcpyDtoH(buf.data(), own.base() + kScratch, len), who.c_str());
      prev.check_pattern(buf.data(), cursor, len, count);
      own.verify_constant(cursor, len, count);
      seen = std::min(own.read_slot(kImporterSlot, count), prev.read_slot(kCreatorSlot, count));
      cursor = cursor + len >= size ? kConstant : cursor + len;
      if (count % 1000 != 0 && now_s() - last_print < 0.1) continue;
      last_print = now_s();
    }
    std::printf("%scount %ld ok\n%sseen %u\n", prefix.c_str(), count, prefix.c_str(), seen);
    for (pid_t c : children) {
      int status;
      if (waitpid(c, &status, WNOHANG) == c) {
        std::fprintf(stderr, "%s: process %d of the ring ended (%s %d)\n", who.c_str(), int(c),
                     WIFEXITED(status) ? "exit status" : "signal",
                     WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        std::exit(4);
      }
    }
    if (index != 0 && getppid() != parent) std::exit(4);
    if (!o.tight && o.interval_ms > 0) usleep(useconds_t(o.interval_ms * 1000));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args args(argc, argv, "cusnap-share-ring", {"--tight"}, {"--procs", "--mib", "--interval-ms"});
  Options o;
  o.procs = int(args.num("--procs", 2));
  o.mib = size_t(args.num("--mib", 2));
  o.interval_ms = args.num("--interval-ms", 100);
  o.tight = args.flag("--tight");
  if (o.procs < 2 || o.procs > 64) {
    std::fprintf(stderr, "cusnap-share-ring: --procs must be 2 to 64\n");
    return 64;
  }
  setvbuf(stdout, nullptr, _IOLBF, 0);
  // pair[i]: process i sends on [0], process i+1 receives on [1].
  std::vector<std::array<int, 2>> pair(size_t(o.procs));
  for (auto& p : pair)
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p.data()) != 0) return 2;
  // Process i keeps only its own ends and runs.
  auto start = [&](unsigned i, const std::vector<pid_t>& children) {
    unsigned prev = (i + unsigned(o.procs) - 1) % unsigned(o.procs);
    for (unsigned k = 0; k < pair.size(); ++k) {
      if (k != i) close(pair[k][0]);
      if (k != prev) close(pair[k][1]);
    }
    run(o, i, pair[i][0], pair[prev][1], children);
  };
  std::vector<pid_t> children;
  for (int i = 1; i < o.procs; ++i) {
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("cusnap-share-ring: fork");
      return 2;
    }
    if (pid == 0) {
      start(unsigned(i), {});
      return 0;
    }
    children.push_back(pid);
  }
  start(0, children);
  return 0;
}
