#!/usr/bin/env bash
# cusnap replaced on disk while a job runs (an upgrade, a rebuild): the
# supervisor's /proc/PID/exe then reads "cusnap (deleted)". A guardian that
# takes the job over supervises it and starts a guardian of its own, which
# must be a fresh image of the binary (executed again), not a copy forked
# from a process that already used the driver (where the driver refuses
# cuInit, as the real one does): else the next take-over cannot use the
# driver and the job can no longer be checkpointed.
#  - the job is launched through a copy of cusnap (its shim found beside it);
#  - a new file replaces the copy;
#  - the supervisor is killed: the first guardian takes over;
#  - that one is killed too: its own guardian takes over;
#  - a checkpoint through it, and its restore: the job counts on.
# And a guardian whose job ended with its supervisor (the job's root killed
# while the supervisor was stopped, then the supervisor): its log says the
# job has ended, not that it runs on.
source "$(dirname "$0")/lib_checkpoint.sh"

UP=$T/up
mkdir -p "$UP/bin"
cp "$CUSNAP" "$UP/bin/cusnap"
ln -s "$(cd "$(dirname "$CUSNAP")/../lib" && pwd)" "$UP/lib"
NAME=upg
OUT=$T/$NAME.out
"$UP/bin/cusnap" launch --name "$NAME" -- "$PATTERN_JOB" --mib 4 --interval-ms 20 >"$OUT" 2>&1 &
SUPERVISORS+=($!)
SUP=$!
wait_count "$OUT" 3
PID=$(wait_job "$NAME")

# The upgrade: a new file at the binary's path.
cp "$CUSNAP" "$UP/bin/cusnap.new"
mv -f "$UP/bin/cusnap.new" "$UP/bin/cusnap"
case $(readlink "/proc/$SUP/exe") in
  *" (deleted)") ;;
  *) fail "the supervisor's binary does not read as replaced: $(readlink "/proc/$SUP/exe")" ;;
esac

LOG=$CUSNAP_RUNTIME_BASE/$NAME/output.log
kill -KILL "$SUP"
wait "$SUP" 2>/dev/null || true
wait_guardian "$NAME" "$SUP" running
G1=$GUARD
pass "the supervisor of a replaced binary killed: guardian $G1 supervises the job"

# The first guardian's own guardian takes over in turn.
for _ in $(seq 1 100); do
  [ -n "$(pgrep -P "$G1" -f __guardian)" ] && break
  sleep 0.05
done
[ -n "$(pgrep -P "$G1" -f __guardian)" ] || fail "guardian $G1 started no guardian of its own"
kill -KILL "$G1"
wait_guardian "$NAME" "$G1" running
G2=$GUARD
expect_running "$NAME" "$PID" "$LOG"
pass "that guardian killed: its own guardian $G2 supervises the job"

BEFORE=$(last_count "$LOG")
op checkpoint "$NAME" -o "$T/ck"
[ "$RC" = 0 ] || fail "a checkpoint through the second guardian exited $RC: $(cat "$T/op.out")"
wait_gone "$PID"
restore_bg "$T/ck" "$T/restored.out"
wait_count "$T/restored.out" $((BEFORE + 3))
[ "$(first_count "$T/restored.out")" -gt "$BEFORE" ] ||
  fail "the restored job began at $(first_count "$T/restored.out"), not after $BEFORE"
grep -q "pattern mismatch" "$T/restored.out" && fail "the restored job found a wrong byte"
kill -TERM "$LAST_SUPERVISOR"
wait_exit "$LAST_SUPERVISOR"
wait_gone "$PID"
pass "a checkpoint through it, and its restore"

NAME=ended
"$CUSNAP" launch --name "$NAME" -- "$PATTERN_JOB" --mib 4 --interval-ms 20 >"$T/ended.out" 2>&1 &
SUPERVISORS+=($!)
SUP=$!
wait_count "$T/ended.out" 3
PID=$(wait_job "$NAME")
LOG=$CUSNAP_RUNTIME_BASE/$NAME/output.log
kill -STOP "$SUP"
kill -KILL "$PID"
# A zombie its stopped supervisor does not reap before the supervisor dies.
for _ in $(seq 1 200); do
  [ "$(awk '{print $3}' "/proc/$PID/stat" 2>/dev/null)" = Z ] && break
  sleep 0.05
done
kill -KILL "$SUP"
wait "$SUP" 2>/dev/null || true
for _ in $(seq 1 200); do grep -q "cusnap: guardian:" "$LOG" 2>/dev/null && break; sleep 0.05; done
grep -q "cusnap: guardian: the job has ended (its process $PID is gone)" "$LOG" ||
  fail "the guardian of an ended job said: $(grep cusnap: "$LOG" 2>/dev/null)"
grep -q "runs on" "$LOG" && fail "the guardian of an ended job said it runs on: $(grep cusnap: "$LOG")"
pass "the job ended with its supervisor: the guardian says so"
echo PASS
