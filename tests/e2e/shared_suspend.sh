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
counts_held "$LAUNCH_OUT" 1.5
for p in $(ready_pids "$LAUNCH_OUT"); do kill -0 "$p" || fail "process $p is gone while suspended"; done
pass "suspended: counts held at ${LAST[*]}"

"$CUSNAP" resume susp >"$T/resume.out" 2>&1 || fail "resume failed (exit $?): $(cat "$T/resume.out")"
note_last "$LAUNCH_OUT"
for p in "${PREFIXES[@]}"; do expect_running susp "$PID" "$LAUNCH_OUT" "$p"; done
for k in "${!PREFIXES[@]}"; do wait_seen "$LAUNCH_OUT" "${PREFIXES[k]}" "${SEEN[k]}"; done
no_errors "$LAUNCH_OUT"
pass "resumed: both count on and share their memory"
echo "PASS"
