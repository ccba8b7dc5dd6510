#!/usr/bin/env bash
# A second fault inside the roll back. The operation's own driver call fails,
# and then the calls that bring the job back fail too (armed in the
# supervisor only, through FAKECUDA_FAIL_FILE, at the moment of the
# operation):
#   once      the roll back tries again and the job runs on unchanged (exit 1)
#             (the unlock after a failed driver checkpoint; the driver restore
#             after a failed CRIU dump)
#   always    every pass of the roll back fails: exit 6, and the job is left
#             suspended, not lost: cusnap ps says so, checkpoint and suspend
#             are refused until cusnap resume brings it back, after which it
#             counts on with every byte right and checkpoints and restores
#             (a plain job's checkpoint; a suspend; a job sharing device
#             memory, whose saved shared memory stays in the checkpoint
#             directory until the resume rebuilds it from there; and a
#             supervisor killed while its job is left suspended, whose
#             guardian takes the job over and resumes it); the saved shared
#             memory removed by hand: the resume says so and keeps the gates
#             closed; a job with a forked worker that never started CUDA,
#             whose resume leaves the worker out; --leave-running, whose in-place restore fails after
#             the dump: left suspended, and its checkpoint is completed and
#             restores
source "$(dirname "$0")/lib_shared.sh"
source "$(dirname "$0")/lib_reliability.sh"
fake_only "fault injection (FAKECUDA_FAIL_FILE)" || exit 77

PREFIXES=("" "importer ")
CK=cuCheckpointProcessCheckpoint
# unlocks N: the supervisor's next N unlocks fail. A roll back makes three
# passes over the locked processes, each unlocking those still locked.
unlocks() { local i; for i in $(seq 1 "$1"); do printf ',cuCheckpointProcessUnlock:%s:999' "$i"; done; }

# start NAME CMD...: launches CMD under a supervisor whose driver calls fail
# as $T/fail.<supervisor pid> says when it is written; waits for every
# prefix to count. Sets SUP, PID, LAUNCH_OUT.
start() {
  local name=$1 p
  shift
  LAUNCH_OUT=$T/$name.out
  FAKECUDA_FAIL_FILE="$T/fail.%p" "$CUSNAP" launch --name "$name" -- \
    env -u FAKECUDA_FAIL_FILE "$@" >"$LAUNCH_OUT" 2>&1 &
  SUPERVISORS+=($!)
  SUP=$!
  for p in "${NOW_PREFIXES[@]}"; do wait_count "$LAUNCH_OUT" 5 "$p" 30; done
  PID=$(wait_job "$name")
  ready_pids "$LAUNCH_OUT" >>"$T/job-pids" || true
}
# arm SPEC: the supervisor's next driver calls fail as SPEC says (counted from now).
arm() { printf '%s\n' "$1" >"$T/fail.$SUP"; }

# counts_on OUT: every prefix counts on, sees its peers' writes (when it
# shares memory) and found no wrong byte.
counts_on() {
  local p n
  for p in "${NOW_PREFIXES[@]}"; do
    n=$(last_count "$1" "$p")
    wait_count "$1" $((n + 3)) "$p" 30
    grep -qE "^${p}seen " "$1" && wait_seen "$1" "$p" "$(last_seen "$1" "$p")"
  done
  no_errors "$1"
}

# op_rc OP NAME ARGS...: runs cusnap OP NAME ARGS, output in $T/op.out; sets RC.
op_rc() {
  RC=0
  "$CUSNAP" "$@" >"$T/op.out" 2>&1 || RC=$?
}

# left_suspended NAME OP: OP (its output in $T/op.out) ended with exit 6,
# saying the job is left suspended and how to bring it back; ps shows the
# job suspended and checkpoint and suspend are refused.
left_suspended() {
  [ "$RC" = 6 ] || fail "$2 exited $RC, expected 6: $(cat "$T/op.out")"
  grep -q "the job is left suspended" "$T/op.out" ||
    fail "$2 did not say the job is left suspended: $(cat "$T/op.out")"
  grep -q "run cusnap resume $1 to bring it back" "$T/op.out" ||
    fail "$2 did not say how to bring the job back: $(cat "$T/op.out")"
  grep -q "failed: CUDA_ERROR_UNKNOWN (999) (3 tries)" "$T/op.out" ||
    fail "$2 did not say the roll back was tried three times: $(cat "$T/op.out")"
  [ "$(job_field "$1" state)" = suspended ] ||
    fail "cusnap ps shows job $1 $(job_field "$1" state), expected suspended"
  echo "   $2 said: $(tr '\n' ' ' <"$T/op.out")"
  expect_refused 3 "left suspended by a failed roll back.*run cusnap resume $1 first" \
    "$CUSNAP" checkpoint "$1" -o "$T/refused.ckpt"
  [ ! -e "$T/refused.ckpt/manifest.json" ] || fail "a refused checkpoint wrote a manifest"
  expect_refused 3 "already suspended" "$CUSNAP" suspend "$1"
}

# resumed NAME: cusnap resume brings the job back; it counts on, intact.
resumed() {
  op_rc resume "$1"
  [ "$RC" = 0 ] || fail "resume of $1 exited $RC: $(cat "$T/op.out")"
  [ "$(job_field "$1" state)" = running ] ||
    fail "cusnap ps shows job $1 $(job_field "$1" state) after the resume"
  [ ! -e "$CUSNAP_RUNTIME_BASE/$1/left-suspended" ] || fail "the resume left the marker behind"
}

# cycle NAME: a checkpoint that stops the job, and its restore, which counts on.
cycle() {
  local pids last
  pids=$(ready_pids "$LAUNCH_OUT")
  op_rc checkpoint "$1" -o "$T/$1.final"
  [ "$RC" = 0 ] || fail "a checkpoint of $1 after the resume exited $RC: $(cat "$T/op.out")"
  for p in $pids $PID; do wait_gone "$p" 20; done
  last=$(last_count "$LAUNCH_OUT")
  restore_bg "$T/$1.final" "$T/$1.restored.out"
  wait_count "$T/$1.restored.out" $((last + 3)) "" 30
  [ "$(first_count "$T/$1.restored.out")" = $((last + 1)) ] ||
    fail "the restored $1 began at $(first_count "$T/$1.restored.out"), not $((last + 1))"
  counts_on "$T/$1.restored.out"
  kill -TERM "$LAST_SUPERVISOR"
  wait_exit "$LAST_SUPERVISOR"
  for p in $pids $PID; do wait_gone "$p" 20; done
}

NOW_PREFIXES=("")

# ---- once: the roll back's unlock fails once, its second pass succeeds.
start once "$PATTERN_JOB" --mib 4 --interval-ms 20
arm "$CK:1:999,cuCheckpointProcessUnlock:1:999"
op_rc checkpoint once -o "$T/once.ckpt"
[ "$RC" = 1 ] || fail "once: checkpoint exited $RC, expected 1: $(cat "$T/op.out")"
grep -q "the job runs on unchanged" "$T/op.out" || fail "once: $(cat "$T/op.out")"
[ ! -e "$T/once.ckpt" ] || fail "once: the failed checkpoint left its directory"
expect_running once "$PID" "$LAUNCH_OUT"
pass "once: an unlock failing once in the roll back: rolled back"

# ---- once, after CRIU: the dump fails, then the driver restore once.
REAL_CRIU=$(PATH=$PATH:/usr/local/sbin:/usr/sbin command -v criu)
printf '#!/bin/sh\nif [ "$1" = dump ] && [ ! -e "%s" ]; then\n  : >"%s"\n  echo "injected dump failure" >&2\n  exit 1\nfi\nexec "%s" "$@"\n' \
  "$T/criu-failed" "$T/criu-failed" "$REAL_CRIU" >"$T/criu-fail"
chmod 755 "$T/criu-fail"
kill -TERM "$SUP"; wait_exit "$SUP"; wait_gone "$PID" 20
CUSNAP_CRIU=$T/criu-fail start criu "$PATTERN_JOB" --mib 4 --interval-ms 20
arm "cuCheckpointProcessRestore:1:999"
op_rc checkpoint criu -o "$T/criu.ckpt"
[ "$RC" = 1 ] || fail "criu: checkpoint exited $RC, expected 1: $(cat "$T/op.out")"
grep -q "CRIU dump phase" "$T/op.out" && grep -q "the job runs on unchanged" "$T/op.out" ||
  fail "criu: $(cat "$T/op.out")"
expect_running criu "$PID" "$LAUNCH_OUT"
kill -TERM "$SUP"; wait_exit "$SUP"; wait_gone "$PID" 20
pass "criu: a driver restore failing once after a failed dump: rolled back"

# ---- always: every unlock of the roll back fails; then the guardian.
start always "$PATTERN_JOB" --mib 4 --interval-ms 20
arm "$CK:1:999$(unlocks 3)"
op_rc checkpoint always -o "$T/always.ckpt"
left_suspended always checkpoint
[ ! -e "$T/always.ckpt" ] || fail "always: the failed checkpoint left its directory"
grep -q '"locked"' <("$CUSNAP" inspect always --json) ||
  fail "always: the job's GPU state is not locked: $("$CUSNAP" inspect always --json)"
n=$(settled_count "$LAUNCH_OUT"); sleep 0.3
[ "$(last_count "$LAUNCH_OUT")" = "$n" ] || fail "always: the job counted on while left suspended"
pass "always: checkpoint left the job suspended ($(grep -m1 'left suspended' "$T/op.out"))"
# The supervisor dies now: its guardian takes the job over, suspended.
kill -KILL "$SUP"
wait_exit "$SUP" 2>/dev/null
LOG=$CUSNAP_RUNTIME_BASE/always/output.log
wait_guardian always "$SUP" suspended
resumed always
counts_on "$LOG"
expect_running always "$PID" "$LOG"
kill -TERM "$GUARD"
wait_gone "$PID" 20
pass "always: the guardian took the job over suspended and resumed it"

# ---- a suspend whose roll back fails: left suspended; resume; a cycle.
# Three more unlocks fail: the first resume fails too, and says so; the job
# stays left suspended, and a second resume brings it back.
start susp "$PATTERN_JOB" --mib 4 --interval-ms 20
arm "$CK:1:999$(unlocks 6)"
op_rc suspend susp
left_suspended susp suspend
op_rc resume susp
[ "$RC" = 1 ] || fail "susp: the first resume exited $RC, expected 1: $(cat "$T/op.out")"
grep -q "the job stays suspended: run cusnap resume susp again" "$T/op.out" ||
  fail "susp: the failed resume does not say to run it again: $(cat "$T/op.out")"
[ "$(job_field susp state)" = suspended ] || fail "susp: a failed resume shows $(job_field susp state)"
[ -e "$CUSNAP_RUNTIME_BASE/susp/left-suspended" ] || fail "susp: a failed resume dropped the marker"
resumed susp
expect_running susp "$PID" "$LAUNCH_OUT"
cycle susp
pass "suspend: left suspended, resumed, then checkpointed and restored"

# ---- a worker forked after CUDA started that never calls the driver (its
# state query answers CUDA_ERROR_NOT_INITIALIZED, as a data-loader worker's
# does): the suspend leaves it out, and so must the resume of the job its
# failed roll back left suspended (it failed on the worker for good). A bad
# CUSNAP_RESTORE_MEMORY_MARGIN is refused by that resume before it is sent
# (exit 2), as by a plain one; the job stays left suspended.
NOW_PREFIXES=("parent ")
start idle "$FORK_CHILD" --idle-child --mib 4 --interval-ms 20
CHILD=$(sed -n 's/^child idle ready pid \([0-9]*\)$/\1/p' "$LAUNCH_OUT")
[ -n "$CHILD" ] || fail "idle: the idle child did not start: $(cat "$LAUNCH_OUT")"
arm "$CK:1:999$(unlocks 3)"
op_rc suspend idle
left_suspended idle suspend
# A bad margin is refused before anything is tried, as for a plain resume.
CUSNAP_RESTORE_MEMORY_MARGIN=lots op_rc resume idle
[ "$RC" = 2 ] || fail "idle: a resume with a bad margin exited $RC, expected 2: $(cat "$T/op.out")"
grep -q 'CUSNAP_RESTORE_MEMORY_MARGIN="lots" is not a size' "$T/op.out" ||
  fail "idle: the refusal does not name the margin: $(cat "$T/op.out")"
[ -e "$CUSNAP_RUNTIME_BASE/idle/left-suspended" ] || fail "idle: the refused resume dropped the marker"
resumed idle
counts_on "$LAUNCH_OUT"
n=$(grep -c "^child idle [0-9]" "$LAUNCH_OUT")
for _ in $(seq 1 100); do
  [ "$(grep -c "^child idle [0-9]" "$LAUNCH_OUT")" -gt "$n" ] && break
  sleep 0.05
done
[ "$(grep -c "^child idle [0-9]" "$LAUNCH_OUT")" -gt "$n" ] || fail "idle: the idle child stopped"
kill -TERM "$SUP"; wait_exit "$SUP"; wait_gone "$PID" 20; wait_gone "$CHILD" 20
pass "a worker that never started CUDA: left out of the resume after a failed roll back"
NOW_PREFIXES=("")

# ---- --leave-running: the in-place driver restore after the dump fails every
# pass. The job is left suspended, and the checkpoint is completed all the
# same: it restores once the job is resumed and stopped.
start lr "$PATTERN_JOB" --mib 4 --interval-ms 20
before=$(last_count "$LAUNCH_OUT")
arm "cuCheckpointProcessRestore:1:999,cuCheckpointProcessRestore:2:999,cuCheckpointProcessRestore:3:999"
op_rc checkpoint lr -o "$T/lr.ckpt" --leave-running
left_suspended lr "checkpoint --leave-running"
grep -q "the checkpoint in $T/lr.ckpt is complete" "$T/op.out" ||
  fail "lr: the error does not say the checkpoint is complete: $(cat "$T/op.out")"
after=$(last_count "$LAUNCH_OUT")
"$CUSNAP" inspect "$T/lr.ckpt" >"$T/inspect.out" 2>&1 || fail "lr: inspect of the checkpoint: $(cat "$T/inspect.out")"
resumed lr
expect_running lr "$PID" "$LAUNCH_OUT"
"$CUSNAP" inspect "$T/lr.ckpt" >"$T/inspect.out" 2>&1 ||
  fail "lr: the resume damaged the checkpoint: $(cat "$T/inspect.out")"
kill -TERM "$SUP"; wait_exit "$SUP"; wait_gone "$PID" 20
restore_bg "$T/lr.ckpt" "$T/lr.restored.out"
wait_count "$T/lr.restored.out" $((after + 3)) "" 30
first=$(first_count "$T/lr.restored.out")
[ "$first" -gt "$before" ] && [ "$first" -le $((after + 1)) ] ||
  fail "lr: the restored job began at $first, not within ($before, $((after + 1))]"
no_errors "$T/lr.restored.out"
kill -TERM "$LAST_SUPERVISOR"; wait_exit "$LAST_SUPERVISOR"; wait_gone "$PID" 20
pass "--leave-running: left suspended with a complete checkpoint; resumed; the checkpoint restored at count $first"

# ---- shared memory: the saved bytes stay in the checkpoint directory.
NOW_PREFIXES=("" "importer ")
start shared "$SHARE_JOB" --mib 4 --interval-ms 20
arm "$CK:1:999$(unlocks 6)"  # two processes, three passes
op_rc checkpoint shared -o "$T/shared.ckpt"
left_suspended shared checkpoint
grep -q "its shared memory saved in $T/shared.ckpt" "$T/op.out" ||
  fail "shared: the error does not say where the shared memory is: $(cat "$T/op.out")"
ls "$T/shared.ckpt/shim/"*.records >/dev/null 2>&1 || fail "shared: the saved records are gone"
[ -n "$(ls "$T/shared.ckpt/shared")" ] || fail "shared: the saved bytes are gone"
[ ! -e "$T/shared.ckpt/manifest.json" ] && [ ! -e "$T/shared.ckpt/criu" ] ||
  fail "shared: the failed checkpoint left more than its saved memory: $(ls "$T/shared.ckpt")"
resumed shared
[ ! -e "$T/shared.ckpt" ] || fail "shared: the saved memory was not removed after the resume"
counts_on "$LAUNCH_OUT"
for p in $(ready_pids "$LAUNCH_OUT"); do kill -0 "$p" || fail "shared: process $p died"; done
pass "shared: left suspended with its shared memory in the checkpoint directory; resumed"
PREFIXES=("" "importer ")
checkpoint_stop shared "$T/shared.final" "$LAUNCH_OUT"
restore_bg "$T/shared.final" "$T/shared.restored.out"
SUP=$LAST_SUPERVISOR
expect_continued "$T/shared.restored.out" 1
stop_job "$LAUNCH_OUT"
pass "shared: then checkpointed and restored"
# ---- the saved shared memory removed by hand: the resume cannot rebuild it,
# says so, and keeps the gates closed (the memory they guard is released).
NOW_PREFIXES=("" "importer ")
start gone "$SHARE_JOB" --mib 4 --interval-ms 20
arm "$CK:1:999$(unlocks 6)"
op_rc checkpoint gone -o "$T/gone.ckpt"
[ "$RC" = 6 ] || fail "gone: checkpoint exited $RC, expected 6: $(cat "$T/op.out")"
rm -rf "$T/gone.ckpt"
op_rc resume gone
[ "$RC" = 1 ] || fail "gone: resume exited $RC, expected 1: $(cat "$T/op.out")"
grep -q "saved in $T/gone.ckpt is gone, so the job's shared memory cannot be rebuilt" "$T/op.out" ||
  fail "gone: the resume does not say the saved memory is gone: $(cat "$T/op.out")"
grep -q "cannot be brought back without its saved shared memory: stop it (SIGTERM to its supervisor, process $SUP)" "$T/op.out" ||
  fail "gone: the resume does not say what to do: $(cat "$T/op.out")"
[ "$(job_field gone state)" = suspended ] || fail "gone: the job shows $(job_field gone state)"
n=$(last_count "$LAUNCH_OUT"); m=$(last_count "$LAUNCH_OUT" "importer "); sleep 0.5
[ "$(last_count "$LAUNCH_OUT")" = "$n" ] && [ "$(last_count "$LAUNCH_OUT" "importer ")" = "$m" ] ||
  fail "gone: a process went on past its gate with its shared memory released"
no_errors "$LAUNCH_OUT"
echo "   resume said: $(tr '\n' ' ' <"$T/op.out")"
pass "gone: the saved shared memory removed: the resume keeps the gates closed"
echo PASS
