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

# Without -o, one after the other: each gets a directory of its own
# (NAME-YYYYmmdd-HHMMSS, then -2, -3 within the same second).
mkdir "$T/here"
for _ in 1 2 3; do
  (cd "$T/here" && "$CUSNAP" checkpoint lr --leave-running) >>"$T/default.out" 2>&1 ||
    fail "a checkpoint to the default directory failed: $(cat "$T/default.out")"
done
[ "$(find "$T/here" -mindepth 2 -maxdepth 2 -name manifest.json | wc -l)" = 3 ] ||
  fail "three default checkpoints left $(ls "$T/here")"
find "$T/here" -mindepth 1 -maxdepth 1 -regextype posix-extended -regex '.*/lr-[0-9]{8}-[0-9]{6}' |
  grep -q . || fail "no directory named lr-YYYYmmdd-HHMMSS: $(ls "$T/here")"
pass "three checkpoints without -o: three directories ($(ls "$T/here" | tr '\n' ' '))"
# From a current directory that was removed: said, exit 2.
mkdir "$T/gone"
rc=0
(cd "$T/gone" && rmdir "$T/gone" && "$CUSNAP" checkpoint lr --leave-running) >"$T/gone.out" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "the current directory cannot be found" "$T/gone.out" ||
  fail "a checkpoint from a removed directory: exit $rc: $(cat "$T/gone.out")"
expect_running lr "$PID" "$T/launch.out"
pass "a checkpoint from a removed current directory: exit 2, saying so"

kill -TERM "$SUP"
wait_exit "$SUP"
wait_gone "$PID"
restore_bg "$T/ckpt" "$T/restore.out"
wait_count "$T/restore.out" $((BEFORE + 3))
FIRST=$(first_count "$T/restore.out")
[ "$FIRST" -gt "$BEFORE" ] || fail "the restored job began at count $FIRST, before the checkpoint ($BEFORE)"
pass "the checkpoint restores: count $FIRST onwards"
echo "PASS"
