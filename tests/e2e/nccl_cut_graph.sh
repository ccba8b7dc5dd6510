#!/usr/bin/env bash
# The cut across collective ranks whose collectives run from CUDA graphs
# (docs/design.md "Cut across collective ranks"), on the simulated driver with
# two devices: cusnap-collective-pair --graph 3 captures three handshake
# kernels (collectives: neither rank's completes until the other's began) into
# a graph per rank and launches the graph every step, as a job that replays
# NCCL collectives from CUDA graphs does.
#  - Negative control: with the shim's collective counting off
#    (CUSNAP_COLLECTIVE_KERNELS names no kernel) and rank 0 lagging, a rank
#    waits in a graph's collective when the gates close: the checkpoint cannot
#    drain and rolls back (the job runs on).
#  - With the cut: the ranks are lined up at one count of collectives, a
#    multiple of the graph's three (each graph launch counts its three nodes,
#    the capture nothing); checkpoint, kill, restore, exactly on. Three cycles
#    with no sleep between steps, then restored onto the other GPUs with
#    --device-map 0=1,1=0.
source "$(dirname "$0")/lib_shared.sh"
collective_pair_setup 2 || exit 77

# 1. Negative control.
LAUNCH_OUT=$T/neg.out
CUSNAP_COLLECTIVE_KERNELS=no-such-kernel start_job neg "$LAUNCH_OUT" "$PAIR" --graph 3 --print-every 1 --lag-ms 30
drain_rolls_back neg
counts_advance "$LAUNCH_OUT"
no_errors "$LAUNCH_OUT"
pass "without the cut: the drain cannot finish (a rank waits in a graph's collective); rolled back, the job runs on"
stop_job "$LAUNCH_OUT"

# cut_at JSON OUT: the checkpoint's collective_cut has both ranks at one
# count T, a multiple of 3, and T/3 is the step each rank had last reported
# in OUT, or the next (launched and cut before its check printed).
cut_at() {
  python3 - "$1" "$2" <<'PY' || fail "the ranks were not lined up at one count of graph collectives: $(cat "$1")"
import json, re, sys
cut = json.load(open(sys.argv[1]))["collective_cut"]
assert len(cut) == 2 and len(set(cut.values())) == 1, cut
t = next(iter(cut.values()))
assert t > 0 and t % 3 == 0, ("not a multiple of the graph's 3 collectives", t)
last = {}
for line in open(sys.argv[2], errors="replace"):
    m = re.match(r"rank (\d) count (\d+) ok", line)
    if m:
        last[m.group(1)] = int(m.group(2))
assert len(last) == 2, last
for r, n in last.items():
    assert t // 3 in (n, n + 1), ("rank", r, "reported step", n, "cut at", t)
print(f"   cut at {t} collectives (step {t // 3}); last steps reported {last}")
PY
}

# 2. With the cut, rank 0 lagging: --leave-running, then checkpoint and stop.
LAUNCH_OUT=$T/lag.out
start_job lag "$LAUNCH_OUT" "$PAIR" --graph 3 --print-every 1 --lag-ms 30
"$CUSNAP" checkpoint lag -o "$T/ck-lag-lr" --leave-running --json >"$T/lag-lr.json" 2>"$T/lag-lr.err" ||
  fail "--leave-running checkpoint with the cut failed: $(cat "$T/lag-lr.err")"
python3 - "$T/lag-lr.json" <<'PY' || fail "bad cut: $(cat "$T/lag-lr.json")"
import json, sys
cut = json.load(open(sys.argv[1]))["collective_cut"]
assert len(cut) == 2 and len(set(cut.values())) == 1 and min(cut.values()) % 3 == 0 and min(cut.values()) > 0, cut
PY
counts_advance "$LAUNCH_OUT"
pass "with the cut: --leave-running checkpoint of graph collectives; both ranks count on"
pids=$(ready_pids "$LAUNCH_OUT")
"$CUSNAP" checkpoint lag -o "$T/ck-lag" --json >"$T/lag.json" 2>"$T/lag.err" ||
  fail "checkpoint with the cut failed: $(cat "$T/lag.err")"
wait_exit "$SUP"
for p in $pids; do wait_gone "$p" 20; done
cut_at "$T/lag.json" "$LAUNCH_OUT"
note_last "$LAUNCH_OUT"
restore_bg "$T/ck-lag" "$T/restore-lag.out"
SUP=$LAST_SUPERVISOR
expect_continued "$T/restore-lag.out" 1
pass "checkpointed at the cut, killed, restored: both ranks continue at exactly the next step"
stop_job "$T/restore-lag.out"

# 3. No sleep between steps: three cycles, then other GPUs.
fast_cycles_then_moved 3 --graph 3 --print-every 1
echo "PASS"
