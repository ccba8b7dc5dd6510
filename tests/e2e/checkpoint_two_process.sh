#!/usr/bin/env bash
# A job of two processes, each with its own device memory, is checkpointed and
# restored; both continue counting with their patterns intact.
source "$(dirname "$0")/lib_checkpoint.sh"

launch two "$T/launch.out" "$PATTERN_JOB" --mib 4 --children 1 --interval-ms 20
SUP=$LAST_SUPERVISOR
wait_count "$T/launch.out" 5
wait_count "$T/launch.out" 5 "child 1 "
PID=$(wait_job two)

"$CUSNAP" checkpoint two -o "$T/ckpt" >"$T/ckpt.out" 2>&1 || fail "checkpoint failed: $(cat "$T/ckpt.out")"
wait_exit "$SUP"
wait_gone "$PID"
python3 - "$T/ckpt/manifest.json" <<'PY' || fail "the manifest does not list two CUDA processes"
import json, sys
m = json.load(open(sys.argv[1]))
cuda = [p for p in m["processes"] if p["uses_cuda"]]
assert len(cuda) == 2, m["processes"]
PY
P_LAST=$(last_count "$T/launch.out")
C_LAST=$(last_count "$T/launch.out" "child 1 ")

restore_bg "$T/ckpt" "$T/restore.out"
wait_count "$T/restore.out" $((P_LAST + 3))
wait_count "$T/restore.out" $((C_LAST + 3)) "child 1 "
[ "$(first_count "$T/restore.out")" = $((P_LAST + 1)) ] || fail "the parent did not continue at $((P_LAST + 1))"
[ "$(first_count "$T/restore.out" "child 1 ")" = $((C_LAST + 1)) ] ||
  fail "the child did not continue at $((C_LAST + 1))"
grep -q "pattern mismatch\|ended" "$T/restore.out" && fail "a process of the restored job failed"
pass "both processes continued"
echo "PASS"
