#!/usr/bin/env bash
# Pinned host memory that a thread of the job writes all the time, with no
# driver call, as NCCL's proxy thread does with its buffers and work queue:
# cusnap-hostmem-job with cuMemHostAlloc and with cuMemHostRegister. Each
# kind: suspend (the main thread stands still, the writer goes on) and
# resume, then checkpoint (stops it) and restore; the job counts on at the
# next count and finds its pinned memory holding exactly what it wrote (it
# exits 3 on any other byte). Measured the same with the real driver on the
# H200 (scripts/gpu-test.sh pinned-host).
source "$(dirname "$0")/lib_checkpoint.sh"
JOB=$BIN/cusnap-hostmem-job
[ -x "$JOB" ] || fail "$JOB is not built"

for kind in alloc register; do
  launch "pin-$kind" "$T/$kind.out" "$JOB" --kind "$kind" --interval-ms 20
  SUP=$LAST_SUPERVISOR
  wait_count "$T/$kind.out" 5
  PID=$(wait_job "pin-$kind")
  grep -q "ready kind $kind pinned" "$T/$kind.out" || fail "$kind: no ready line: $(head -3 "$T/$kind.out")"
  "$CUSNAP" suspend "pin-$kind" >"$T/$kind.s" 2>&1 || fail "$kind: suspend failed: $(cat "$T/$kind.s")"
  n=$(settled_count "$T/$kind.out")
  sleep 0.5
  [ "$(last_count "$T/$kind.out")" -le $((n + 1)) ] || fail "$kind: the job counted on while suspended"
  "$CUSNAP" resume "pin-$kind" >"$T/$kind.r" 2>&1 || fail "$kind: resume failed: $(cat "$T/$kind.r")"
  wait_count "$T/$kind.out" $((n + 5))
  if grep -q MISMATCH "$T/$kind.out"; then fail "$kind: after resume: $(grep MISMATCH "$T/$kind.out")"; fi
  pass "$kind: suspended at count $n while the writer went on, resumed, pinned memory as written"
  "$CUSNAP" checkpoint "pin-$kind" -o "$T/$kind.ck" >"$T/$kind.c" 2>&1 || fail "$kind: checkpoint failed: $(cat "$T/$kind.c")"
  wait_exit "$SUP"
  wait_gone "$PID"
  LAST=$(last_count "$T/$kind.out")
  restore_bg "$T/$kind.ck" "$T/$kind.restore.out"
  SUP=$LAST_SUPERVISOR
  wait_count "$T/$kind.restore.out" $((LAST + 5)) "" 30
  FIRST=$(first_count "$T/$kind.restore.out")
  [ "$FIRST" = $((LAST + 1)) ] || fail "$kind: continued at $FIRST, expected $((LAST + 1))"
  if grep -q MISMATCH "$T/$kind.restore.out"; then fail "$kind: after restore: $(grep MISMATCH "$T/$kind.restore.out")"; fi
  pass "$kind: checkpointed at count $LAST, restored, counts on from $FIRST with its pinned memory as written"
  kill -TERM "$SUP"
  wait_exit "$SUP"
  wait_gone "$PID"
done
echo "PASS"
