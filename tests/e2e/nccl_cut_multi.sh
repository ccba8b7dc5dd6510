#!/usr/bin/env bash
# The cut for a process that drives a collective on several GPUs
# (single-process multi-GPU NCCL; docs/design.md "Cut across collective
# ranks"), on the simulated driver with two devices: cusnap-collective-multi
# launches one handshake kernel on each GPU per step, 20 ms apart; GPU 0's
# kernel completes only once GPU 1's is launched. The cut counts each GPU
# apart, so it never falls between the two launches of a step:
#  - five --leave-running checkpoints in a row succeed, the job counting on
#    after each (counted per process, a cut that landed in the 20 ms gap held
#    GPU 1's launch, GPU 0's kernel could not drain and the checkpoint rolled
#    back);
#  - checkpoint, kill, restore: the job continues at the next step, every
#    byte checked.
source "$(dirname "$0")/lib_shared.sh"
fake_only "the handshake kernel exists in the simulated driver only" || exit 77
export FAKECUDA_DEVICES=2
MULTI=$BIN/cusnap-collective-multi
[ -x "$MULTI" ] || fail "$MULTI is not built"

LAUNCH_OUT=$T/multi.out
start_job multi "$LAUNCH_OUT" "$MULTI" --print-every 1 --gap-ms 20
for i in 1 2 3 4 5; do
  "$CUSNAP" checkpoint multi -o "$T/ck-lr$i" --leave-running --timeout 5 --json \
    >"$T/lr$i.json" 2>"$T/lr$i.err" ||
    fail "--leave-running checkpoint $i of the two-GPU process failed: $(cat "$T/lr$i.err")"
  python3 - "$T/lr$i.json" <<'PY' || fail "checkpoint $i: no count at the cut: $(cat "$T/lr$i.json")"
import json, sys
cut = json.load(open(sys.argv[1]))["collective_cut"]
assert len(cut) == 1 and min(cut.values()) > 0, cut
PY
  counts_advance "$LAUNCH_OUT"
done
no_errors "$LAUNCH_OUT"
pass "five --leave-running checkpoints of a process with a collective on two GPUs; it counts on"
checkpoint_restore_cycle multi
stop_job "$LAUNCH_OUT"
echo "PASS"
