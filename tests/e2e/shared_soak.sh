#!/usr/bin/env bash
# Soak of a job sharing device memory (cusnap-share-job): N checkpoints with
# --leave-running (CUSNAP_SOAK_CYCLES, default 20), each of which saves,
# releases, and rebuilds the shared memory in place. Both processes count on
# each time, seeing each other's writes; in each of them the open descriptors,
# the mappings and the resident memory stay flat after the first cycles
# (pinned staging buffers, temporary mappings, export-cache descriptors and
# control connections are all given back), and so do the supervisor's.
source "$(dirname "$0")/lib_shared.sh"

N=${CUSNAP_SOAK_CYCLES:-20}
PREFIXES=("" "importer ")
LAUNCH_OUT=$T/launch.out
start_job soak "$LAUNCH_OUT" "$SHARE_JOB" --mib 8 --interval-ms 10
PIDS="$(ready_pids "$LAUNCH_OUT" | tr '\n' ' ')$SUP"
fds() { ls "/proc/$1/fd" | wc -l; }
maps() { wc -l <"/proc/$1/maps"; }
rss() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
declare -A F0 M0 R0
for i in $(seq 1 "$N"); do
  rm -rf "$T/ck"
  "$CUSNAP" checkpoint soak -o "$T/ck" --leave-running >"$T/ck.out" 2>&1 ||
    fail "cycle $i: checkpoint: $(cat "$T/ck.out")"
  for p in "${PREFIXES[@]}"; do
    n=$(last_count "$LAUNCH_OUT" "$p")
    wait_count "$LAUNCH_OUT" $((n + 2)) "$p" 20
  done
  if [ "$i" = 3 ]; then
    for pid in $PIDS; do F0[$pid]=$(fds "$pid"); M0[$pid]=$(maps "$pid"); R0[$pid]=$(rss "$pid"); done
  fi
done
for p in "${PREFIXES[@]}"; do wait_seen "$LAUNCH_OUT" "$p" "$(last_seen "$LAUNCH_OUT" "$p")"; done
no_errors "$LAUNCH_OUT"
for pid in $PIDS; do
  f=$(fds "$pid"); m=$(maps "$pid"); r=$(rss "$pid")
  echo "   process $pid: descriptors ${F0[$pid]} -> $f, mappings ${M0[$pid]} -> $m, RSS ${R0[$pid]} -> $r KiB (cycles 3 -> $N)"
  [ "$f" -le "${F0[$pid]}" ] || fail "process $pid: descriptors grew from ${F0[$pid]} to $f"
  [ "$m" -le $(( ${M0[$pid]} + 2 )) ] || fail "process $pid: mappings grew from ${M0[$pid]} to $m"
  [ "$r" -le $(( ${R0[$pid]} + 8192 )) ] || fail "process $pid: resident memory grew from ${R0[$pid]} to $r KiB"
done
pass "$N --leave-running checkpoints of a sharing job: counts on each time, descriptors, mappings and memory flat"
stop_job "$LAUNCH_OUT"
echo "PASS"
