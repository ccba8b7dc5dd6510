#!/usr/bin/env bash
# suspend releases the GPU in place (the job stops making progress in the
# driver, the process stays); resume brings it back and it counts on with its
# pattern intact.
source "$(dirname "$0")/lib_checkpoint.sh"

launch sr "$T/launch.out" "$PATTERN_JOB" --mib 8 --interval-ms 20
wait_count "$T/launch.out" 5
PID=$(wait_job sr)

"$CUSNAP" suspend sr >"$T/suspend.out" 2>&1 || fail "suspend failed: $(cat "$T/suspend.out")"
N1=$(settled_count "$T/launch.out")
sleep 1
N2=$(last_count "$T/launch.out")
[ "$N1" = "$N2" ] || fail "the suspended job went on counting ($N1 -> $N2)"
kill -0 "$PID" || fail "the suspended job's process is gone"
# Shown suspended, the driver's state checkpointed.
expect_held sr "$T/launch.out"
pass "suspended at count $N1"

# A checkpoint of a suspended job is refused, changing nothing.
expect_refused 3 "suspended" "$CUSNAP" checkpoint sr -o "$T/ckpt"
[ ! -e "$T/ckpt/manifest.json" ] || fail "a refused checkpoint left a manifest"

"$CUSNAP" resume sr >"$T/resume.out" 2>&1 || fail "resume failed: $(cat "$T/resume.out")"
expect_running sr "$PID" "$T/launch.out"
pass "resumed and counting"
echo "PASS"
