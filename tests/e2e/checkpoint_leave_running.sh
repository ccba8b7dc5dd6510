#!/usr/bin/env bash
# checkpoint --leave-running: the job goes on counting as the same process
# with its GPU state back in place; the checkpoint it wrote restores later.
source "$(dirname "$0")/lib_checkpoint.sh"

launch lr "$T/launch.out" "$PATTERN_JOB" --mib 8 --interval-ms 20
SUP=$LAST_SUPERVISOR
wait_count "$T/launch.out" 5
PID=$(wait_job lr)

BEFORE=$(last_count "$T/launch.out")
"$CUSNAP" checkpoint lr -o "$T/ckpt" --leave-running >"$T/ckpt.out" 2>&1 ||
  fail "checkpoint --leave-running failed: $(cat "$T/ckpt.out")"
expect_running lr "$PID" "$T/launch.out"
pass "the job runs on after the checkpoint"
# A second checkpoint of the same running job works too.
"$CUSNAP" checkpoint lr -o "$T/ckpt2" --leave-running >"$T/ckpt2.out" 2>&1 ||
  fail "second checkpoint failed: $(cat "$T/ckpt2.out")"
expect_running lr "$PID" "$T/launch.out"

kill -TERM "$SUP"
wait_exit "$SUP"
wait_gone "$PID"
restore_bg "$T/ckpt" "$T/restore.out"
wait_count "$T/restore.out" $((BEFORE + 3))
FIRST=$(first_count "$T/restore.out")
[ "$FIRST" -gt "$BEFORE" ] || fail "the restored job began at count $FIRST, before the checkpoint ($BEFORE)"
pass "the checkpoint restores: count $FIRST onwards"
echo "PASS"
