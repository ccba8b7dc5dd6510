#!/usr/bin/env bash
# The supervisor is the job's child subreaper: orphans of the job become its
# children and are reaped, so no zombie holds a pid.
source "$(dirname "$0")/lib_launch.sh"

# The job's root starts a grandchild and lets its parent exit: the grandchild
# is orphaned, reparents to the supervisor, then exits.
launch_bg reap sh -c "sh -c 'sleep 0.5 & exit 0'; touch $SCRATCH/spawned; sleep 60"
wait_for 10 test -e "$SCRATCH/spawned" || fail "job did not start"
sleep 1.5
zombies=$(ps -o pid=,stat= --ppid "$LAUNCH_PID" | awk '$2 ~ /^Z/' || true)
[ -z "$zombies" ] || fail "zombies under the supervisor: $zombies"
pass "orphans of the job are reaped"
grep -q '^PPid:' /proc/$LAUNCH_PID/status
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
