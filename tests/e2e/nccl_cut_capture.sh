#!/usr/bin/env bash
# A checkpoint of collective ranks that record CUDA graphs while they run
# (docs/design.md "Stream captures"), on the simulated driver with two
# devices: cusnap-collective-pair --capture-ms C has each rank, after every
# step, keep a stream capture (global mode) under way for C ms. Draining a
# process's device work synchronizes its device, which would invalidate the
# capture (and the job's graph with it), so the shim refuses the drain while
# one is under way; the coordinator opens the gates again, keeping the cut,
# and tries again until --timeout.
#  - A capture longer than --timeout: the checkpoint fails, says why and how
#    often it tried, and the job runs on with every capture intact (a capture
#    invalidated under the job would end its cuStreamEndCapture with an error,
#    and the job with it).
#  - Captures of 200 ms: the checkpoint waits for one to end (the report's
#    capture_retries), the ranks stay at one count at the cut, and after
#    checkpoint, kill and restore both continue at exactly the next step.
#    Each rank also replaces an allocation after every capture
#    (--churn), so what its shim tracks changes while the gates are open
#    between tries: what is saved must be what stands at the final cut.
#  - A suspend goes through the same quiesce: it waits for a capture too,
#    reports the cut and its retries, holds both ranks, and after resume
#    both count on with every capture intact.
source "$(dirname "$0")/lib_shared.sh"
collective_pair_setup 2 || exit 77

# 1. Captures longer than the timeout.
LAUNCH_OUT=$T/long.out
start_job long "$LAUNCH_OUT" "$PAIR" --print-every 1 --capture-ms 1500
fresh_step "$LAUNCH_OUT" 30
rc=0
"$CUSNAP" checkpoint long -o "$T/ck-long" --timeout 1 --leave-running >"$T/long-ckpt.out" 2>&1 || rc=$?
[ "$rc" != 0 ] || fail "a checkpoint during a capture longer than --timeout succeeded: $(cat "$T/long-ckpt.out")"
grep -q "stream capture" "$T/long-ckpt.out" || fail "the error does not name the capture: $(cat "$T/long-ckpt.out")"
grep -qE "tried [0-9]+ times? within the timeout" "$T/long-ckpt.out" ||
  fail "the error does not say how often it tried: $(cat "$T/long-ckpt.out")"
grep -q "runs on unchanged" "$T/long-ckpt.out" || fail "no rollback reported: $(cat "$T/long-ckpt.out")"
[ ! -e "$T/ck-long/manifest.json" ] || fail "a failed checkpoint left a manifest"
counts_advance "$LAUNCH_OUT"
no_errors "$LAUNCH_OUT"
pass "a capture outlasting --timeout: $(grep -oE 'tried [0-9]+ times?' "$T/long-ckpt.out"); rolled back, every capture of the job ended well"
stop_job "$LAUNCH_OUT"

# 2. Short captures: the checkpoint waits for one to end.
LAUNCH_OUT=$T/short.out
start_job short "$LAUNCH_OUT" "$PAIR" --print-every 1 --capture-ms 200 --churn
retried=0
for try in 1 2 3; do
  fresh_step "$LAUNCH_OUT" 30
  "$CUSNAP" checkpoint short -o "$T/ck-short$try" --leave-running --json >"$T/short$try.json" 2>"$T/short$try.err" ||
    fail "checkpoint during short captures failed: $(cat "$T/short$try.err")"
  retried=$(cut_even "$T/short$try.json") || fail "bad report: $(cat "$T/short$try.json")"
  [ "$retried" -gt 0 ] && break
  echo "   try $try: no capture was under way when the gates closed"
done
[ "$retried" -gt 0 ] || fail "three checkpoints never met a capture under way (a rank records 200 ms of every step)"
counts_advance "$LAUNCH_OUT"
no_errors "$LAUNCH_OUT"
pass "--leave-running checkpoint waited for a capture ($retried retries); the ranks stayed at one count; both count on"

# 3. A suspend during short captures waits the same way.
retried=0
for try in 1 2 3; do
  fresh_step "$LAUNCH_OUT" 30
  "$CUSNAP" suspend short --json >"$T/susp$try.json" 2>"$T/susp$try.err" ||
    fail "suspend during short captures failed: $(cat "$T/susp$try.err")"
  grep -q '"ok": true' "$T/susp$try.json" && grep -q '"state": "suspended"' "$T/susp$try.json" &&
    retried=$(cut_even "$T/susp$try.json") || fail "bad suspend report: $(cat "$T/susp$try.json")"
  counts_held "$LAUNCH_OUT" 1
  "$CUSNAP" resume short >"$T/resume$try.out" 2>&1 || fail "resume failed: $(cat "$T/resume$try.out")"
  counts_advance "$LAUNCH_OUT"
  [ "$retried" -gt 0 ] && break
  echo "   try $try: no capture was under way when the gates closed"
done
[ "$retried" -gt 0 ] || fail "three suspends never met a capture under way"
no_errors "$LAUNCH_OUT"
"$CUSNAP" suspend short >"$T/susp-text.out" 2>&1 || fail "suspend failed: $(cat "$T/susp-text.out")"
grep -qE "^collective cut: process [0-9]+ at [0-9]+, process [0-9]+ at [0-9]+ collective launches" "$T/susp-text.out" ||
  fail "the suspend summary does not give the cut: $(cat "$T/susp-text.out")"
"$CUSNAP" resume short >"$T/resume-text.out" 2>&1 || fail "resume failed: $(cat "$T/resume-text.out")"
counts_advance "$LAUNCH_OUT"
no_errors "$LAUNCH_OUT"
pass "suspend waited for a capture ($retried retries), held both ranks at one cut; resumed, both count on"
checkpoint_restore_cycle short
stop_job "$T/restore-short.out"
echo "PASS"
