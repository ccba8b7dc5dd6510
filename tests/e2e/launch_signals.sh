#!/usr/bin/env bash
# SIGINT, SIGTERM and SIGHUP sent to cusnap reach the job's process group;
# the job's own way of ending decides cusnap's status.
source "$(dirname "$0")/lib_launch.sh"

for sig in TERM INT HUP; do
  launch_bg "sig-$sig" sh -c "trap 'echo got-$sig; exit 7' $sig; touch $SCRATCH/ready-$sig; while :; do sleep 0.1; done"
  wait_for 10 test -e "$SCRATCH/ready-$sig" || fail "job did not start"
  kill -"$sig" "$LAUNCH_PID"
  wait_job "$LAUNCH_PID"
  expect_eq "status after forwarded SIG$sig" 7 "$RC"
  grep -q "got-$sig" "$SCRATCH/sig-$sig.out" || fail "the job did not see SIG$sig"
done

# The whole process group gets it, not only the root.
launch_bg grp sh -c "sh -c 'trap \"echo child-got-term; exit 0\" TERM; touch $SCRATCH/child; while :; do sleep 0.1; done' & wait"
wait_for 10 test -e "$SCRATCH/child" || fail "child did not start"
kill -TERM "$LAUNCH_PID"
wait_job "$LAUNCH_PID"
grep -q child-got-term "$SCRATCH/grp.out" || fail "the job's child did not get SIGTERM"
pass "signal reaches the job's process group"

# Default action: SIGINT kills a job that does not catch it: 128+2.
launch_bg plain sh -c "touch $SCRATCH/plain; exec sleep 30"
wait_for 10 test -e "$SCRATCH/plain"
kill -INT "$LAUNCH_PID"
wait_job "$LAUNCH_PID"
  expect_eq "status after SIGINT to a job that does not catch it" 130 "$RC"

# A reader that stops reading cusnap's output (a terminal paused with Ctrl-S,
# a pager at a full page): the job is held back (its output stops, in the log
# too), yet a signal still reaches it. The reader then reads on and gets the
# rest; cusnap ends with the job's status.
mkfifo "$SCRATCH/slow.fifo"
exec 7<>"$SCRATCH/slow.fifo"  # held open, not read
"$CUSNAP" launch --name slow -- yes cusnap-output-line >"$SCRATCH/slow.fifo" 2>"$SCRATCH/slow.err" &
LAUNCH_PID=$!
BG_PIDS+=("$LAUNCH_PID")
wait_for 10 test -s "$CUSNAP_RUNTIME_BASE/slow/job.json" || fail "job slow did not start"
JOB=$(sed -n 's/.*"root_pid": *\([0-9]*\).*/\1/p' "$CUSNAP_RUNTIME_BASE/slow/job.json")
LOG=$CUSNAP_RUNTIME_BASE/slow/output.log
log_size() { stat -c %s "$LOG"; }
held_back() { local a; a=$(log_size); sleep 0.3; [ "$a" = "$(log_size)" ]; }
wait_for 10 held_back || fail "the job's output did not stop while its reader was not reading"
[ "$(log_size)" -lt $((64 << 20)) ] || fail "the log grew to $(log_size) bytes while nothing was read"
kill -0 "$JOB" || fail "the job ended while held back"
"$CUSNAP" ps >/dev/null || fail "cusnap ps failed while the job's reader was not reading"
kill -TERM "$LAUNCH_PID"
wait_for 10 sh -c "! kill -0 $JOB 2>/dev/null" ||
  fail "SIGTERM did not reach the job while cusnap's reader was not reading"
pass "reader not reading: the job held back at $(log_size) bytes of log; SIGTERM still reached it"
cat <&7 >"$SCRATCH/slow.read" &
CAT=$!
wait_job "$LAUNCH_PID"
kill "$CAT" 2>/dev/null || true
exec 7<&-
expect_eq "status of the job killed by the forwarded SIGTERM" 143 "$RC"
grep -q '^cusnap-output-line$' "$SCRATCH/slow.read" || fail "the reader got none of the held-back output"
