// A minimal checkpoint coordinator: drives the driver's process checkpoint API
// on another process. Usage: fakecuda_ckpt OP PID [TIMEOUT_MS [PAIRS]]
// OP: state | tid | lock | checkpoint | restore | unlock
//     | suspend (lock + checkpoint) | resume (restore + unlock)
// PAIRS (restore): "OLD=NEW,..." of this machine's device indexes, passed as
// the restore's GPU pairs (the UUIDs of those devices).
// Prints "ok" or "error NAME (CODE)"; exits 0 on success, 1 on failure.
#include <cuda.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

bool report(const char* what, CUresult r) {
  if (r == CUDA_SUCCESS) return true;
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  printf("error %s: %s (%d)\n", what, name ? name : "?", static_cast<int>(r));
  return false;
}

/// Parses PAIRS into GPU pairs of this machine's UUIDs; false when malformed.
bool parse_pairs(const char* text, std::vector<CUcheckpointGpuPair>* out) {
  const char* p = text;
  while (*p) {
    char* end = nullptr;
    long from = strtol(p, &end, 10);
    if (end == p || *end != '=') return false;
    p = end + 1;
    long to = strtol(p, &end, 10);
    if (end == p || (*end != ',' && *end != '\0')) return false;
    p = *end == ',' ? end + 1 : end;
    CUcheckpointGpuPair pair{};
    if (cuDeviceGetUuid(&pair.oldUuid, static_cast<CUdevice>(from)) != CUDA_SUCCESS ||
        cuDeviceGetUuid(&pair.newUuid, static_cast<CUdevice>(to)) != CUDA_SUCCESS)
      return false;
    out->push_back(pair);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s OP PID [TIMEOUT_MS]\n", argv[0]);
    return 2;
  }
  const char* op = argv[1];
  int pid = atoi(argv[2]);
  unsigned timeout = argc > 3 ? static_cast<unsigned>(atoi(argv[3])) : 0;
  if (!report("cuInit", cuInit(0))) return 1;
  std::vector<CUcheckpointGpuPair> pairs;
  if (argc > 4 && !parse_pairs(argv[4], &pairs)) {
    fprintf(stderr, "bad PAIRS %s\n", argv[4]);
    return 2;
  }
  bool ok = true;
  bool all = false;
  if (!strcmp(op, "state")) {
    CUprocessState s;
    ok = report("state", cuCheckpointProcessGetState(pid, &s));
    if (ok) printf("state %d\n", static_cast<int>(s));
    all = true;
  }
  if (!strcmp(op, "tid")) {
    int tid = 0;
    ok = report("tid", cuCheckpointProcessGetRestoreThreadId(pid, &tid));
    if (ok) printf("tid %d\n", tid);
    all = true;
  }
  if (ok && (!strcmp(op, "lock") || !strcmp(op, "suspend"))) {
    CUcheckpointLockArgs a{};
    a.timeoutMs = timeout;
    ok = report("lock", cuCheckpointProcessLock(pid, &a));
    all = true;
  }
  if (ok && (!strcmp(op, "checkpoint") || !strcmp(op, "suspend"))) {
    ok = report("checkpoint", cuCheckpointProcessCheckpoint(pid, nullptr));
    all = true;
  }
  if (ok && (!strcmp(op, "restore") || !strcmp(op, "resume"))) {
    CUcheckpointRestoreArgs ra{};
    ra.gpuPairs = pairs.data();
    ra.gpuPairsCount = static_cast<unsigned>(pairs.size());
    ok = report("restore", cuCheckpointProcessRestore(pid, pairs.empty() ? nullptr : &ra));
    all = true;
  }
  if (ok && (!strcmp(op, "unlock") || !strcmp(op, "resume"))) {
    ok = report("unlock", cuCheckpointProcessUnlock(pid, nullptr));
    all = true;
  }
  if (!all) {
    fprintf(stderr, "unknown op %s\n", op);
    return 2;
  }
  if (ok) printf("ok\n");
  return ok ? 0 : 1;
}
