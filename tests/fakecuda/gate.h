// Entry into the simulated driver: the checkpoint gate, fault injection and
// tracing. Every implemented entry point that touches device state starts with
// FC_ENTER(base name); calls that never block (error strings, versions, the
// checkpoint API itself) use FC_ENTER_UNGATED.
#pragma once

#include "state.h"

#include <condition_variable>
#include <mutex>

namespace fc {

/// The checkpoint state of this process and the gate that holds application
/// calls while it is not RUNNING.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  CUprocessState state = CU_PROCESS_STATE_RUNNING;
  bool locking = false;  ///< a lock is waiting for calls in flight to drain
  int inflight = 0;      ///< threads inside a gated entry point
};
Gate& gate();

/// Injected result for the next call of `base` (FAKECUDA_FAIL), CUDA_SUCCESS if
/// none; also sleeps for FAKECUDA_DELAY and traces under FAKECUDA_LOG=1
/// (unless !logged: a fault point inside the driver, not a call, which tests
/// that list calls from the trace must not see).
CUresult fault_for(const char* base, bool logged = true);
/// Forgets parsed FAKECUDA_FAIL / FAKECUDA_DELAY settings (tests change them).
void faults_reload();
/// Fork handlers: hold the fault table's lock across fork.
void faults_before_fork();
void faults_after_fork();

/// RAII: waits at the gate, counts the thread in flight. Re-entrant per thread.
class GateGuard {
 public:
  explicit GateGuard(bool gated);
  ~GateGuard();
  GateGuard(const GateGuard&) = delete;
  GateGuard& operator=(const GateGuard&) = delete;

 private:
  bool entered_ = false;
  bool counted_ = false;
};

}  // namespace fc

#define FC_ENTER(base)                                     \
  ::fc::GateGuard fc_gate_guard_(true);                    \
  do {                                                     \
    CUresult fc_injected_ = ::fc::fault_for(base);         \
    if (fc_injected_ != CUDA_SUCCESS) return fc_injected_; \
  } while (0)

#define FC_ENTER_UNGATED(base)                             \
  do {                                                     \
    CUresult fc_injected_ = ::fc::fault_for(base);         \
    if (fc_injected_ != CUDA_SUCCESS) return fc_injected_; \
  } while (0)

/// For the checkpoint API, which acts on other processes: the same, except
/// in a child forked after its parent's cuInit, where the real driver
/// answers it though cuInit fails (tests/gpu/probes/fork_after_init.cpp).
#define FC_REQUIRE_INIT_OR_FORKED()                                       \
  do {                                                                    \
    if (!::fc::driver().initialized && !::fc::driver().forked_after_init) \
      return CUDA_ERROR_NOT_INITIALIZED;                                  \
  } while (0)

/// Returns CUDA_ERROR_NOT_INITIALIZED before cuInit.
#define FC_REQUIRE_INIT()                                               \
  do {                                                                  \
    if (!::fc::driver().initialized) return CUDA_ERROR_NOT_INITIALIZED; \
  } while (0)
