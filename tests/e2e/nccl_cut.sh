#!/usr/bin/env bash
# The cut across collective ranks (docs/design.md "Cut across collective
# ranks"), on the simulated driver with two devices: cusnap-collective-pair
# runs two ranks that meet in a handshake kernel every step (a collective:
# neither rank's kernel completes until the other launched its own) and
# exchange data through shared allocations.
#  - Negative control: with the shim's collective counting off
#    (CUSNAP_COLLECTIVE_KERNELS names no kernel) and rank 0 lagging, rank 1
#    waits in a collective for rank 0 when the gates close: the checkpoint
#    cannot drain and rolls back (the job runs on).
#  - With the cut, the same job checkpoints and restores, exactly where it
#    stopped; --leave-running too.
#  - A rank that cannot reach the common count within --timeout: the cut
#    rolls back with an error naming the process, the job runs on.
#  - A gate that cannot close in time after a successful cut (a driver call
#    outlasts --timeout): the checkpoint fails and the cut is let go in every
#    process, so both ranks count on at once (not after the shims' hold limit).
#  - Without lag, no sleep between steps: five checkpoint/kill/restore cycles,
#    then restored onto the other machine's GPUs with --device-map 0=1,1=0
#    (each rank's device memory then lies on the other device).
source "$(dirname "$0")/lib_shared.sh"
collective_pair_setup 2 || exit 77

# 1. Negative control.
LAUNCH_OUT=$T/neg.out
CUSNAP_COLLECTIVE_KERNELS=no-such-kernel start_job neg "$LAUNCH_OUT" "$PAIR" --print-every 1 --lag-ms 30
# Rank 1 waits in the collective almost all the time.
drain_rolls_back neg
# Rank 1 is held either inside its collective's synchronize when the gates
# close (the close times out naming that call in flight) or, a moment later,
# in the device work the drain waits for (its handshake kernel waits on rank
# 0, whose thread the gate holds): the error names the one it met.
grep -q "cuStreamSynchronize" "$T/neg-ckpt.out" ||
  grep -q "shim request 'drain': the device work did not finish" "$T/neg-ckpt.out" ||
  fail "the error names neither the call in flight nor the device work: $(cat "$T/neg-ckpt.out")"
counts_advance "$LAUNCH_OUT"
no_errors "$LAUNCH_OUT"
pass "without the cut: the drain cannot finish (rank 1 waits for rank 0 in a collective); rolled back, the job runs on"
stop_job "$LAUNCH_OUT"

# 2. The same job with the cut: checkpoint and stop, restore, exactly on.
LAUNCH_OUT=$T/lag.out
start_job lag "$LAUNCH_OUT" "$PAIR" --print-every 1 --lag-ms 30
"$CUSNAP" checkpoint lag -o "$T/ck-lag-lr" --leave-running --json >"$T/lag-lr.json" 2>"$T/lag-lr.err" ||
  fail "--leave-running checkpoint with the cut failed: $(cat "$T/lag-lr.err")"
cut_even "$T/lag-lr.json" >/dev/null ||
  fail "the checkpoint did not line the ranks up at one count: $(cat "$T/lag-lr.json")"
counts_advance "$LAUNCH_OUT"
pass "with the cut: --leave-running checkpoint; both ranks count on"
checkpoint_restore_cycle lag
stop_job "$LAUNCH_OUT"

# 3. A rank that cannot reach the common count in time.
LAUNCH_OUT=$T/slow.out
start_job slow "$LAUNCH_OUT" "$PAIR" --print-every 1 --lag-ms 4000
# Rank 0 sleeps 4 s after each step; rank 1 launches the next step at once
# and waits in it for rank 0. So right after rank 0 reports a step, rank 1 is
# one collective ahead and the cut cannot be met within --timeout 1. The
# checkpoint starts as soon as a new step is reported; should a loaded
# machine still let the cut land between two steps (both ranks done, rank 1
# not launched yet), --leave-running lets the attempt be made again.
for attempt in 1 2 3; do
  fresh_step "$LAUNCH_OUT" 15
  rc=0
  "$CUSNAP" checkpoint slow -o "$T/ck-slow" --timeout 1 --leave-running >"$T/slow-ckpt.out" 2>&1 || rc=$?
  grep -q "cut phase: the job's processes did not reach a common count" "$T/slow-ckpt.out" && break
  echo "   attempt $attempt: the cut was met (exit $rc: $(head -1 "$T/slow-ckpt.out")); again"
  rm -rf "$T/ck-slow"
done
[ "$rc" != 0 ] || fail "a cut that could not complete in time reported success"
grep -q "cut phase: the job's processes did not reach a common count" "$T/slow-ckpt.out" ||
  fail "three times the cut was met, or the error does not explain it: $(cat "$T/slow-ckpt.out")"
grep -qE "process [0-9]+ at [0-9]+" "$T/slow-ckpt.out" || fail "the error names no process"
[ ! -e "$T/ck-slow/manifest.json" ] || fail "a failed checkpoint left a manifest"
counts_advance "$LAUNCH_OUT"
no_errors "$LAUNCH_OUT"
pass "cut timed out: $(grep -o 'process [0-9]* at [0-9]*' "$T/slow-ckpt.out" | head -1); rolled back, the job runs on"
stop_job "$LAUNCH_OUT"

# 4. The cut is met, then a gate cannot close within --timeout: every step's
# cuMemcpyDtoH takes 3 s in the simulated driver (the job's environment), so
# a rank is still in it when its gate should close. The checkpoint fails and
# must let the cut go everywhere, the gate that never closed included.
LAUNCH_OUT=$T/stall.out
FAKECUDA_DELAY=cuMemcpyDtoH:3000 start_job stall "$LAUNCH_OUT" "$PAIR" --print-every 1
for attempt in 1 2 3; do
  rc=0
  "$CUSNAP" checkpoint stall -o "$T/ck-stall$attempt" --leave-running --timeout 1 >"$T/stall-ckpt.out" 2>&1 || rc=$?
  [ "$rc" != 0 ] && break
  echo "   attempt $attempt: the gates closed between two copies; again"
done
[ "$rc" != 0 ] || fail "three checkpoints closed the gates during 3 s copies with --timeout 1"
grep -q "quiesce phase" "$T/stall-ckpt.out" || fail "unexpected failure: $(cat "$T/stall-ckpt.out")"
grep -q "after the collective cut" "$T/stall-ckpt.out" || fail "the failure came before the cut: $(cat "$T/stall-ckpt.out")"
grep -q "runs on unchanged" "$T/stall-ckpt.out" || fail "no rollback reported: $(cat "$T/stall-ckpt.out")"
# A step takes some 3 s: two more each within 15 s (held at the cut, the
# ranks would stand still until the shims' hold limit, 120 s).
for p in "${PREFIXES[@]}"; do
  wait_count "$LAUNCH_OUT" $(($(last_count "$LAUNCH_OUT" "$p") + 2)) "$p" 15
done
if grep -q "the cut is dropped" "$LAUNCH_OUT"; then fail "a shim had to drop the cut by itself"; fi
no_errors "$LAUNCH_OUT"
pass "a gate close that timed out after the cut: the cut was let go everywhere, both ranks count on"
stop_job "$LAUNCH_OUT"

# 5. No sleep between steps: five cycles, then other GPUs.
fast_cycles_then_moved 5 --print-every 1
echo "PASS"
