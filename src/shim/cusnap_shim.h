// The one data symbol libcusnap_shim.so exports besides the driver's entry
// points, dlsym/dlvsym and the runtime's cudaGetDriverEntryPoint family:
// cusnap_shim_build_info. It identifies the build and carries the in-process
// control table (the gate), which tests reach with
// dlsym(RTLD_DEFAULT, "cusnap_shim_build_info") and the shim's coordinator
// channel will drive later. Plain C layout: bump `abi` on any change.
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUSNAP_SHIM_ABI 1

struct cusnap_shim_control {
  uint32_t size; /* sizeof(struct cusnap_shim_control) */
  /* Closes the gate and waits up to timeout_ms for calls inside the driver to
     finish. 0: closed and drained; ETIMEDOUT: not drained, gate reopened;
     EALREADY: already closed. */
  int (*gate_close)(uint64_t timeout_ms);
  /* Opens the gate; waiting threads continue in arrival order. 0 or EALREADY. */
  int (*gate_open)(void);
  /* Current state: closed (0/1), calls in flight, threads waiting. Any may be NULL. */
  void (*gate_state)(int* closed, uint64_t* in_flight, uint64_t* waiting);
};

struct cusnap_shim_info {
  uint32_t abi;            /* CUSNAP_SHIM_ABI */
  const char* version;     /* cusnap version */
  const char* build;       /* build type and sanitizers */
  int cuda_header_version; /* CUDA_VERSION of the headers the entry list came from */
  uint32_t entry_points;   /* driver entry points wrapped */
  const struct cusnap_shim_control* control;
};

extern const struct cusnap_shim_info cusnap_shim_build_info;

#ifdef __cplusplus
}
#endif
