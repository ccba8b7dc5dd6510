#!/usr/bin/env bash
# The cut when ranks queue several collectives before they wait, as a
# data-parallel training step queues its all-reduces on NCCL's stream
# (docs/design.md "Cut across collective ranks"), on the simulated driver
# with two devices: cusnap-collective-pair --depth 8 launches eight handshake
# kernels a step, then synchronizes, so one rank may be up to eight
# collectives ahead of the other when the cut is armed, and the one behind
# launches several to reach the common count. Rank 0 lags 5 ms a step, so
# rank 1 is usually ahead; a 3 ms gap between the launches of a step makes a
# cut often find a rank in the middle of them (its held launch, and the
# common count, inside a step).
#  - Negative control: with counting off, the drain cannot finish (a rank
#    waits in a collective its held peer never launches); rolled back.
#  - --leave-running checkpoints until one cut lands inside a step (a count
#    not a multiple of eight; at most thirty tries: on a quiet machine most
#    land there, on a loaded one, which arms one rank after the other, about
#    one in three): both ranks at one count each time, the job counting on.
#  - Checkpoint, kill, restore: exactly on, every byte checked; then three
#    cycles with no sleep between steps.
source "$(dirname "$0")/lib_shared.sh"
collective_pair_setup 2 || exit 77
DEPTH=8

# 1. Negative control.
LAUNCH_OUT=$T/neg.out
CUSNAP_COLLECTIVE_KERNELS=no-such-kernel start_job neg "$LAUNCH_OUT" "$PAIR" --print-every 1 \
  --depth "$DEPTH" --lag-ms 30
drain_rolls_back neg
counts_advance "$LAUNCH_OUT"
no_errors "$LAUNCH_OUT"
pass "without the cut: the drain cannot finish; rolled back, the job runs on"
stop_job "$LAUNCH_OUT"

# 2. With the cut.
LAUNCH_OUT=$T/depth.out
start_job depth "$LAUNCH_OUT" "$PAIR" --print-every 1 --depth "$DEPTH" --lag-ms 5 --gap-us 3000
inside=0
for i in $(seq 1 30); do
  "$CUSNAP" checkpoint depth -o "$T/ck-lr$i" --leave-running --json >"$T/lr$i.json" 2>"$T/lr$i.err" ||
    fail "--leave-running checkpoint $i with ranks $DEPTH collectives deep failed: $(cat "$T/lr$i.err")"
  cut_even "$T/lr$i.json" >/dev/null || fail "checkpoint $i: the ranks not at one count: $(cat "$T/lr$i.json")"
  at=$(python3 -c 'import json,sys; print(list(json.load(open(sys.argv[1]))["collective_cut"].values())[0])' "$T/lr$i.json")
  echo "   checkpoint $i: both ranks at collective $at (step $((at / DEPTH)), $((at % DEPTH)) into the next)"
  counts_advance "$LAUNCH_OUT"
  [ $((at % DEPTH)) != 0 ] && inside=$((inside + 1)) && break
done
[ "$inside" = 1 ] || fail "thirty cuts, none inside a step: the case this test is for was not met"
no_errors "$LAUNCH_OUT"
pass "$i --leave-running checkpoints, each at one count, the last inside a step; the job counts on"
checkpoint_restore_cycle depth
stop_job "$LAUNCH_OUT"

# 3. No sleep between steps: three checkpoint/kill/restore cycles, then the
# other machine's GPUs.
fast_cycles_then_moved 3 --print-every 1 --depth "$DEPTH"
echo "PASS"
