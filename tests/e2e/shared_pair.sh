#!/usr/bin/env bash
# Two processes sharing a POSIX-fd VMM allocation (cusnap-share-job) are
# checkpointed and stopped, then restored: both continue counting where they
# stopped, the bytes are intact, and each sees the other's writes land in the
# shared bytes again. The same checkpoint restores a second time after the
# first restored job is stopped; that restored job is checkpointed and
# restored in turn.
source "$(dirname "$0")/lib_shared.sh"

PREFIXES=("" "importer ")
LAUNCH_OUT=$T/launch.out
start_job pair "$LAUNCH_OUT" "$SHARE_JOB" --mib 4 --interval-ms 20
checkpoint_restore_cycle pair
stop_job "$LAUNCH_OUT"
pass "the first restored job stopped"

restore_bg "$T/ckpt-pair" "$T/restore2.out"
SUP=$LAST_SUPERVISOR
expect_continued "$T/restore2.out" 1
pass "the same checkpoint restored a second time"
checkpoint_restore_cycle pair 1 "$T/restore2.out" again
stop_job "$LAUNCH_OUT"
echo "PASS"
