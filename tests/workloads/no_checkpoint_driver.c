/* A library that looks like a CUDA driver from before the process checkpoint
 * API (driver < 570): the entry points cusnap uses to describe devices, and
 * none of cuCheckpointProcess*. The end-to-end tests point CUSNAP_LIBCUDA at
 * it to see cusnap refuse, naming the library. */
#include <string.h>

typedef int CUresult;
typedef int CUdevice;

CUresult cuInit(unsigned int flags) { (void)flags; return 0; }
CUresult cuDriverGetVersion(int* v) { *v = 12020; return 0; }
CUresult cuDeviceGetCount(int* n) { *n = 1; return 0; }
CUresult cuDeviceGet(CUdevice* d, int i) { *d = i; return 0; }
CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
  (void)d;
  strncpy(name, "Old GPU", (size_t)len);
  return 0;
}
CUresult cuDeviceGetUuid(void* uuid, CUdevice d) { (void)d; memset(uuid, 0, 16); return 0; }
CUresult cuDeviceTotalMem_v2(unsigned long* bytes, CUdevice d) { (void)d; *bytes = 1ul << 30; return 0; }
