#!/usr/bin/env bash
# The job's recorded state follows what the driver says. A suspended job
# whose GPU state was brought back outside cusnap (the driver's restore and
# unlock called by another tool: fakecuda_ckpt here; on the
# real driver the same program built against libcuda) is still recorded
# suspended:
#   - cusnap suspend is refused (exit 3), saying the driver runs it and that
#     cusnap resume records it running;
#   - cusnap resume finds every process running: it restores nothing,
#     records the job running, says so and exits 0;
#   - the job can then be suspended and resumed again as usual.
# And the other way: a job recorded running whose process the driver holds
# checkpointed (suspended outside cusnap): suspend is refused saying to
# resume; cusnap resume restores it and the job counts on.
source "$(dirname "$0")/lib_checkpoint.sh"
# The other tool: the simulated driver's fakecuda_ckpt, or on the real driver
# the same program built here against the system's libcuda.
if [ "$REAL_DRIVER" = 1 ]; then
  CKPT=$T/ckpt-tool
  cuda=${CUDA_HOME:-/usr/local/cuda}
  g++ -O1 -isystem "$cuda/include" -o "$CKPT" "$(dirname "$0")/../fakecuda/progs/fakecuda_ckpt.cpp" -lcuda \
    >"$T/ckpt-build.log" 2>&1 || fail "could not build the checkpoint tool: $(cat "$T/ckpt-build.log")"
else
  CKPT=$CUSNAP_FAKECUDA_DIR/fakecuda_ckpt
fi
[ -x "$CKPT" ] || fail "$CKPT is not built"

NAME=sfd
OUT=$T/$NAME.out
launch "$NAME" "$OUT" "$PATTERN_JOB" --mib 4 --interval-ms 20
SUP=$LAST_SUPERVISOR
wait_count "$OUT" 3
PID=$(wait_job "$NAME")

# ---- suspended by cusnap, brought back by another tool.
op suspend "$NAME"
[ "$RC" = 0 ] || fail "suspend exited $RC"
[ "$(cuda_states "$NAME")" = checkpointed ] || fail "the job's GPU state is $(cuda_states "$NAME")"
"$CKPT" resume "$PID" >"$T/ckpt.out" 2>&1 || fail "the checkpoint tool's resume failed: $(cat "$T/ckpt.out")"
[ "$(cuda_states "$NAME")" = running ] || fail "the job's GPU state is $(cuda_states "$NAME")"
[ "$(job_field "$NAME" state)" = suspended ] || fail "the job shows $(job_field "$NAME" state)"
expect_running "$NAME" "$PID" "$OUT"
pass "resumed outside cusnap: the driver runs the job, cusnap still records it suspended"

op suspend "$NAME"
[ "$RC" = 3 ] || fail "suspend of a job recorded suspended exited $RC, expected 3"
said "recorded suspended, but the driver runs every process" suspend
said "cusnap resume $NAME records it running" suspend
op resume "$NAME"
[ "$RC" = 0 ] || fail "resume of a job the driver already runs exited $RC"
said "the driver already runs every process of it" resume
said "recorded running" resume
[ "$(job_field "$NAME" state)" = running ] || fail "after resume the job shows $(job_field "$NAME" state)"
op resume "$NAME" --json
[ "$RC" = 3 ] || fail "a second resume exited $RC, expected 3 (not suspended)"
said "is not suspended" resume
pass "resume found every process running: recorded running, exit 0, saying so"

op suspend "$NAME"
[ "$RC" = 0 ] || fail "suspend after that exited $RC"
[ "$(job_field "$NAME" state)" = suspended ] || fail "the job shows $(job_field "$NAME" state)"
[ "$(cuda_states "$NAME")" = checkpointed ] || fail "the job's GPU state is $(cuda_states "$NAME")"
op resume "$NAME"
[ "$RC" = 0 ] || fail "resume exited $RC"
expect_running "$NAME" "$PID" "$OUT"
pass "suspended and resumed again as usual"

# ---- recorded running, suspended by another tool.
"$CKPT" suspend "$PID" >"$T/ckpt.out" 2>&1 || fail "the checkpoint tool's suspend failed: $(cat "$T/ckpt.out")"
[ "$(cuda_states "$NAME")" = checkpointed ] || fail "the job's GPU state is $(cuda_states "$NAME")"
[ "$(job_field "$NAME" state)" = running ] || fail "the job shows $(job_field "$NAME" state)"
op suspend "$NAME"
[ "$RC" = 3 ] || fail "suspend of a job the driver already holds exited $RC, expected 3"
said "run cusnap resume first" suspend
op resume "$NAME"
[ "$RC" = 0 ] || fail "resume exited $RC"
expect_running "$NAME" "$PID" "$OUT"
pass "suspended outside cusnap while recorded running: resume brought it back"

kill -TERM "$SUP"
wait_exit "$SUP"
wait_gone "$PID" 20
echo PASS
