// The coordinator's end of one shim's control socket (proto/shim_messages.h):
// one connection per CUDA process of the job, checked to belong to that
// process (SO_PEERCRED pid), every exchange bounded by a timeout.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "proto/control.h"
#include "proto/shim_messages.h"
#include "proto/wire.h"

namespace cusnap {

class ShimClient {
 public:
  /// Connects to the control socket at path and checks that process pid
  /// serves it. false + *err (naming the process) when it cannot.
  bool connect(const std::string& path, pid_t pid, std::chrono::milliseconds timeout,
               std::string* err);
  bool connected() const { return ch_.valid(); }
  pid_t pid() const { return pid_; }

  bool inspect(proto::ShimRecords* out, std::string* err);
  /// Closes the gate, waiting up to wait_ms for calls in flight.
  bool gate_close(uint64_t wait_ms, std::string* err);
  /// Opens the gate; keep_cut: held collective launches stay held (GateOpen).
  bool gate_open(std::string* err, bool keep_cut = false);
  /// Waits for the process's device work. *busy (when given): refused because
  /// a stream capture is under way (kMsgShimDrain).
  bool drain(std::chrono::milliseconds timeout, std::string* err, bool* busy = nullptr);
  /// Bulk requests, the bytes split over the files (one part each, in
  /// order): the exchange may take up to timeout.
  bool save(uint64_t allocation, const std::vector<int>& fds, std::chrono::milliseconds timeout,
            uint64_t* bytes, std::string* err);
  bool load(uint64_t allocation, const std::vector<int>& fds, std::chrono::milliseconds timeout,
            std::string* err);
  bool release(const std::string& origin, std::chrono::milliseconds timeout, std::string* err);
  bool reimport(std::chrono::milliseconds timeout, std::string* err);
  /// The cut across collective ranks (proto::CutRequest): op is "arm",
  /// "target", "status" or "release"; hold_ms goes with "arm".
  bool cut(const std::string& op, uint64_t target, proto::CutState* out, std::string* err,
           uint64_t hold_ms = 0);

  /// Ends the connection and waits (up to the control timeout) until the
  /// shim closed its end too, so that no connected socket is left in the
  /// process when CRIU dumps it.
  void disconnect();

 private:
  bool parts(const char* type, uint64_t allocation, const std::vector<int>& fds,
             std::chrono::milliseconds timeout, proto::Done* out, std::string* err);
  template <class T, class R>
  bool exchange(const char* type, const T& payload, int fd, std::chrono::milliseconds timeout,
                const char* reply_type, R* out, std::string* err);
  template <class T>
  bool call(const char* type, const T& payload, int fd, std::chrono::milliseconds timeout,
            proto::Done* out, std::string* err);

  proto::Channel ch_;
  pid_t pid_ = 0;
  std::chrono::milliseconds timeout_{10000};
};

}  // namespace cusnap
