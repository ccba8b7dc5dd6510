/* Stand-ins for a CUDA driver, for tests of how cusnap treats drivers.
 *
 * Built plainly: a driver from before the process checkpoint API (< 570):
 * the entry points cusnap uses to describe devices, and none of
 * cuCheckpointProcess*. The end-to-end tests point CUSNAP_LIBCUDA at it to
 * see cusnap refuse, naming the library.
 *
 * Built with CUSNAP_STUCK_CHECKPOINT: a driver whose checkpoint calls never
 * return in time (each sleeps 30 s), as the real one does for a job with a
 * collective in flight, and whose state call for one pid never does either;
 * the unit tests check that the coordinator gives up. */
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;

CUresult cuInit(unsigned int flags) {
  (void)flags;
  return 0;
}
CUresult cuDriverGetVersion(int* v) {
  *v = 12020;
  return 0;
}
CUresult cuDeviceGetCount(int* n) {
  *n = 1;
  return 0;
}
CUresult cuDeviceGet(CUdevice* d, int i) {
  *d = i;
  return 0;
}
CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
  (void)d;
  strncpy(name, "Old GPU", (size_t)len);
  return 0;
}
CUresult cuDeviceGetUuid(void* uuid, CUdevice d) {
  (void)d;
  memset(uuid, 0, 16);
  return 0;
}
CUresult cuDeviceTotalMem_v2(unsigned long* bytes, CUdevice d) {
  (void)d;
  *bytes = 1ul << 20;
  return 0;
}

#ifdef CUSNAP_STUCK_CHECKPOINT
static CUresult stuck(void) {
  sleep(30);
  return 0;
}
CUresult cuCheckpointProcessLock(int pid, void* args) {
  (void)pid, (void)args;
  return stuck();
}
CUresult cuCheckpointProcessCheckpoint(int pid, void* args) {
  (void)pid, (void)args;
  return stuck();
}
CUresult cuCheckpointProcessRestore(int pid, void* args) {
  (void)pid, (void)args;
  return stuck();
}
CUresult cuCheckpointProcessUnlock(int pid, void* args) {
  (void)pid, (void)args;
  return stuck();
}
/* Asked of process 23456, the state too never comes in time (as it may not
 * for a process whose checkpoint call is stuck); of any other, at once. */
CUresult cuCheckpointProcessGetState(int pid, int* state) {
  if (pid == 23456) sleep(30);
  *state = 0;
  return 0;
}
#endif
