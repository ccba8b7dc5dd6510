#!/usr/bin/env bash
# probe_timeslice.sh: does the GPU still time-slice between two processes
# after the driver restored them? Needs a GPU, root and python3 with torch.
#
#   bash tests/gpu/probe_timeslice.sh
#
# "spin" runs one kernel of about a second after another (torch.cuda._sleep);
# "short" runs small kernels and prints a line every 50. Before a checkpoint
# both make progress (the GPU switches between their contexts inside the
# long kernel). Three cases, each through tests/gpu/probe_driver_cycle.py
# (the bare driver: lock, checkpoint, restore, unlock of both):
#  (a) spin and short; after the restore, 5 s, then spin is killed, 4 s more;
#  (b) two short processes;
#  (c) spin and short, short locked and unlocked first.
# Prints the last line of each process at each point, and the driver's Xid
# lines (dmesg). Measured on an H200 (driver 580.159.04):
# docs/gpu-runs/driver-probes-h200.log.
set -u
cd "$(dirname "$0")/../.."
T=$(mktemp -d /tmp/probe-timeslice.XXXXXX)
cat >"$T/spin.py" <<'PY'
import os, sys, time, torch
role = sys.argv[1]
x = torch.ones(1 << 20, device="cuda")
print(f"{role} ready pid {os.getpid()}", flush=True)
n = 0
while True:
    n += 1
    if role == "spin":
        torch.cuda._sleep(int(1.5e9))  # about one second of spinning
    else:
        x = x * 1.0001
        time.sleep(0.01)
    torch.cuda.synchronize()
    if role == "spin" or n % 50 == 0:
        print(f"{role} count {n} ok", flush=True)
PY
start() { python3 "$T/spin.py" "$1" >"$T/$2" 2>&1 & }
pid_of() { sed -n 's/.*ready pid //p' "$T/$1"; }
wait_line() { for _ in $(seq 1 150); do grep -q "count $2 ok" "$T/$1" && return; sleep 0.2; done; }
cycle() { timeout 90 python3 tests/gpu/probe_driver_cycle.py "$@" | grep -E '^(lock|unlock)'; }
trap 'pkill -9 -f "$T/spin.py"; rm -rf "$T"' EXIT

echo "=== (a) spin + short; after the restore, kill spin"
start spin a; start short b; wait_line a 3; wait_line b 100
echo "before: $(tail -1 "$T/a") | $(tail -1 "$T/b")"
cycle "$(pid_of a),$(pid_of b)" par
sleep 5; echo "5 s after: $(tail -1 "$T/a") | $(tail -1 "$T/b")"
pkill -9 -f "$T/spin.py spin"; sleep 4
echo "4 s after killing spin: $(tail -1 "$T/b")"
pkill -9 -f "$T/spin.py"; sleep 1
echo "=== (b) two short processes"
start short c; start short d; wait_line c 100; wait_line d 100
cycle "$(pid_of c),$(pid_of d)" par
sleep 5; echo "5 s after: $(tail -1 "$T/c") | $(tail -1 "$T/d")"
pkill -9 -f "$T/spin.py"; sleep 1
echo "=== (c) spin + short, short first"
start spin e; start short f; wait_line e 3; wait_line f 100
cycle "$(pid_of f),$(pid_of e)" seq
sleep 5; echo "5 s after: $(tail -1 "$T/e") | $(tail -1 "$T/f")"
dmesg 2>/dev/null | grep -i xid | tail -4
