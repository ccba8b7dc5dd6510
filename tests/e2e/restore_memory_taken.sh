#!/usr/bin/env bash
# The GPU's memory taken while a job's GPU state was out of it: the driver's
# restore fails CUDA_ERROR_OUT_OF_MEMORY and, as measured on an H200 (driver
# 580.159.04, tests/gpu/probe_restore_full.sh, docs/gpu-runs/
# restore-full-h200.log), never restores that process afterwards (every
# later restore fails CUDA_ERROR_OPERATING_SYSTEM). The simulated driver
# mirrors it through its restore_memory fault point, armed in the job
# (FAKECUDA_FAIL_FILE) at the moment the memory is "taken".
#   resume     a suspended job: the resume fails (exit 1) naming the call,
#              saying the GPU lacks the memory and that the driver will not
#              restore it again, and what to do; from then on ps shows it
#              suspended!, inspect says why, a checkpoint is refused
#              saying it cannot come back; a second resume fails the same
#              way (304), the job still shown suspended
#   roll back  a checkpoint whose dump fails: the roll back's restore is
#              refused; it is not tried three times, and the job is left
#              suspended (exit 6); its resume says the job cannot come back
#   leftover   a job left suspended for another reason whose resume is then
#              refused for memory: inspect says so from then on
#   guardian   the supervisor killed (SIGKILL) during a checkpoint, after the
#              driver checkpoint: its guardian's restore is refused for
#              memory; the guardian leaves the job suspended, marked so, and
#              does not send the user to cusnap resume; inspect and ps say
#              it cannot come back; the resume, through the guardian, too
#   failed     a checkpoint whose dump fails and whose roll back's restore
#              fails otherwise (CUDA_ERROR_UNKNOWN): the driver marks the
#              process FAILED; the job is left suspended (exit 6) and marked
#              as never coming back, not taken as running on
source "$(dirname "$0")/lib_checkpoint.sh"
fake_only "the simulated driver's restore_memory fault point" || exit 77

# start NAME [SUPERVISOR-ENV...]: a pattern job whose driver calls fail as
# $T/job.<pid> says when it is written. Sets SUP, PID, OUT.
start() {
  local name=$1
  shift
  OUT=$T/$name.out
  env "$@" "$CUSNAP" launch --name "$name" -- \
    env FAKECUDA_FAIL_FILE="$T/job.%p" "$PATTERN_JOB" --mib 4 --interval-ms 20 >"$OUT" 2>&1 &
  SUPERVISORS+=($!)
  SUP=$!
  wait_count "$OUT" 3
  PID=$(wait_job "$name")
}
# take_memory: the job's next restore finds no device memory.
take_memory() { echo "restore_memory:1:2" >"$T/job.$PID"; }
held() { expect_held "$1" "$OUT"; }
# inspect_refused NAME OPERATION TEXT...: inspect shows job NAME left suspended
# by a failed OPERATION whose restore the driver refused, each TEXT in the
# reason (text and --json).
inspect_refused() {
  local name=$1 operation=$2
  shift 2
  op inspect "$name"
  said "left suspended by a failed $operation at " inspect
  said "next:      the driver will not restore its GPU state: stop the job" inspect
  op inspect "$name" --json
  python3 -c '
import json, sys
left = json.load(open(sys.argv[1]))["left_suspended"]
assert left["operation"] == sys.argv[2] and left["restore_refused"] is True, left
assert all(t in left["reason"] for t in sys.argv[3:]), left
' "$T/op.out" "$operation" "$@" || fail "inspect --json: $(cat "$T/op.out")"
}

# ---- resume with the memory taken
start resume
op suspend resume
[ "$RC" = 0 ] || fail "suspend exited $RC"
take_memory
op resume resume
[ "$RC" = 6 ] || fail "resume exited $RC, expected 6 (the job cannot come back)"
said "cuCheckpointProcessRestore of process $PID failed: CUDA_ERROR_OUT_OF_MEMORY (2)" resume
said "the GPU lacks the free memory to restore it" resume
said "the driver will not restore its GPU state: stop it (SIGTERM to its supervisor, process $SUP) and restore an earlier checkpoint of resume" resume
held resume
inspect_refused resume resume OUT_OF_MEMORY
op ps
said "^resume .* suspended! " ps
op checkpoint resume -o "$T/resume.ckpt"
[ "$RC" = 3 ] || fail "the checkpoint of the lost job exited $RC, expected 3"
said "cannot be checkpointed: the driver refused to restore its GPU state after a failed resume, and will not restore it again: stop it (SIGTERM to its supervisor, process $SUP)" checkpoint
op resume resume
[ "$RC" = 1 ] || fail "the second resume exited $RC, expected 1"
said "CUDA_ERROR_OPERATING_SYSTEM (304) (as the driver answers" "the second resume"
said "the driver will not restore its GPU state: stop it" "the second resume"
held resume
term_job
pass "resume: refused for memory, then 304; the job said to be lost, shown suspended! (inspect says why; a checkpoint refused)"

# ---- a roll back with the memory taken
REAL_CRIU=$(PATH=$PATH:/usr/local/sbin:/usr/sbin command -v criu)
printf '#!/bin/sh\n[ "$1" = dump ] && { echo "injected dump failure" >&2; exit 1; }\nexec "%s" "$@"\n' \
  "$REAL_CRIU" >"$T/criu-fail"
chmod 755 "$T/criu-fail"
start rollback CUSNAP_CRIU="$T/criu-fail"
take_memory
op checkpoint rollback -o "$T/rollback.ckpt"
[ "$RC" = 6 ] || fail "checkpoint exited $RC, expected 6"
said "CRIU dump phase" checkpoint
said "CUDA_ERROR_OUT_OF_MEMORY (2) (the GPU lacks the free memory" checkpoint
said "the job is left suspended" checkpoint
grep -q "then:\|tries)" "$T/op.out" && fail "the roll back tried the refused restore again: $(cat "$T/op.out")"
held rollback
inspect_refused rollback checkpoint "CRIU dump phase" OUT_OF_MEMORY
op resume rollback
[ "$RC" = 1 ] || fail "resume exited $RC, expected 1"
said "CUDA_ERROR_OPERATING_SYSTEM (304)" resume
said "the driver will not restore its GPU state: stop it (SIGTERM to its supervisor, process $SUP)" resume
held rollback
term_job
pass "roll back: refused for memory, tried once, left suspended (inspect says why); the resume says the job cannot come back"

# ---- left suspended for another reason (every restore of the roll back
# fails), then the resume's restore refused for memory: from then on
# inspect says the job cannot come back, no longer to resume it
start leftover CUSNAP_CRIU="$T/criu-fail" FAKECUDA_FAIL_FILE="$T/sup.%p"
printf '%s\n' "cuCheckpointProcessRestore:1:999,cuCheckpointProcessRestore:2:999,cuCheckpointProcessRestore:3:999" >"$T/sup.$SUP"
op checkpoint leftover -o "$T/leftover.ckpt"
[ "$RC" = 6 ] || fail "checkpoint exited $RC, expected 6"
said "run cusnap resume leftover to bring it back" checkpoint
op inspect leftover
said "next:      cusnap resume leftover brings it back" inspect
take_memory
op resume leftover
[ "$RC" = 6 ] || fail "resume exited $RC, expected 6 (the job cannot come back)"
said "CUDA_ERROR_OUT_OF_MEMORY (2)" resume
said "the driver will not restore its GPU state: stop it" resume
op inspect leftover
said "next:      the driver will not restore its GPU state: stop the job" inspect
said "because:   .*CRIU dump phase" inspect
op ps
said "^leftover .* suspended! " ps
term_job
pass "left suspended, then a resume refused for memory: inspect says the job cannot come back"

# ---- the guardian's recovery refused for memory. The dump (a CRIU that
# notes its pid and waits) begins once every driver checkpoint is done: the
# supervisor is killed there, the memory taken first.
printf '#!/bin/sh\n[ "$1" = dump ] && { echo $$ >"%s"; exec sleep 60; }\nexec "%s" "$@"\n' \
  "$T/dump.pid" "$REAL_CRIU" >"$T/criu-slow"
chmod 755 "$T/criu-slow"
start guardian CUSNAP_CRIU="$T/criu-slow"
"$CUSNAP" checkpoint guardian -o "$T/guardian.ckpt" >"$T/guardian-ck.out" 2>&1 &
CK=$!
for _ in $(seq 1 1200); do [ -s "$T/dump.pid" ] && break; sleep 0.05; done
[ -s "$T/dump.pid" ] || fail "the checkpoint never reached its dump: $(cat "$T/guardian-ck.out")"
cat "$T/dump.pid" >>"$T/job-pids"
[ "$(cuda_states guardian)" = checkpointed ] || fail "at the dump the job's GPU state is $(cuda_states guardian)"
take_memory
kill -KILL "$SUP"
wait_exit "$SUP" 2>/dev/null
kill -KILL "$(cat "$T/dump.pid")" 2>/dev/null
RC=0
wait "$CK" || RC=$?
[ "$RC" != 0 ] || fail "the checkpoint succeeded though its supervisor was killed"
wait_guardian guardian "$SUP" suspended
LOG=$CUSNAP_RUNTIME_BASE/guardian/output.log
for _ in $(seq 1 100); do grep -q "cusnap: guardian: the job cannot be brought back" "$LOG" && break; sleep 0.05; done
grep -q "cusnap: guardian: the job cannot be brought back; it is left suspended, supervised by process $GUARD (cusnap inspect guardian says why)" "$LOG" ||
  fail "the guardian's log does not say the job cannot come back: $(grep cusnap: "$LOG")"
grep -q "CUDA_ERROR_OUT_OF_MEMORY" "$LOG" || fail "the guardian's log does not name the refusal: $(grep cusnap: "$LOG")"
grep -q "cusnap: guardian:.*run cusnap resume" "$LOG" &&
  fail "the guardian sends the user to cusnap resume: $(grep cusnap: "$LOG")"
SUP=$GUARD
held guardian
inspect_refused guardian recovery OUT_OF_MEMORY
op ps
said "^guardian .* suspended! " ps
said "^! left suspended, the driver refusing to restore its GPU state (guardian): cusnap inspect JOB says why; stop the job" ps
grep -q "^\* " "$T/op.out" && fail "ps sends the user to cusnap resume: $(cat "$T/op.out")"
"$CUSNAP" ps --json | python3 -c '
import json, sys
j = [j for j in json.load(sys.stdin) if j["name"] == "guardian"][0]
assert j["left_suspended"] is True and j["restore_refused"] is True, j
' || fail "ps --json does not say the restore was refused"
op resume guardian
[ "$RC" = 1 ] || fail "resume exited $RC, expected 1"
said "CUDA_ERROR_OPERATING_SYSTEM (304)" resume
said "the driver will not restore its GPU state: stop it (SIGTERM to its supervisor, process $GUARD)" resume
held guardian
term_job
pass "the supervisor killed during a checkpoint, the guardian's restore refused for memory: left suspended, marked so; inspect, ps and resume say it cannot come back"

# ---- a roll back whose restore fails otherwise: the driver marks the process
# FAILED, which nothing brings back. Before: the next pass took FAILED as
# back, the checkpoint exited 1 saying the job runs on unchanged, recorded
# running, its process stopped for good.
start failed CUSNAP_CRIU="$T/criu-fail"
echo "restore_memory:1:999" >"$T/job.$PID"
op checkpoint failed -o "$T/failed.ckpt"
[ "$RC" = 6 ] || fail "checkpoint exited $RC, expected 6"
said "CRIU dump phase" checkpoint
said "cuCheckpointProcessRestore of process $PID failed: CUDA_ERROR_UNKNOWN (999)" checkpoint
said "process $PID: the driver reports its GPU state failed" checkpoint
said "the job is left suspended" checkpoint
grep -q "runs on unchanged" "$T/op.out" && fail "the checkpoint says the job runs on: $(cat "$T/op.out")"
# held_failed: recorded suspended, its GPU state failed, counting no more.
held_failed() {
  [ "$(job_field failed state)" = suspended ] || fail "failed shows $(job_field failed state)"
  [ "$(cuda_states failed)" = failed ] || fail "the job's GPU state is $(cuda_states failed)"
  local n
  n=$(last_count "$OUT")
  sleep 0.3
  [ "$(last_count "$OUT")" = "$n" ] || fail "failed counted on"
}
held_failed
inspect_refused failed checkpoint "CRIU dump phase" "GPU state failed"
op ps
said "^failed .* suspended! " ps
op resume failed
[ "$RC" = 1 ] || fail "resume exited $RC, expected 1"
said "process $PID: the driver reports its GPU state failed" resume
said "the driver will not restore its GPU state: stop it (SIGTERM to its supervisor, process $SUP)" resume
held_failed
term_job
pass "roll back: a restore that leaves the process FAILED: left suspended (exit 6), marked as never coming back; resume says so"
echo PASS
