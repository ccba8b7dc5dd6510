#!/usr/bin/env bash
# probe_restore_margin.sh: how much free device memory the real driver's
# restore of a suspended process needs, against the process's use as NVML
# counts it while it runs. Needs a GPU, root, CRIU, python3 with torch, and a
# build:
#
#   CUSNAP_BINARY_DIR=$PWD/build bash tests/gpu/probe_restore_margin.sh [DELTA_MIB...]
#
# For each DELTA (MiB; default -512 -64 0 64 512): a 4 GiB pattern job
# (cusnap-pattern-job) is launched, its use N read from NVML's compute
# processes, suspended; a PyTorch "hog" takes all the free device memory but
# N + DELTA MiB; cusnap resume (with its own free-memory check off, so that
# the driver itself is asked); the result, the device's free memory before
# the resume, and whether the job counts on with every byte right.
# Measured on an H200: docs/gpu-runs/restore-margin-h200.log.
export CUSNAP_REAL_DRIVER=${CUSNAP_REAL_DRIVER:-1}
source "$(dirname "$0")/../e2e/lib_checkpoint.sh"
pkill -9 -f 'cusnap-e2e\.[A-Za-z0-9]*/hog\.py' 2>/dev/null || true
trap 'rc=$?; pkill -9 -f "$T/hog.py" 2>/dev/null || true; (exit $rc); cleanup_checkpoint_test' EXIT
DELTAS=("$@")
[ ${#DELTAS[@]} -gt 0 ] || DELTAS=(-512 -64 0 64 512)

cat >"$T/hog.py" <<'PY'
import os, sys, time
import torch
free, total = torch.cuda.mem_get_info()
n = max(0, free - (int(os.environ["HOG_LEAVE_MIB"]) << 20))
x = torch.empty(n, dtype=torch.uint8, device="cuda")
free2, _ = torch.cuda.mem_get_info()
print(f"hog pid {os.getpid()}: holds {n >> 20} MiB; free {free >> 20} -> {free2 >> 20} MiB", flush=True)
open(sys.argv[1], "w").close()
time.sleep(3600)
PY
free_mib() { nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1; }
used_by() {  # used_by PID: NVML's count for that compute process (MiB), or empty
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits |
    awk -F', *' -v p="$1" '$1 == p { print $2 }'
}
i=0
for d in "${DELTAS[@]}"; do
  i=$((i + 1))
  name=m$i
  launch "$name" "$T/$name.out" "$PATTERN_JOB" --mib 4096 --interval-ms 50 --verify-mib 64
  SUP=$LAST_SUPERVISOR
  wait_count "$T/$name.out" 3 "" 120
  PID=$(wait_job "$name")
  N=$(used_by "$PID")
  f0=$(free_mib)
  "$CUSNAP" suspend "$name" >"$T/s.out" 2>&1 || { cat "$T/s.out"; fail "suspend $name"; }
  f1=$(free_mib)
  leave=$((N + d))
  rm -f "$T/hog-ready"
  HOG_LEAVE_MIB=$leave python3 "$T/hog.py" "$T/hog-ready" >"$T/hog.out" 2>&1 &
  HOG=$!
  for _ in $(seq 1 600); do [ -e "$T/hog-ready" ] && break; sleep 0.1; done
  [ -e "$T/hog-ready" ] || fail "the hog did not start: $(cat "$T/hog.out")"
  f2=$(free_mib)
  rc=0
  t0=$(date +%s%N)
  CUSNAP_RESTORE_MEMORY_MARGIN=off "$CUSNAP" resume "$name" >"$T/r.out" 2>&1 || rc=$?
  ms=$((($(date +%s%N) - t0) / 1000000))
  echo "delta $d MiB: NVML use $N MiB; free before suspend $f0, suspended $f1, with the hog $f2 MiB (asked $leave); resume exit $rc in $ms ms"
  sed 's/^/    /' "$T/hog.out" "$T/r.out" | head -4
  kill -9 "$HOG" 2>/dev/null; wait "$HOG" 2>/dev/null || true
  if [ "$rc" = 0 ]; then
    c0=$(last_count "$T/$name.out")
    sleep 1
    expect_running "$name" "$PID" "$T/$name.out"
    echo "    came back: count $c0 -> $(last_count "$T/$name.out"), every byte right"
  else
    echo "    did not come back"
  fi
  kill -TERM "$SUP"; wait_exit "$SUP"; kill -9 "$PID" 2>/dev/null || true; wait_gone "$PID" 30
done
echo DONE
