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
