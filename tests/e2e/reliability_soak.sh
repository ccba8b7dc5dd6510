#!/usr/bin/env bash
# Soak: one job through N checkpoint/restore cycles (CUSNAP_SOAK_CYCLES,
# default 20; docs/reliability.md reports 100) plus N --leave-running
# checkpoints of one supervisor. The job continues exactly where it stopped
# each time with its pattern intact; the supervisor that serves the
# --leave-running checkpoints keeps its resident memory and its open
# descriptors flat (after the first cycles, which load the driver and warm
# up allocators). Figures go to stdout (and CUSNAP_SOAK_REPORT=FILE).
source "$(dirname "$0")/lib_checkpoint.sh"
source "$(dirname "$0")/lib_reliability.sh"

N=${CUSNAP_SOAK_CYCLES:-20}
REPORT=${CUSNAP_SOAK_REPORT:-/dev/null}
START=$(date +%s)

# Part 1: checkpoint (stop) and restore, N times.
launch soak "$T/soak0.out" "$PATTERN_JOB" --mib 16 --interval-ms 10
wait_count "$T/soak0.out" 3
PID=$(wait_job soak)
OUT=$T/soak0.out
for i in $(seq 1 "$N"); do
  wait_count "$OUT" $(( $(last_count "$OUT") + 2 ))
  rm -rf "$T/ck"
  "$CUSNAP" checkpoint soak -o "$T/ck" >"$T/ck.out" 2>&1 || fail "cycle $i: checkpoint: $(cat "$T/ck.out")"
  wait_exit "$LAST_SUPERVISOR"
  wait_gone "$PID"
  LAST=$(last_count "$OUT")
  grep -q "pattern mismatch" "$OUT" && fail "cycle $i: the pattern was damaged"
  OUT=$T/soak$i.out
  restore_bg "$T/ck" "$OUT"
  wait_count "$OUT" $((LAST + 1))
  [ "$(first_count "$OUT")" = $((LAST + 1)) ] || fail "cycle $i: continued at $(first_count "$OUT"), expected $((LAST + 1))"
done
grep -q "pattern mismatch" "$OUT" && fail "the pattern was damaged"
T1=$(( $(date +%s) - START ))
pass "$N checkpoint/restore cycles in $T1 s; the job continued each time where it stopped"
echo "checkpoint/restore cycles: $N in $T1 s" >>"$REPORT"
kill -TERM "$LAST_SUPERVISOR"; wait_exit "$LAST_SUPERVISOR"; wait_gone "$PID"

# Part 2: one supervisor, N checkpoints --leave-running: its RSS and
# descriptors must not grow with the number of cycles.
launch lr "$T/lr.out" "$PATTERN_JOB" --mib 16 --interval-ms 10
SUP=$LAST_SUPERVISOR
wait_count "$T/lr.out" 3
PID=$(wait_job lr)
WARM=$(( N < 10 ? 2 : 5 ))
for i in $(seq 1 "$N"); do
  rm -rf "$T/lrck"
  "$CUSNAP" checkpoint lr -o "$T/lrck" --leave-running >"$T/lrck.out" 2>&1 ||
    fail "cycle $i: checkpoint --leave-running: $(cat "$T/lrck.out")"
  "$CUSNAP" inspect lr >/dev/null || fail "cycle $i: inspect"
  if [ "$i" = "$WARM" ]; then RSS0=$(rss_kb "$SUP"); FD0=$(fd_count "$SUP"); fi
done
RSS1=$(rss_kb "$SUP"); FD1=$(fd_count_settled "$SUP" "$FD0")
expect_running lr "$PID" "$T/lr.out"
echo "supervisor after cycle $WARM: RSS $RSS0 kB, $FD0 descriptors; after cycle $N: RSS $RSS1 kB, $FD1 descriptors" |
  tee -a "$REPORT"
[ "$FD1" -le "$FD0" ] || fail "the supervisor's descriptors grew from $FD0 to $FD1"
# Flat: at most 2 MiB or 10% over the warm figure, whichever is more.
LIMIT=$(( RSS0 + (RSS0 / 10 > 2048 ? RSS0 / 10 : 2048) ))
[ "$RSS1" -le "$LIMIT" ] || fail "the supervisor's RSS grew from $RSS0 kB to $RSS1 kB"
pass "supervisor RSS and descriptors flat over $N --leave-running checkpoints"
echo "total: $(( $(date +%s) - START )) s" | tee -a "$REPORT"
echo "PASS"
