#!/usr/bin/env bash
# An interrupt (SIGINT, as Ctrl-C sends) to the waiting command of `cusnap
# restore --detach` while the background supervisor works (its driver
# restore slowed): the command ends at once with 130, saying that the restore
# goes on in the job's supervisor and how to follow it; the job comes back.
# (Before: the command died silently. An interrupt to `cusnap checkpoint` or
# `cusnap suspend` cancels the operation instead: checkpoint_cancel.sh.)
source "$(dirname "$0")/lib_checkpoint.sh"
fake_only "FAKECUDA_DELAY slows the simulated driver" || exit 77

checkpointed_job intr "$T/job.out" "$T/ck"

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
