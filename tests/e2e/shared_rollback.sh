#!/usr/bin/env bash
# Failures of a checkpoint of a job that shares device memory (cusnap-share-job:
# a creator and its importer), one phase at a time; every one must roll back:
# cusnap exits 1 naming the process and the phase, writes no manifest, and the
# job runs on with both processes counting, every byte right and each seeing
# the other's writes in the shared bytes. A later checkpoint of the same job
# succeeds and restores.
#   save      the creator's shim fails its first bulk copy (before any release)
#   release   the importer's shim fails its first cuMemUnmap (half released)
#   driver    the coordinator's driver checkpoint fails after the release
#   criu      CRIU's dump fails after the driver checkpoint
#   orphan    the supervisor is killed after the release: its guardian brings
#             the job back
source "$(dirname "$0")/lib_shared.sh"
fake_only "fault injection (FAKECUDA_FAIL)" || exit 77

PREFIXES=("" "importer ")

# run_case NAME SUPERVISOR_ENV JOB_ENV EXPECT: launches the job (the
# supervisor with SUPERVISOR_ENV, the job with JOB_ENV), checkpoints it
# expecting a roll back whose message matches EXPECT, checks the job, then
# checkpoints again (success) and restores.
run_case() {
  local name=$1 sup_env=$2 job_env=$3 expect=$4 rc=0 k p before
  LAUNCH_OUT=$T/$name.out
  env $sup_env "$CUSNAP" launch --name "$name" -- \
    env -u FAKECUDA_FAIL $job_env "$SHARE_JOB" --mib 4 --interval-ms 20 >"$LAUNCH_OUT" 2>&1 &
  SUPERVISORS+=($!)
  SUP=$!
  for p in "${PREFIXES[@]}"; do wait_count "$LAUNCH_OUT" 5 "$p" 30; done
  PID=$(wait_job "$name")
  ready_pids "$LAUNCH_OUT" >>"$T/job-pids"
  "$CUSNAP" checkpoint "$name" -o "$T/$name.ckpt" >"$T/$name.ckpt.out" 2>&1 || rc=$?
  [ "$rc" = 1 ] || fail "$name: checkpoint exited $rc, expected 1 (rolled back): $(cat "$T/$name.ckpt.out")"
  grep -qE "$expect" "$T/$name.ckpt.out" ||
    fail "$name: the error does not match '$expect': $(cat "$T/$name.ckpt.out")"
  grep -q "the job runs on unchanged" "$T/$name.ckpt.out" ||
    fail "$name: the error does not say the job runs on: $(cat "$T/$name.ckpt.out")"
  [ ! -e "$T/$name.ckpt/manifest.json" ] || fail "$name: a failed checkpoint left a manifest"
  for k in "${!PREFIXES[@]}"; do
    p=${PREFIXES[k]}
    before=$(last_count "$LAUNCH_OUT" "$p")
    wait_count "$LAUNCH_OUT" $((before + 3)) "$p" 30
    wait_seen "$LAUNCH_OUT" "$p" "$(last_seen "$LAUNCH_OUT" "$p")"
  done
  for p in $(ready_pids "$LAUNCH_OUT"); do
    kill -0 "$p" 2>/dev/null || fail "$name: process $p died after the roll back"
  done
  no_errors "$LAUNCH_OUT"
  pass "$name: rolled back ($(grep -m1 '^cusnap: ' "$T/$name.ckpt.out" | cut -c1-150))"

  # The fault fired once: the next checkpoint goes through and restores.
  rm -rf "$T/$name.ckpt"
  checkpoint_stop "$name" "$T/$name.ckpt" "$LAUNCH_OUT"
  restore_bg "$T/$name.ckpt" "$T/$name.restore.out"
  SUP=$LAST_SUPERVISOR
  expect_continued "$T/$name.restore.out" 1
  pass "$name: a later checkpoint restored"
  stop_job "$LAUNCH_OUT"
}

run_case save "" "FAKECUDA_FAIL=cuMemcpyDtoHAsync:1:2" \
  "save phase: process [0-9]+, shim request 'save': allocation [0-9]+: cuMemcpyDtoHAsync failed"
run_case release "" "FAKECUDA_FAIL=cuMemUnmap:1:1" \
  "release phase \(imported memory\): process [0-9]+, shim request 'release'.*cuMemUnmap failed"
run_case driver "FAKECUDA_FAIL=cuCheckpointProcessCheckpoint:1:999" "" \
  "driver checkpoint phase: cuCheckpointProcessCheckpoint of process [0-9]+ failed"

# CRIU: a stand-in that fails its first dump and passes everything else
# through to the real one.
REAL_CRIU=$(PATH=$PATH:/usr/local/sbin:/usr/sbin command -v criu)
printf '#!/bin/sh\nif [ "$1" = dump ] && [ ! -e "%s" ]; then\n  : >"%s"\n  echo "injected dump failure" >&2\n  exit 1\nfi\nexec "%s" "$@"\n' \
  "$T/criu-failed" "$T/criu-failed" "$REAL_CRIU" >"$T/criu-fail"
chmod 755 "$T/criu-fail"
run_case criu "CUSNAP_CRIU=$T/criu-fail" "" "CRIU dump phase"

# The supervisor killed after the release, while the driver checkpoint runs:
# its guardian restores the driver state, rebuilds the shared memory from the
# saved bytes and opens the gates; both processes count on (in the job's log)
# and see each other's writes again.
LAUNCH_OUT=$T/orphan.out
slow_driver_checkpoint_job orphan "$LAUNCH_OUT"
"$CUSNAP" checkpoint orphan -o "$T/orphan.ckpt" >"$T/orphan.ckpt.out" 2>&1 &
CK=$!
# Killed once the driver checkpoint has begun: the save and release are done.
wait_driver_checkpoint "$LAUNCH_OUT" "$CK"
kill -KILL "$SUP"
wait "$CK" 2>/dev/null && fail "the checkpoint reported success after its supervisor was killed"
LOG=$CUSNAP_RUNTIME_BASE/orphan/output.log
for _ in $(seq 1 200); do grep -q "guardian: the job runs on" "$LOG" 2>/dev/null && break; sleep 0.05; done
grep -q "guardian: the job runs on, supervised by process" "$LOG" ||
  fail "the guardian did not bring the job back: $(grep 'cusnap:' "$LOG" 2>/dev/null)"
grep -q "guardian: shared memory of 2 process(es): rebuilt" "$LOG" ||
  fail "the guardian did not rebuild the shared memory: $(grep 'cusnap:' "$LOG")"
for p in "${PREFIXES[@]}"; do
  n=$(last_count "$LOG" "$p")
  wait_count "$LOG" $((n + 3)) "$p" 30
  wait_seen "$LOG" "$p" "$(last_seen "$LOG" "$p")"
done
no_errors "$LOG"
[ -z "$(ls -A "$T/orphan.ckpt" 2>/dev/null)" ] || fail "the unfinished checkpoint was left behind"
pass "supervisor killed after the release: the guardian rebuilt the shared memory ($(grep -c 'cusnap: guardian' "$LOG") lines in the log)"
# The guardian supervises the job now: a later checkpoint works and restores.
rm -rf "$T/orphan.ckpt"
GUARD=$(job_field orphan supervisor_pid)
[ -n "$GUARD" ] && [ "$GUARD" != "$SUP" ] || fail "cusnap ps does not show the guardian supervising the job"
"$CUSNAP" checkpoint orphan -o "$T/orphan.ckpt2" >"$T/orphan.ckpt2.out" 2>&1 ||
  fail "a checkpoint after the guardian took over failed: $(cat "$T/orphan.ckpt2.out")"
for p in $(ready_pids "$LAUNCH_OUT"); do wait_gone "$p" 20; done
wait_gone "$GUARD" 20
restore_bg "$T/orphan.ckpt2" "$T/orphan.restore.out"
for p in "${PREFIXES[@]}"; do wait_count "$T/orphan.restore.out" 3 "$p" 30; done
for p in "${PREFIXES[@]}"; do wait_seen "$T/orphan.restore.out" "$p" 0; done
no_errors "$T/orphan.restore.out"
pass "the guardian-supervised job was checkpointed again and restored"
for p in $(ready_pids "$LAUNCH_OUT"); do kill -KILL "$p" 2>/dev/null; done
echo "PASS"
