#!/usr/bin/env bash
# checkpoint --leave-running of two processes sharing a POSIX-fd allocation:
# both go on counting as the same processes and keep seeing each other's
# writes; the checkpoint restores later, after the job is stopped.
source "$(dirname "$0")/lib_shared.sh"

PREFIXES=("" "importer ")
LAUNCH_OUT=$T/launch.out
start_job lr "$LAUNCH_OUT" "$SHARE_JOB" --mib 4 --interval-ms 20
note_last "$LAUNCH_OUT"
# Before the checkpoint: the restored job starts after these.
B_LAST=("${LAST[@]}")
B_SEEN=("${SEEN[@]}")
"$CUSNAP" checkpoint lr -o "$T/ckpt" --leave-running >"$T/ckpt.out" 2>&1 ||
  fail "checkpoint --leave-running failed (exit $?): $(cat "$T/ckpt.out")"
[ -f "$T/ckpt/manifest.json" ] || fail "no manifest"
for p in "${PREFIXES[@]}"; do expect_running lr "$PID" "$LAUNCH_OUT" "$p"; done
# Counted on without a gap, and the shared bytes are still shared.
note_last "$LAUNCH_OUT"
for k in "${!PREFIXES[@]}"; do
  p=${PREFIXES[k]}
  wait_count "$LAUNCH_OUT" $((LAST[k] + 5)) "$p" 20
  wait_seen "$LAUNCH_OUT" "$p" "${SEEN[k]}"
  grep -E "^${p}count [0-9]+ ok$" "$LAUNCH_OUT" | awk '{print $(NF-1)}' >"$T/got"
  seq "$(head -1 "$T/got")" "$(tail -1 "$T/got")" >"$T/want"
  cmp -s "$T/want" "$T/got" ||
    fail "'$p' skipped or repeated a count across the checkpoint: $(diff "$T/want" "$T/got" | head -5)"
done
for p in $(ready_pids "$LAUNCH_OUT"); do kill -0 "$p" || fail "process $p ended"; done
no_errors "$LAUNCH_OUT"
pass "the job ran on through the checkpoint"

stop_job "$LAUNCH_OUT"
restore_bg "$T/ckpt" "$T/restore.out"
SUP=$LAST_SUPERVISOR
LAST=("${B_LAST[@]}")
SEEN=("${B_SEEN[@]}")
expect_continued "$T/restore.out" 0
pass "the checkpoint restored later"
echo "PASS"
