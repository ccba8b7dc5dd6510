#!/usr/bin/env bash
# An interrupt (SIGINT, as Ctrl-C sends) to `cusnap checkpoint` or `cusnap
# suspend` while the supervisor works (its driver checkpoint slowed to 2 s):
# the command ends at once with 130, saying that the operation goes on in
# the job's supervisor and how to follow it (--json: the failure object);
# the operation does go on: the checkpoint completes and restores, the
# suspend leaves the job suspended. The same for the waiting command of
# `cusnap restore --detach` (the background supervisor's driver restore
# slowed): the job comes back. (Before: each command died silently.)
source "$(dirname "$0")/lib_checkpoint.sh"
fake_only "FAKECUDA_DELAY slows the simulated driver" || exit 77

FAKECUDA_DELAY="cuCheckpointProcessCheckpoint:2000" "$CUSNAP" launch --name intr -- \
  env -u FAKECUDA_DELAY "$PATTERN_JOB" --mib 4 --interval-ms 20 >"$T/job.out" 2>&1 &
SUP=$!
SUPERVISORS+=("$SUP")
wait_count "$T/job.out" 3
PID=$(wait_job intr)

# interrupted OP ARGS...: runs `cusnap OP intr ARGS` in the background,
# sends it SIGINT once the supervisor is in the operation, and checks its
# exit and what it said (output in $T/OP.out).
interrupted() {
  local op=$1 rc=0 state
  shift
  "$CUSNAP" "$op" intr "$@" >"$T/$op.out" 2>"$T/$op.err" &
  local c=$!
  for _ in $(seq 1 200); do
    state=$(job_field intr state)
    [ "$state" = checkpointing ] || [ "$state" = suspending ] && break
    sleep 0.02
  done
  sleep 0.3
  kill -INT "$c"
  wait "$c" || rc=$?
  [ "$rc" = 130 ] || fail "$op: exit $rc after SIGINT: $(cat "$T/$op.err")"
  grep -q "cusnap: interrupted: the $op of job intr goes on in its supervisor (an interrupt here does not cancel it); cusnap ps shows the job's state" \
    "$T/$op.err" || fail "$op: nothing said about the interrupt: $(cat "$T/$op.err")"
}

interrupted checkpoint -o "$T/ck"
wait_exit "$SUP"
[ -e "$T/ck/manifest.json" ] || fail "the interrupted checkpoint did not complete"
wait_gone "$PID"
LAST=$(last_count "$T/job.out")
pass "checkpoint interrupted: exit 130, said so; the checkpoint completed and stopped the job"

FAKECUDA_DELAY="cuCheckpointProcessCheckpoint:2000" restore_bg "$T/ck" "$T/r.out" --name intr
SUP=$LAST_SUPERVISOR
wait_count "$T/r.out" $((LAST + 3))
interrupted suspend --json
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["exit_code"]==130 and not j["ok"] and "goes on" in j["error"], j' \
  "$T/suspend.out" || fail "suspend --json: no failure object: $(cat "$T/suspend.out")"
for _ in $(seq 1 200); do [ "$(job_field intr state)" = suspended ] && break; sleep 0.05; done
[ "$(job_field intr state)" = suspended ] || fail "the interrupted suspend did not complete: $(job_field intr state)"
"$CUSNAP" resume intr >"$T/resume.out" 2>&1 || fail "resume: $(cat "$T/resume.out")"
expect_running intr "$PID" "$T/r.out"
pass "suspend --json interrupted: exit 130 with the failure object; the job was suspended, and resumes"
kill -TERM "$SUP"
wait_exit "$SUP"
wait_gone "$PID"

# restore --detach: the background supervisor restores (its driver restore
# slowed to 2 s); the waiting command, interrupted, says the restore goes
# on, and it does: the job comes back and counts.
FAKECUDA_DELAY="cuCheckpointProcessRestore:2000" "$CUSNAP" restore "$T/ck" --name intr3 --detach \
  >"$T/detach.out" 2>"$T/detach.err" &
C=$!
for _ in $(seq 1 200); do [ -e "/proc/$PID" ] && break; sleep 0.02; done # CRIU has restored it
sleep 0.5
rc=0
kill -INT "$C"
wait "$C" || rc=$?
[ "$rc" = 130 ] || fail "restore --detach: exit $rc after SIGINT: $(cat "$T/detach.err")"
grep -q "cusnap: interrupted: the restore of $T/ck goes on in its supervisor (an interrupt here does not cancel it)" \
  "$T/detach.err" || fail "restore --detach: nothing said about the interrupt: $(cat "$T/detach.err")"
for _ in $(seq 1 200); do [ "$(job_field intr3 state)" = running ] && break; sleep 0.05; done
[ "$(job_field intr3 pid)" = "$PID" ] || fail "the interrupted restore --detach did not bring the job back"
"$CUSNAP" inspect intr3 >/dev/null || fail "inspect intr3 failed"
pass "restore --detach interrupted: exit 130, said so; the job came back"
kill -TERM "$(job_field intr3 supervisor_pid)"
wait_gone "$PID"
