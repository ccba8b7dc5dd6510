#!/usr/bin/env bash
# suspend of two processes sharing a POSIX-fd allocation: the shim's gate
# holds their driver calls, so neither count advances while suspended and
# both processes stay; resume: both count on, the bytes intact, each seeing
# the other's writes again.
source "$(dirname "$0")/lib_shared.sh"

PREFIXES=("" "importer ")
LAUNCH_OUT=$T/launch.out
start_job susp "$LAUNCH_OUT" "$SHARE_JOB" --mib 4 --interval-ms 20
"$CUSNAP" suspend susp >"$T/suspend.out" 2>&1 || fail "suspend failed (exit $?): $(cat "$T/suspend.out")"
sleep 0.3
declare -A N1
for p in "${PREFIXES[@]}"; do N1[$p]=$(last_count "$LAUNCH_OUT" "$p"); done
sleep 1.5
for p in "${PREFIXES[@]}"; do
  n2=$(last_count "$LAUNCH_OUT" "$p")
  [ "$n2" = "${N1[$p]}" ] || fail "'$p' went on counting while suspended (${N1[$p]} -> $n2)"
done
for p in $(ready_pids "$LAUNCH_OUT"); do kill -0 "$p" || fail "process $p is gone while suspended"; done
pass "suspended: counts held at ${N1[""]} / ${N1["importer "]}"

"$CUSNAP" resume susp >"$T/resume.out" 2>&1 || fail "resume failed (exit $?): $(cat "$T/resume.out")"
note_last "$LAUNCH_OUT"
for p in "${PREFIXES[@]}"; do expect_running susp "$PID" "$LAUNCH_OUT" "$p"; done
for p in "${PREFIXES[@]}"; do
  for _ in $(seq 1 200); do
    [ "$(last_seen "$LAUNCH_OUT" "$p")" -gt "${SEEN[$p]}" ] && break
    sleep 0.05
  done
  [ "$(last_seen "$LAUNCH_OUT" "$p")" -gt "${SEEN[$p]}" ] ||
    fail "'$p' does not see the other's writes after resume"
done
no_errors "$LAUNCH_OUT"
pass "resumed: both count on and share their memory"
echo "PASS"
