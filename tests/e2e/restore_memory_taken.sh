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
#              restore it again, and what to do; a second resume fails the
#              same way (304), the job still shown suspended
#   roll back  a checkpoint whose dump fails: the roll back's restore is
#              refused; it is not tried three times, and the job is left
#              suspended (exit 6); its resume says the job cannot come back
#   leftover   a job left suspended for another reason whose resume is then
#              refused for memory: inspect says so from then on
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

# ---- resume with the memory taken
start resume
op suspend resume
[ "$RC" = 0 ] || fail "suspend exited $RC"
take_memory
op resume resume
[ "$RC" = 1 ] || fail "resume exited $RC, expected 1"
said "cuCheckpointProcessRestore of process $PID failed: CUDA_ERROR_OUT_OF_MEMORY (2)" resume
said "the GPU lacks the free memory to restore it" resume
said "the driver will not restore its GPU state: stop it (SIGTERM to its supervisor, process $SUP) and restore an earlier checkpoint of resume" resume
held resume
op resume resume
[ "$RC" = 1 ] || fail "the second resume exited $RC, expected 1"
said "CUDA_ERROR_OPERATING_SYSTEM (304) (as the driver answers" "the second resume"
said "the driver will not restore its GPU state: stop it" "the second resume"
held resume
term_job
pass "resume: refused for memory, then 304; the job said to be lost, shown suspended"

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
op inspect rollback
said "left suspended by a failed checkpoint at " inspect
said "next:      the driver will not restore its GPU state: stop the job" inspect
op inspect rollback --json
python3 -c '
import json, sys
left = json.load(open(sys.argv[1]))["left_suspended"]
assert left["operation"] == "checkpoint" and left["restore_refused"] is True, left
assert "CRIU dump phase" in left["reason"] and "OUT_OF_MEMORY" in left["reason"], left
' "$T/op.out" || fail "inspect --json: $(cat "$T/op.out")"
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
[ "$RC" = 1 ] || fail "resume exited $RC, expected 1"
said "CUDA_ERROR_OUT_OF_MEMORY (2)" resume
said "the driver will not restore its GPU state: stop it" resume
op inspect leftover
said "next:      the driver will not restore its GPU state: stop the job" inspect
said "because:   .*CRIU dump phase" inspect
term_job
pass "left suspended, then a resume refused for memory: inspect says the job cannot come back"
echo PASS
