// Helpers shared by the files of the checkpoint of shared memory, shim side:
// track_ckpt.cpp (drain, save, release, load, reimport) and
// track_ckpt_multicast.cpp (multicast objects torn down and built again).
// State: track_state.h.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "shim/real_driver.h"
#include "shim/track_state.h"

namespace cusnap::shim::track {

using Lock = std::lock_guard<std::mutex>;

/// The reply to a request that succeeded (save, load: the bytes copied).
proto::Done ok_done(uint64_t bytes = 0);
/// The reply to a request that failed: what failed and an errno-style code.
proto::Done fail(const std::string& what, int32_t code = 0);

/// The primary context of a device, current on this thread while it lives.
class DeviceContext {
 public:
  explicit DeviceContext(int32_t dev) : dev_(dev) {
    auto retain = REAL(cuDevicePrimaryCtxRetain);
    auto set = REAL(cuCtxSetCurrent);
    if (!retain || !set) {
      result_ = CUDA_ERROR_NOT_SUPPORTED;
      return;
    }
    result_ = retain(&ctx_, dev);
    if (result_ == CUDA_SUCCESS) result_ = set(ctx_);
  }
  ~DeviceContext() {
    if (auto set = REAL(cuCtxSetCurrent)) set(nullptr);
    if (ctx_)
      if (auto rel = REAL(cuDevicePrimaryCtxRelease_v2)) rel(dev_);
  }
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;
  CUresult result() const { return result_; }

 private:
  int32_t dev_;
  CUcontext ctx_ = nullptr;
  CUresult result_ = CUDA_SUCCESS;
};

/// A recorded mapping (State::ranges), copied out of the tables.
struct RangeCopy {
  uint64_t address, size, offset;
  std::vector<proto::AccessRecord> access;
};

/// "0x..." for messages.
std::string hex(uint64_t v);
/// Maps d at every recorded range of an allocation with the recorded access;
/// on failure unmaps what it mapped.
CUresult map_ranges(CUmemGenericAllocationHandle d, const std::vector<RangeCopy>& ranges,
                    std::string* err);

// Multicast objects (track_ckpt_multicast.cpp).

/// Tears down every multicast object (mappings, bindings, the object); the
/// records stay for rebuild_multicast.
proto::Done teardown_multicast(State& s);
/// Creates every torn-down multicast object again: its devices, its bindings
/// (with the ABI they were made with), its mappings; the application's handle
/// then names the new object.
proto::Done rebuild_multicast(State& s);

}  // namespace cusnap::shim::track
