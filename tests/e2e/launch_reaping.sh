#!/usr/bin/env bash
# The supervisor is the job's child subreaper: orphans of the job become its
# children and are reaped, so no zombie holds a pid.
source "$(dirname "$0")/lib_launch.sh"

# The job's root starts a grandchild and lets its parent exit: the grandchild
# is orphaned and reparents to the supervisor (without the subreaper it would
# go to init, which reaps it too: so the test looks at its parent while it
# still runs). It exits once $SCRATCH/go exists, and the supervisor reaps it.
cat >"$SCRATCH/orphan.sh" <<SH
#!/bin/sh
echo \$\$ > "$SCRATCH/reap-orphan.pid.tmp" && mv "$SCRATCH/reap-orphan.pid.tmp" "$SCRATCH/reap-orphan.pid"
while [ ! -e "$SCRATCH/go" ]; do sleep 0.05; done
exit 0
SH
chmod +x "$SCRATCH/orphan.sh"
launch_bg reap sh -c "sh -c '$SCRATCH/orphan.sh & exit 0'; touch $SCRATCH/spawned; sleep 60"
wait_for 10 test -e "$SCRATCH/spawned" || fail "job did not start"
wait_for 10 test -s "$SCRATCH/reap-orphan.pid" || fail "the orphan did not start"
orphan=$(cat "$SCRATCH/reap-orphan.pid")
# Its parent exited (and was reaped by the root) before "spawned" was written.
expect_eq "parent of the orphaned process $orphan" "$LAUNCH_PID" \
  "$(awk '/^PPid:/ {print $2}' "/proc/$orphan/status")"
touch "$SCRATCH/go"
wait_for 10 sh -c "! test -e /proc/$orphan" ||
  fail "the orphan $orphan was not reaped: $(grep -E '^(State|PPid):' "/proc/$orphan/status" 2>/dev/null | tr '\n' ' ')"
pass "orphans of the job are reaped"
# The job's root is a session leader, in its own process group.
root=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["root_pid"])' "$CUSNAP_RUNTIME_BASE/reap/job.json")
expect_eq "job root is a session leader" "$root" "$(ps -o sid= -p "$root" | tr -d ' ')"
kill -TERM "$LAUNCH_PID"
wait_job "$LAUNCH_PID"

# An orphan still running when the root exits does not keep cusnap waiting forever.
start=$(date +%s)
"$CUSNAP" launch --name lingering -- sh -c 'sleep 4 & exit 5' >/dev/null 2>&1 && rc=0 || rc=$?
expect_eq "status with a lingering orphan" 5 "$rc"
[ $(( $(date +%s) - start )) -lt 15 ] || fail "cusnap waited for the orphan"
pass "a lingering orphan does not hold cusnap"

# ... and is ended with the job: when the root exits, what else of the job
# still runs is sent SIGTERM, and SIGKILL after the grace (it was left running
# unsupervised, invisible to cusnap ps, holding its GPU memory and pids).
"$CUSNAP" launch --name leftover -- sh -c "sleep 300 & echo \$! > $SCRATCH/orphan.pid; exit 0" \
  >"$SCRATCH/leftover.out" 2>&1 && rc=0 || rc=$?
expect_eq "status of a root that left a process running" 0 "$rc"
orphan=$(cat "$SCRATCH/orphan.pid")
wait_for 5 sh -c "! kill -0 $orphan 2>/dev/null" || fail "the job's process $orphan outlived its supervisor"
grep -q "the job's first process ended; its process $orphan, still running, was ended (SIGTERM)" \
  "$SCRATCH/leftover.out" || fail "cusnap did not say it ended process $orphan: $(cat "$SCRATCH/leftover.out")"
pass "a process of the job still running when its root exits is ended (SIGTERM), and cusnap says so"

# One that ignores SIGTERM and left the job's session (setsid) gets SIGKILL.
cat >"$SCRATCH/stubborn.sh" <<SH
#!/bin/sh
trap '' TERM
echo \$\$ > "$SCRATCH/stubborn.pid"
exec sleep 300
SH
chmod +x "$SCRATCH/stubborn.sh"
start=$(date +%s)
"$CUSNAP" launch --name stubborn -- sh -c "setsid $SCRATCH/stubborn.sh & sleep 0.5; exit 3" \
  >"$SCRATCH/stubborn.out" 2>&1 && rc=0 || rc=$?
expect_eq "status of the root" 3 "$rc"
stubborn=$(cat "$SCRATCH/stubborn.pid")
wait_for 5 sh -c "! kill -0 $stubborn 2>/dev/null" || fail "the process $stubborn that ignored SIGTERM outlived its supervisor"
grep -q "its process $stubborn, still running, was ended (SIGTERM, then SIGKILL)" "$SCRATCH/stubborn.out" ||
  fail "cusnap did not say it killed process $stubborn: $(cat "$SCRATCH/stubborn.out")"
[ $(( $(date +%s) - start )) -lt 15 ] || fail "ending the stubborn process took too long"
pass "one that ignores SIGTERM, in a session of its own, is killed after the grace"

# The grace is CUSNAP_EXIT_GRACE_MS: the supervisor copies output for the
# grace (the stubborn process holds the job's pipes), then sends SIGTERM and
# SIGKILL after the grace again. With the default (2 s each) the process is
# gone about 4.5 s after the start; with 6 s it is still there at 5.5 s and
# is killed after 12 s.
rm -f "$SCRATCH/stubborn.pid"
start=$(date +%s.%N)
CUSNAP_EXIT_GRACE_MS=6000 "$CUSNAP" launch --name slowgrace -- \
  sh -c "setsid $SCRATCH/stubborn.sh & sleep 0.5; exit 4" >"$SCRATCH/slowgrace.out" 2>&1 &
slow_pid=$!
wait_for 10 test -s "$SCRATCH/stubborn.pid" || fail "the stubborn process did not start"
stubborn=$(cat "$SCRATCH/stubborn.pid")
sleep "$(python3 -c "import sys,time; print(max(0, 5.5 - (time.time() - float(sys.argv[1]))))" "$start")"
kill -0 "$stubborn" 2>/dev/null || fail "process $stubborn was killed before CUSNAP_EXIT_GRACE_MS=6000 ran out"
wait "$slow_pid" && rc=0 || rc=$?
expect_eq "status of the root (CUSNAP_EXIT_GRACE_MS=6000)" 4 "$rc"
if kill -0 "$stubborn" 2>/dev/null; then fail "process $stubborn outlived its supervisor"; fi
python3 -c "import sys,time; sys.exit(time.time() - float(sys.argv[1]) < 12)" "$start" ||
  fail "the supervisor did not wait twice CUSNAP_EXIT_GRACE_MS"
grep -q "its process $stubborn, still running, was ended (SIGTERM, then SIGKILL)" "$SCRATCH/slowgrace.out" ||
  fail "cusnap did not say it killed process $stubborn: $(cat "$SCRATCH/slowgrace.out")"
pass "CUSNAP_EXIT_GRACE_MS sets the grace"

CUSNAP_EXIT_GRACE_MS=2s "$CUSNAP" launch --name badgrace -- true >"$SCRATCH/badgrace.out" 2>&1 && rc=0 || rc=$?
expect_eq "status with CUSNAP_EXIT_GRACE_MS=2s" 2 "$rc"
grep -q 'CUSNAP_EXIT_GRACE_MS="2s"' "$SCRATCH/badgrace.out" ||
  fail "the refusal does not name the setting: $(cat "$SCRATCH/badgrace.out")"
pass "a bad CUSNAP_EXIT_GRACE_MS is refused (exit 2) naming it"
