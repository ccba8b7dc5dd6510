// Helpers of the workloads whose processes share device memory
// (cusnap-share-job, cusnap-share-ring, cusnap-ipc-pair): descriptor passing
// over a Unix socket, an exportable VMM allocation, and the layout and checks
// of one shared allocation.
//
// Layout of a shared allocation of `size` bytes (offsets from its start):
//   [0, 4K)        importer slot: the importer fills it with its counter
//                  (32-bit words, all equal) every iteration; the creator
//                  reads it and checks that every word only grows
//   [4K, 8K)       creator slot: the same, written by the creator and read by
//                  the importer
//   [8K, 72K)      scratch: written only by the creator (tight loops copy
//                  their peer's bytes here with cuMemcpyDtoD)
//   [128K, size)   constant: written once by the creator, a pattern of the
//                  creator's index and the byte's offset; both sides verify it
// The slots prove that the bytes are shared: a reader's "seen" value (the
// smallest word in the slots it reads) keeps growing only while the peer's
// writes land in the bytes this process maps.
#pragma once

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "workload_util.h"

namespace workload::share {

constexpr size_t kSlot = 4096;
constexpr size_t kImporterSlot = 0;
constexpr size_t kCreatorSlot = kSlot;
constexpr size_t kScratch = 2 * kSlot;
constexpr size_t kScratchLen = 64 << 10;
constexpr size_t kConstant = 128 << 10;

inline uint8_t pattern(unsigned creator, size_t i) {
  return uint8_t(i * 131 + (i >> 8) * 7 + creator * 29 + 17);
}

inline void send_bytes(int sock, const void* data, size_t len, int fd = -1) {
  iovec iov{const_cast<void*>(data), len};
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd >= 0) {
    msg.msg_control = ctrl;
    msg.msg_controllen = sizeof ctrl;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  if (sendmsg(sock, &msg, MSG_NOSIGNAL) != ssize_t(len)) {
    std::perror("sendmsg");
    std::exit(2);
  }
}

/// Receives exactly len bytes (one message); returns the descriptor that came
/// with them, or -1.
inline int recv_bytes(int sock, void* data, size_t len) {
  iovec iov{data, len};
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctrl;
  msg.msg_controllen = sizeof ctrl;
  ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
  if (n != ssize_t(len)) return -2;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (!c || c->cmsg_type != SCM_RIGHTS) return -1;
  int fd;
  std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

inline void send_fd(int sock, int fd) {
  char byte = 'f';
  send_bytes(sock, &byte, 1, fd);
}

inline int recv_fd(int sock) {
  char byte;
  return recv_bytes(sock, &byte, 1);
}

inline CUmemAllocationProp posix_fd_prop(CUdevice dev) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

/// mib MiB rounded up to the allocation granularity (at least kConstant + 1 MiB).
inline size_t vmm_size(CUdevice dev, size_t mib, const char* who) {
  CUmemAllocationProp prop = posix_fd_prop(dev);
  size_t gran = 0;
  WL_CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), who);
  size_t want = std::max<size_t>(mib << 20, kConstant + (1 << 20));
  return (want + gran - 1) / gran * gran;
}

/// Reserves and maps `size` bytes of h with read-write access for every
/// device in devs.
inline CUdeviceptr map_for(CUmemGenericAllocationHandle h, size_t size,
                           const std::vector<CUdevice>& devs, const char* who) {
  CUdeviceptr ptr;
  WL_CHECK(cuMemAddressReserve(&ptr, size, 0, 0, 0), who);
  WL_CHECK(cuMemMap(ptr, size, 0, h, 0), who);
  std::vector<CUmemAccessDesc> access(devs.size());
  for (size_t i = 0; i < devs.size(); ++i) {
    access[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[i].location.id = devs[i];
    access[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  WL_CHECK(cuMemSetAccess(ptr, size, access.data(), access.size()), who);
  return ptr;
}

/// Reserves, maps and grants read-write access to `size` bytes of handle h.
inline CUdeviceptr map_rw(CUdevice dev, CUmemGenericAllocationHandle h, size_t size,
                          const char* who) {
  return map_for(h, size, {dev}, who);
}

/// Loads the placeholder module of a workload that launches the simulated
/// driver's collective kernel `kernel` (tests/fakecuda): the real driver
/// refuses its image, and the workload exits with status 2 saying so.
inline CUfunction load_fake_kernel(const char* kernel, const char* who) {
  static const char image[] = "cusnap workload: placeholder module image";
  CUmodule mod;
  if (CUresult r = cuModuleLoadData(&mod, image); r != CUDA_SUCCESS) {
    const char* name = nullptr;
    cuGetErrorName(r, &name);
    std::fprintf(stderr,
                 "%s: cuModuleLoadData failed: %s (%d): this workload runs only on the simulated "
                 "driver (tests/fakecuda), whose %s kernel it launches\n",
                 who, name ? name : "?", int(r), kernel);
    std::exit(2);
  }
  CUfunction fn;
  WL_CHECK(cuModuleGetFunction(&fn, mod, kernel), who);
  return fn;
}

/// Creates an exportable allocation and maps it; returns the handle.
inline CUmemGenericAllocationHandle create_exportable(CUdevice dev, size_t size,
                                                      CUdeviceptr* ptr, const char* who) {
  CUmemAllocationProp prop = posix_fd_prop(dev);
  CUmemGenericAllocationHandle h;
  WL_CHECK(cuMemCreate(&h, size, &prop, 0), who);
  *ptr = map_rw(dev, h, size, who);
  return h;
}

/// Imports the descriptor (and closes it) and maps the allocation.
inline CUdeviceptr import_and_map(CUdevice dev, int fd, size_t size, const char* who) {
  CUmemGenericAllocationHandle h;
  WL_CHECK(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(intptr_t(fd)),
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
           who);
  close(fd);
  return map_rw(dev, h, size, who);
}

inline int export_fd(CUmemGenericAllocationHandle h, const char* who) {
  int fd = -1;
  WL_CHECK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
           who);
  return fd;
}

/// One shared allocation as one process sees it.
class Region {
 public:
  Region(CUdeviceptr base, size_t size, unsigned creator, std::string who)
      : base_(base), size_(size), creator_(creator), who_(std::move(who)) {}

  /// The creator's first write: the constant pattern, zero slots and scratch.
  void fill() {
    std::vector<uint8_t> buf(size_, 0);
    for (size_t i = kConstant; i < size_; ++i) buf[i] = pattern(creator_, i);
    WL_CHECK(cuMemcpyHtoD(base_, buf.data(), size_), who_.c_str());
  }

  /// Verifies [off, off+len) of the constant region (clamped), exits 3 on a wrong byte.
  void verify_constant(size_t off, size_t len, long count) {
    off = std::max(off, kConstant);
    if (off >= size_) return;
    len = std::min(len, size_ - off);
    buf_.resize(len);
    WL_CHECK(cuMemcpyDtoH(buf_.data(), base_ + off, len), who_.c_str());
    check_pattern(buf_.data(), off, len, count);
  }
  /// The whole constant region, in 64 MiB pieces (the host copy stays small,
  /// so a large job's checkpoint holds its device bytes, not a host mirror).
  void verify_constant_all(long count) {
    constexpr size_t kPiece = size_t(64) << 20;
    for (size_t off = kConstant; off < size_; off += kPiece) verify_constant(off, kPiece, count);
    buf_.clear();
    buf_.shrink_to_fit();
  }

  /// Checks that bytes read back from [off, off+len) hold the constant pattern.
  void check_pattern(const uint8_t* p, size_t off, size_t len, long count) const {
    for (size_t i = 0; i < len; ++i)
      if (p[i] != pattern(creator_, off + i)) {
        std::fprintf(stderr,
                     "%s: pattern mismatch at byte %zu of allocation %u: expected 0x%02x, "
                     "found 0x%02x (count %ld)\n",
                     who_.c_str(), off + i, creator_, pattern(creator_, off + i), p[i], count);
        std::exit(3);
      }
  }

  /// Fills a slot with value (through cuMemcpyHtoD, or cuMemsetD32 when
  /// memset) and reads it back: every word must be value.
  void write_slot(size_t slot, uint32_t value, bool memset, long count) {
    if (memset) {
      WL_CHECK(cuMemsetD32(base_ + slot, value, kSlot / 4), who_.c_str());
    } else {
      words_.assign(kSlot / 4, value);
      WL_CHECK(cuMemcpyHtoD(base_ + slot, words_.data(), kSlot), who_.c_str());
    }
    words_.assign(kSlot / 4, ~value);
    WL_CHECK(cuMemcpyDtoH(words_.data(), base_ + slot, kSlot), who_.c_str());
    for (size_t k = 0; k < words_.size(); ++k)
      if (words_[k] != value) {
        std::fprintf(stderr,
                     "%s: pattern mismatch: word %zu of the slot at %zu of allocation %u reads "
                     "%u after writing %u (count %ld)\n",
                     who_.c_str(), k, slot, creator_, words_[k], value, count);
        std::exit(3);
      }
  }

  /// Reads the slot the peer writes: every word must be at least what it was
  /// at the previous read (the peer's counter only grows). Returns the
  /// smallest word; `torn` counts reads whose words differ (the peer wrote
  /// while this process read).
  uint32_t read_slot(size_t slot, long count) {
    std::vector<uint32_t>& last = slot == kImporterSlot ? last_imp_ : last_cre_;
    last.resize(kSlot / 4, 0);
    words_.resize(kSlot / 4);
    WL_CHECK(cuMemcpyDtoH(words_.data(), base_ + slot, kSlot), who_.c_str());
    uint32_t lo = words_[0], hi = words_[0];
    for (size_t k = 0; k < words_.size(); ++k) {
      if (words_[k] < last[k]) {
        std::fprintf(stderr,
                     "%s: pattern mismatch: word %zu of the peer's slot at %zu of allocation %u "
                     "went back from %u to %u (count %ld)\n",
                     who_.c_str(), k, slot, creator_, last[k], words_[k], count);
        std::exit(3);
      }
      lo = std::min(lo, words_[k]);
      hi = std::max(hi, words_[k]);
    }
    if (lo != hi) ++torn;
    last = words_;
    return lo;
  }

  CUdeviceptr base() const { return base_; }
  size_t size() const { return size_; }
  unsigned creator() const { return creator_; }
  long torn = 0;

 private:
  CUdeviceptr base_;
  size_t size_;
  unsigned creator_;
  std::string who_;
  std::vector<uint8_t> buf_;
  std::vector<uint32_t> words_, last_imp_, last_cre_;
};

/// One side of a creator/importer pair: fork (before any driver call) with a
/// socketpair between the two; the parent is the creator.
struct PairSide {
  bool importer;
  pid_t child;  // in the creator
  int sock;     // this side's end
};
inline PairSide fork_pair() {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) std::exit(2);
  pid_t child = fork();
  if (child < 0) std::exit(2);
  bool importer = child == 0;
  close(sv[importer ? 0 : 1]);
  return {importer, child, sv[importer ? 1 : 0]};
}

/// The loop of a creator/importer pair sharing one region: verify the constant
/// pattern, fill this side's slot, read the other side's, print
/// "PREFIXcount N ok" and "PREFIXseen S", sleep. Exits 4 when the other
/// process ends (the creator watches its child, the importer its parent).
[[noreturn]] inline void pair_loop(Region& r, bool importer, const char* prefix, pid_t child,
                                   long interval_ms) {
  pid_t parent = getppid();
  std::printf("%sready pid %d\n", prefix, int(getpid()));
  for (long count = 1;; ++count) {
    r.verify_constant_all(count);
    r.write_slot(importer ? kImporterSlot : kCreatorSlot, uint32_t(count), false, count);
    uint32_t seen = r.read_slot(importer ? kCreatorSlot : kImporterSlot, count);
    std::printf("%scount %ld ok\n%sseen %u\n", prefix, count, prefix, seen);
    if (!importer && waitpid(child, nullptr, WNOHANG) == child) std::exit(4);
    if (importer && getppid() != parent) std::exit(4);
    usleep(useconds_t(interval_ms * 1000));
  }
}

/// Parses "--name value" pairs and bare flags; exits 64 on an unknown option.
struct Args {
  Args(int argc, char** argv, const char* prog, std::vector<std::string> flags,
       std::vector<std::string> valued) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (std::find(flags.begin(), flags.end(), a) != flags.end()) {
        set.push_back(a);
      } else if (std::find(valued.begin(), valued.end(), a) != valued.end() && i + 1 < argc) {
        values.emplace_back(a, argv[++i]);
      } else {
        std::fprintf(stderr, "%s: unknown option or missing value: %s\n", prog, a.c_str());
        std::exit(64);
      }
    }
  }
  bool flag(const std::string& name) const {
    return std::find(set.begin(), set.end(), name) != set.end();
  }
  long num(const std::string& name, long dflt) const {
    for (const auto& [k, v] : values)
      if (k == name) return std::strtol(v.c_str(), nullptr, 10);
    return dflt;
  }
  std::string str(const std::string& name) const {
    for (const auto& [k, v] : values)
      if (k == name) return v;
    return "";
  }
  std::vector<std::string> set;
  std::vector<std::pair<std::string, std::string>> values;
};

}  // namespace workload::share
