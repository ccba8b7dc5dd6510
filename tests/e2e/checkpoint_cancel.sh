#!/usr/bin/env bash
# The first interrupt (SIGINT, as Ctrl-C sends) to a waiting `cusnap
# checkpoint` or `cusnap suspend` cancels the operation: the supervisor rolls
# back at its next phase boundary, the command says "cancelled: job J runs on
# unchanged" and exits 130 (--json: one failure object, "cancelled": true),
# the job counts on with its memory intact, and no checkpoint is left that a
# restore would take. Cancelled in the driver phase (the simulated driver's
# checkpoint slowed to 2 s), during the CRIU dump (CRIU held at post-dump,
# and ended at once), and a suspend; a second interrupt leaves at once, the outcome
# not known, while the cancel goes on. Then a checkpoint and its restore
# still work. (Before: an interrupt ended only the command, the operation
# went on.) On the real driver, whose checkpoint of a small job is too quick
# to be interrupted in time, only the cases CRIU's hold makes certain run.
source "$(dirname "$0")/lib_checkpoint.sh"
SLOW="FAKECUDA_DELAY slows the simulated driver's checkpoint to 2 s"

criu_hold_setup
# FAKECUDA_LOG=1: the supervisor's driver calls traced in $T/job.out (not the job's).
FAKECUDA_LOG=1 FAKECUDA_DELAY="cuCheckpointProcessCheckpoint:2000,cuCheckpointProcessRestore:1000" \
  CUSNAP_CRIU="$HOLD_CRIU" "$CUSNAP" launch --name cc -- \
  env -u FAKECUDA_DELAY -u FAKECUDA_LOG "$PATTERN_JOB" --mib 4 --interval-ms 20 >"$T/job.out" 2>&1 &
SUP=$!
SUPERVISORS+=("$SUP")
wait_count "$T/job.out" 3
PID=$(wait_job cc)

# driver_checkpoints: how many driver checkpoints the supervisor has begun
# (calls_begun, lib_checkpoint.sh).
driver_checkpoints() { calls_begun "$T/job.out" cuCheckpointProcessCheckpoint "$SUP"; }

# start OP ARGS...: runs `cusnap OP cc ARGS` in the background (output in
# $T/OP.out and $T/OP.err, its pid in C) and waits until the supervisor is
# in the operation.
start() {
  local op=$1 state
  shift
  BEFORE=$(driver_checkpoints)
  "$CUSNAP" "$op" cc "$@" >"$T/$op.out" 2>"$T/$op.err" &
  C=$!
  for _ in $(seq 1 200); do
    state=$(job_field cc state)
    [ "$state" = checkpointing ] || [ "$state" = suspending ] && break
    sleep 0.02
  done
}

# in_driver_phase OP: waits (30 s at most) until the supervisor is in the
# driver checkpoint of the operation start began, slowed to 2 s: a fixed
# sleep may end before the operation's checks (criu --version, /proc) have,
# on a loaded machine, and the interrupt cancel nothing yet.
in_driver_phase() {
  wait_driver_call "$T/job.out" cuCheckpointProcessCheckpoint "$BEFORE" "$C" "$SUP" ||
    fail "$1: the driver's checkpoint did not begin: $(cat "$T/$1.err")"
  kill -0 "$C" 2>/dev/null || fail "$1: the command ended before the interrupt: $(cat "$T/$1.err")"
}

# cancelled OP: the command C ended with 130, saying it was cancelled, and
# the job runs on unchanged.
cancelled() {
  local op=$1 rc=0
  wait "$C" || rc=$?
  [ "$rc" = 130 ] || fail "$op: exit $rc after SIGINT: $(cat "$T/$op.err")"
  grep -q "cusnap: cancelling the $op of job cc" "$T/$op.err" ||
    fail "$op: nothing said about cancelling: $(cat "$T/$op.err")"
  grep -q "cusnap: cancelled: job cc runs on unchanged" "$T/$op.err" ||
    fail "$op: not said cancelled: $(cat "$T/$op.err")"
  [ "$(job_field cc state)" = running ] || fail "$op: the job is $(job_field cc state) after the cancel"
  expect_running cc "$PID" "$T/job.out"
}

# no_checkpoint DIR: nothing a restore would take is in DIR.
no_checkpoint() {
  [ ! -e "$1/manifest.json" ] || fail "the cancelled checkpoint left a manifest in $1"
  if "$CUSNAP" restore "$1" --name ccx >"$T/ccx.out" 2>&1; then
    fail "a restore took the cancelled checkpoint $1: $(cat "$T/ccx.out")"
  fi
}

# A checkpoint cancelled while the driver checkpoints the job.
if fake_only "$SLOW"; then
  start checkpoint -o "$T/ck1"
  in_driver_phase checkpoint
  kill -INT "$C"
  cancelled checkpoint
  no_checkpoint "$T/ck1"
  [ ! -e "$T/ck1" ] || fail "the cancelled checkpoint left $T/ck1: $(ls -la "$T/ck1")"
  pass "checkpoint cancelled in the driver phase: exit 130, said so; the job runs on, no checkpoint"
fi

# A checkpoint cancelled while CRIU dumps (held at post-dump, the images
# written, the tree still seized): CRIU is ended at once, as at its timeout,
# without waiting for it, and the checkpoint rolls back as a failed dump
# does. (Before, the cancel waited for CRIU's end.)
criu_hold_at post-dump
start checkpoint -o "$T/ck2" --json
criu_held || fail "CRIU was not held at post-dump"
kill -INT "$C"
for _ in $(seq 1 200); do kill -0 "$C" 2>/dev/null || break; sleep 0.05; done
kill -0 "$C" 2>/dev/null && fail "the cancel waits for the held CRIU: $(cat "$T/checkpoint.err")"
kill -0 "$HELD_CRIU" 2>/dev/null && fail "the cancelled checkpoint's CRIU $HELD_CRIU runs on"
criu_release
cancelled checkpoint
grep -q "cusnap: cancelling" "$T/checkpoint.err" || fail "nothing said of the cancel: $(cat "$T/checkpoint.err")"
python3 -c '
import json, sys
text = open(sys.argv[1]).read()
j = json.loads(text)  # exactly one object
assert j["ok"] is False and j["exit_code"] == 130 and j["cancelled"] is True, j
assert j["error"] == "cancelled: job cc runs on unchanged" and j["name"] == "cc", j' \
  "$T/checkpoint.out" || fail "checkpoint --json: not one cancelled object: $(cat "$T/checkpoint.out")"
no_checkpoint "$T/ck2"
pass "checkpoint --json cancelled during the CRIU dump: one object, exit 130; the job runs on"

# A suspend cancelled while the driver checkpoints the job, and a second
# interrupt.
if fake_only "$SLOW"; then
  start suspend --json
  in_driver_phase suspend
  kill -INT "$C"
  cancelled suspend
  python3 -c '
import json, sys
j = json.loads(open(sys.argv[1]).read())
assert j["exit_code"] == 130 and j["cancelled"] is True, j' "$T/suspend.out" ||
    fail "suspend --json: not one cancelled object: $(cat "$T/suspend.out")"
  [ ! -e "$T/run/cc/suspended" ] || fail "the cancelled suspend left its state: $(ls -la "$T/run/cc/suspended")"
  pass "suspend cancelled: exit 130, said so; the job runs on"

  # A second interrupt leaves at once; the cancel goes on in the supervisor.
  # With --json, its failure object names the job, as every failure after
  # the supervisor answered does.
  start checkpoint -o "$T/ck3" --json
  in_driver_phase checkpoint
  kill -INT "$C"
  for _ in $(seq 1 100); do grep -q "cusnap: cancelling" "$T/checkpoint.err" && break; sleep 0.05; done
  sleep 0.2
  rc=0
  if ! kill -INT "$C" 2>/dev/null; then
    wait "$C" || rc=$?
    fail "second interrupt: the command had ended already (exit $rc): $(cat "$T/checkpoint.err")"
  fi
  wait "$C" || rc=$?
  [ "$rc" = 130 ] || fail "second interrupt: exit $rc: $(cat "$T/checkpoint.err")"
  grep -q "cusnap: interrupted again: the checkpoint of job cc may still be running, or rolling back, in its supervisor; its outcome is not known: cusnap ps shows the job's state" \
    "$T/checkpoint.err" || fail "second interrupt: not said: $(cat "$T/checkpoint.err")"
  grep -q "cusnap: cancelled" "$T/checkpoint.err" && fail "second interrupt: the command waited for the outcome"
  python3 -c '
import json, sys
j = json.loads(open(sys.argv[1]).read())
assert j["ok"] is False and j["exit_code"] == 130 and "outcome is not known" in j["error"], j
assert j["job"] == j["name"] == "cc" and j["pid"] == int(sys.argv[2]), j' "$T/checkpoint.out" "$PID" ||
    fail "second interrupt --json: $(cat "$T/checkpoint.out")"
  for _ in $(seq 1 200); do [ "$(job_field cc state)" = running ] && break; sleep 0.05; done
  [ "$(job_field cc state)" = running ] || fail "the cancel did not bring the job back: $(job_field cc state)"
  expect_running cc "$PID" "$T/job.out"
  no_checkpoint "$T/ck3"
  pass "a second interrupt leaves at once, saying the outcome is not known; the cancel completes"
fi

# Then a checkpoint and its restore work as ever.
"$CUSNAP" checkpoint cc -o "$T/ck4" >"$T/ck4.out" 2>&1 || fail "checkpoint after the cancels: $(cat "$T/ck4.out")"
wait_exit "$SUP"
wait_gone "$PID"
LAST=$(last_count "$T/job.out")
restore_continues "$T/ck4" "$T/r.out" cc "$PID" "$LAST"
expect_running cc "$PID" "$T/r.out"
pass "a checkpoint after the cancels completes, and restores"
kill -TERM "$SUP"
wait_exit "$SUP"
