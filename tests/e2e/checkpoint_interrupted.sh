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
# slowed to 4 s); the waiting command, interrupted, says the restore goes
# on, and it does: the job comes back and counts.
# The background supervisor's output goes to /dev/null, its driver trace
# too: the driver's state of the job marks the window instead. Once CRIU has
# restored process $PID its state is checkpointed until the driver restore
# (slowed) has brought it back; the interrupt comes inside that window, and
# the state is asked again once it was sent.
CU_PROCESS_STATE_CHECKPOINTED=2  # cuda.h's CUprocessState, as fakecuda_ckpt prints it
FAKECUDA_DELAY="cuCheckpointProcessRestore:4000" "$CUSNAP" restore "$T/ck" --name intr3 --detach \
  >"$T/detach.out" 2>"$T/detach.err" &
C=$!
wait_driver_state "$PID" "$CU_PROCESS_STATE_CHECKPOINTED" "$C" ||
  fail "restore --detach: process $PID never showed restored by CRIU, awaiting the driver's restore (driver state '$DRIVER_STATE'): $(cat "$T/detach.err")"
rc=0
kill -INT "$C"
# Still checkpointed once the interrupt was sent: it came before the driver's
# restore had ended.
state=$("$CUSNAP_FAKECUDA_DIR/fakecuda_ckpt" state "$PID" 2>&1 | head -1 || true)
[ "$state" = "state $CU_PROCESS_STATE_CHECKPOINTED" ] ||
  fail "restore --detach: the driver's restore had ended (driver state '$state') before the interrupt"
wait "$C" || rc=$?
[ "$rc" = 130 ] || fail "restore --detach: exit $rc after SIGINT: $(cat "$T/detach.err")"
grep -q "cusnap: interrupted: the restore of $T/ck goes on in its supervisor (an interrupt here does not cancel it)" \
  "$T/detach.err" || fail "restore --detach: nothing said about the interrupt: $(cat "$T/detach.err")"
for _ in $(seq 1 300); do [ "$(job_field intr3 state)" = running ] && break; sleep 0.05; done
[ "$(job_field intr3 state)" = running ] ||
  fail "the interrupted restore --detach shows job intr3 '$(job_field intr3 state)', not running"
[ "$(job_field intr3 pid)" = "$PID" ] || fail "the interrupted restore --detach did not bring the job back"
[ "$(cuda_states intr3)" = running ] || fail "job intr3's GPU state is '$(cuda_states intr3)', not running"
# It counts on from where it was checkpointed (its output goes to its log).
wait_count "$CUSNAP_RUNTIME_BASE/intr3/output.log" $((LAST + 3)) "" 20
"$CUSNAP" inspect intr3 >/dev/null || fail "inspect intr3 failed"
pass "restore --detach interrupted: exit 130, said so; the job came back"
kill -TERM "$(job_field intr3 supervisor_pid)"
wait_gone "$PID"
