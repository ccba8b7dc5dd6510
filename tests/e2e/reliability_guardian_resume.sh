#!/usr/bin/env bash
# The supervisor killed in the middle of the resume of a job that a failed
# roll back left suspended. Its guardian, told that a resume was under way,
# brings the job back itself from what the left-suspended marker names, and
# supervises it from then on:
#   - a checkpoint whose driver checkpoint and every unlock of its roll back
#     fail (armed in the supervisor through FAKECUDA_FAIL_FILE) leaves the job
#     suspended, GPU state locked (exit 6);
#   - cusnap resume begins; every unlock of the supervisor (and so of its
#     guardian, forked from it) takes 2.5 s (FAKECUDA_DELAY), and the
#     supervisor is killed (SIGKILL) inside the first: the test waits for
#     the unlock's own trace line (FAKECUDA_LOG, in the supervisor's
#     stderr, written as the call enters, before its delay) and kills at
#     once, with nothing slow (cusnap ps) inside the window, and fails if
#     the kill may have come after those 2.5 s;
#   - the resume fails saying so; the guardian's log says the supervisor died
#     during resume; the job counts on with every byte right, supervised by the
#     guardian, shown running; the marker is gone; inspect no longer shows it
#     left suspended; a checkpoint through the guardian and its restore work.
source "$(dirname "$0")/lib_checkpoint.sh"
fake_only "fault injection (FAKECUDA_FAIL_FILE, FAKECUDA_DELAY)" || exit 77

NAME=gresume
OUT=$T/$NAME.out
UNLOCK_MS=2500 # each unlock of the supervisor (and its guardian)
FAKECUDA_LOG=1 FAKECUDA_FAIL_FILE="$T/fail.%p" FAKECUDA_DELAY="cuCheckpointProcessUnlock:$UNLOCK_MS" \
  "$CUSNAP" launch --name "$NAME" -- \
  env -u FAKECUDA_LOG -u FAKECUDA_FAIL_FILE -u FAKECUDA_DELAY "$PATTERN_JOB" --mib 4 --interval-ms 20 \
  >"$OUT" 2>&1 &
SUPERVISORS+=($!)
SUP=$!
wait_count "$OUT" 3
PID=$(wait_job "$NAME")

# ---- left suspended: the driver checkpoint fails, then every unlock.
printf '%s\n' "cuCheckpointProcessCheckpoint:1:999,cuCheckpointProcessUnlock:1:999,cuCheckpointProcessUnlock:2:999,cuCheckpointProcessUnlock:3:999" \
  >"$T/fail.$SUP"
op checkpoint "$NAME" -o "$T/first.ckpt"
[ "$RC" = 6 ] || fail "checkpoint exited $RC, expected 6"
said "the job is left suspended" checkpoint
[ "$(job_field "$NAME" state)" = suspended ] || fail "the job shows $(job_field "$NAME" state)"
[ "$(cuda_states "$NAME")" = locked ] || fail "the job's GPU state is $(cuda_states "$NAME")"
[ -e "$CUSNAP_RUNTIME_BASE/$NAME/left-suspended" ] || fail "no left-suspended marker"
pass "checkpoint: the roll back failed, the job is left suspended, its GPU state locked"

# ---- resume; the supervisor dies inside its unlock.
# The kill lands inside the unlock: wait_driver_call (lib_checkpoint.sh)
# waits for the unlock's trace line, which comes as the call enters, before
# its FAKECUDA_DELAY.
before=$(calls_begun "$OUT" cuCheckpointProcessUnlock "$SUP")
"$CUSNAP" resume "$NAME" >"$T/resume.out" 2>&1 &
RESUME=$!
wait_driver_call "$OUT" cuCheckpointProcessUnlock "$before" "$RESUME" "$SUP" 60 ||
  fail "the resume did not reach the driver's unlock: $(cat "$T/resume.out")"
kill -0 "$RESUME" 2>/dev/null || fail "the resume ended before the supervisor was killed: $(cat "$T/resume.out")"
killed=$EPOCHREALTIME
kill -KILL "$SUP"
late_ms=$((($(usecs "$killed") - ABSENT) / 1000))
[ "$late_ms" -lt "$UNLOCK_MS" ] ||
  fail "the supervisor was killed up to $late_ms ms into its unlock, maybe after the $UNLOCK_MS ms it takes"
echo "   the supervisor killed at most $late_ms ms into its unlock"
wait_exit "$SUP" 2>/dev/null
RRC=0
wait "$RESUME" || RRC=$?
[ "$RRC" != 0 ] || fail "the resume succeeded though its supervisor was killed: $(cat "$T/resume.out")"
echo "   cusnap resume (exit $RRC): $(tr '\n' ' ' <"$T/resume.out" | cut -c1-300)"

LOG=$CUSNAP_RUNTIME_BASE/$NAME/output.log
wait_guardian "$NAME" "$SUP" running
G=$GUARD
grep -q "the supervisor of job $NAME died during resume; the guardian brings the job back" "$LOG" ||
  fail "the guardian did not say it finishes the resume: $(cat "$LOG")"
grep -q "cusnap: guardian: the job runs on, supervised by process $G" "$LOG" ||
  fail "the guardian did not bring the job back: $(cat "$LOG")"
[ "$(calls_begun "$OUT" cuCheckpointProcessUnlock "$SUP")" = $((before + 1)) ] ||
  fail "the supervisor began $(($(calls_begun "$OUT" cuCheckpointProcessUnlock "$SUP") - before)) unlocks in the resume, not 1"
[ ! -e "$CUSNAP_RUNTIME_BASE/$NAME/left-suspended" ] || fail "the recovery left the marker behind"
expect_running "$NAME" "$PID" "$LOG"
op inspect "$NAME" --json
python3 -c 'import json,sys; sys.exit("left_suspended" in json.load(open(sys.argv[1])))' "$T/op.out" ||
  fail "inspect still shows the job left suspended"
pass "the supervisor killed during the resume: the guardian brought the job back and supervises it"

# ---- the job under its guardian: checkpoint (stops it), restore, counts on.
# (The guardian's log goes with the job's runtime directory once it stops:
# the count before the checkpoint is the floor.)
before=$(last_count "$LOG")
op checkpoint "$NAME" -o "$T/second.ckpt"
[ "$RC" = 0 ] || fail "a checkpoint through the guardian exited $RC"
wait_gone "$PID" 20
restore_bg "$T/second.ckpt" "$T/restored.out"
wait_count "$T/restored.out" $((before + 4))
first=$(first_count "$T/restored.out")
[ "$first" -gt "$before" ] || fail "the restored job began at $first, not after $before"
grep -q "pattern mismatch" "$T/restored.out" && fail "the restored job found a wrong byte"
kill -TERM "$LAST_SUPERVISOR"
wait_exit "$LAST_SUPERVISOR"
wait_gone "$PID" 20
pass "checkpointed through the guardian and restored: it counts on from where it stopped"
echo PASS
