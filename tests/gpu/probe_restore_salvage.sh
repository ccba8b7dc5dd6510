#!/usr/bin/env bash
# probe_restore_salvage.sh: once the driver refused a process's restore for
# lack of GPU memory (every later restore fails CUDA_ERROR_OPERATING_SYSTEM,
# docs/gpu-runs/restore-full-h200.log), does a CRIU dump and restore of the
# still-checkpointed process give the driver a process it restores? No
# cusnap: the bare driver (ctypes) and CRIU. Needs a GPU, root, CRIU >= 4.1,
# python3 with torch and a build of cusnap-pattern-job:
#
#   CUSNAP_BINARY_DIR=$PWD/build bash tests/gpu/probe_restore_salvage.sh
#
# Steps: a 4 GiB cusnap-pattern-job; driver lock + checkpoint; a PyTorch
# process takes all the free memory but 1 GiB; driver restore (expect 2);
# that process ends; driver restore (expect 304); criu dump (plugins off, as
# cusnap runs it) and criu restore; the restored process's state, driver
# restore and unlock; does it count on, every byte right? With CONTROL=1 the
# hog and the two refused restores are left out: the same dump and restore
# of a process the driver checkpointed and never refused.
set -u
BIN=${CUSNAP_BINARY_DIR:?CUSNAP_BINARY_DIR must name the build}/bin
T=$(mktemp -d /tmp/probe-salvage.XXXXXX)
mkdir -p "$T/img" "$T/noplugins"
cat >"$T/drv.py" <<'PY'
import ctypes, sys, time
cu = ctypes.CDLL("libcuda.so.1")
cu.cuInit(0)
op, pid = sys.argv[1], int(sys.argv[2])
class LockArgs(ctypes.Structure):
    _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint),
                ("reserved1", ctypes.c_uint64 * 7)]
args = (ctypes.c_uint64 * 8)()
t0 = time.time()
if op == "lock":
    la = LockArgs(); la.timeoutMs = 30000
    r = cu.cuCheckpointProcessLock(pid, ctypes.byref(la))
elif op == "checkpoint":
    r = cu.cuCheckpointProcessCheckpoint(pid, ctypes.byref(args))
elif op == "restore":
    r = cu.cuCheckpointProcessRestore(pid, ctypes.byref(args))
elif op == "unlock":
    r = cu.cuCheckpointProcessUnlock(pid, ctypes.byref(args))
else:
    r = 0
s = ctypes.c_int(-1)
g = cu.cuCheckpointProcessGetState(pid, ctypes.byref(s))
print(f"{op} {pid}: result {r} in {time.time() - t0:.2f} s; state {s.value} (get {g})", flush=True)
PY
cat >"$T/hog.py" <<'PY'
import os, sys, time, torch
free, total = torch.cuda.mem_get_info()
x = torch.empty(max(0, free - (1 << 30)), dtype=torch.uint8, device="cuda")
print(f"hog pid {os.getpid()}: holds {x.numel() >> 20} MiB", flush=True)
open(sys.argv[1], "w").close()
time.sleep(3600)
PY
drv() { python3 "$T/drv.py" "$@"; }
last() { grep -E '^count [0-9]+ ok$' "$T/job.out" | tail -1; }

setsid "$BIN/cusnap-pattern-job" --mib 4096 --interval-ms 50 --verify-mib 64 \
  >"$T/job.out" 2>&1 </dev/null &
JOB=$!
for _ in $(seq 1 200); do grep -q "count 3 ok" "$T/job.out" && break; sleep 0.1; done
echo "job $JOB: $(last)"
drv lock "$JOB"
drv checkpoint "$JOB"
if [ "${CONTROL:-0}" != 1 ]; then
  python3 "$T/hog.py" "$T/hog-ready" >"$T/hog.out" 2>&1 &
  HOG=$!
  for _ in $(seq 1 600); do [ -e "$T/hog-ready" ] && break; sleep 0.1; done
  cat "$T/hog.out"
  drv restore "$JOB"
  kill -9 "$HOG"; wait "$HOG" 2>/dev/null
  echo "hog ended; GPU memory used: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"
  drv restore "$JOB"
fi
echo "the job's device-file mappings: $(grep -c /dev/nvidia "/proc/$JOB/maps")"
grep /dev/nvidia "/proc/$JOB/maps" | awk '{print $6}' | sort | uniq -c
echo "criu dump: $(criu dump -t "$JOB" -D "$T/img" -o dump.log -v4 -L "$T/noplugins" 2>&1; echo "exit $?")"
grep -B4 "Error" "$T/img/dump.log" | cut -c1-200 | head -12
tail -1 "$T/img/dump.log"
for _ in $(seq 1 100); do [ -e "/proc/$JOB" ] || break; sleep 0.1; done
echo "criu restore: $(criu restore -D "$T/img" -o restore.log -v2 -L "$T/noplugins" -d 2>&1; echo "exit $?")"
tail -2 "$T/img/restore.log"
drv state "$JOB"
drv restore "$JOB"
drv unlock "$JOB"
before=$(last)
sleep 3
echo "job output before: $before; 3 s later: $(last); errors: $(grep -c -v -E '^(count [0-9]+ ok|ready .*)$' "$T/job.out")"
grep -v -E '^(count [0-9]+ ok|ready .*)$' "$T/job.out" | tail -3
kill -9 "$JOB" 2>/dev/null
echo "kept $T"
