#!/usr/bin/env bash
# A resume whose shared-memory rebuild fails leaves the job suspended for
# another resume: the job's driver state comes back, but its importer cannot
# import the creator's allocation again (cuMemImportFromShareableHandle fails
# in the rebuild and in its second attempt), so the resume exits 6 saying the job is left suspended; the job
# stands still, ps shows it so, and a second resume, the fault gone, brings
# it back: both processes count on and share their memory again.
source "$(dirname "$0")/lib_shared.sh"
fake_only "fault injection (FAKECUDA_FAIL_FILE)" || exit 77

PREFIXES=("" "importer ")
LAUNCH_OUT=$T/launch.out
start_job rfault "$LAUNCH_OUT" env "FAKECUDA_FAIL_FILE=$T/fault.%p" "$SHARE_JOB" --mib 4 --interval-ms 20
IMPORTER=$(sed -n 's/^importer ready pid \([0-9]*\).*/\1/p' "$LAUNCH_OUT")
"$CUSNAP" suspend rfault >"$T/suspend.out" 2>&1 || fail "suspend failed (exit $?): $(cat "$T/suspend.out")"
counts_held "$LAUNCH_OUT" 0.5

# The simulated driver reads and removes the file at the importer's next
# call; the two imports after it fail (the rebuild tries twice).
echo "cuMemImportFromShareableHandle:1:999,cuMemImportFromShareableHandle:2:999" >"$T/fault.$IMPORTER"
rc=0
"$CUSNAP" resume rfault >"$T/resume.out" 2>&1 || rc=$?
[ "$rc" = 6 ] || fail "a resume whose rebuild failed exited $rc, not 6: $(cat "$T/resume.out")"
grep -q "cuMemImportFromShareableHandle" "$T/resume.out" || fail "the error does not name the failing call: $(cat "$T/resume.out")"
grep -q "left suspended" "$T/resume.out" || fail "the error does not say the job is left suspended: $(cat "$T/resume.out")"
grep -q "cusnap resume rfault" "$T/resume.out" || fail "the error does not say how to bring it back: $(cat "$T/resume.out")"
counts_held "$LAUNCH_OUT" 1
"$CUSNAP" ps --json >"$T/ps.json" 2>&1 || fail "ps failed: $(cat "$T/ps.json")"
grep -q "left suspended\|left_suspended" "$T/ps.json" || fail "ps does not show the job left suspended: $(cat "$T/ps.json")"
pass "the rebuild failed: exit 6, the job left suspended and standing still"

[ ! -e "$T/fault.$IMPORTER" ] || fail "the fault was never armed"
"$CUSNAP" resume rfault >"$T/resume2.out" 2>&1 || fail "the second resume failed (exit $?): $(cat "$T/resume2.out")"
for p in "${PREFIXES[@]}"; do expect_running rfault "$PID" "$LAUNCH_OUT" "$p"; done
for k in "${!PREFIXES[@]}"; do wait_seen "$LAUNCH_OUT" "${PREFIXES[k]}" "${SEEN[k]}"; done
no_errors "$LAUNCH_OUT"
pass "the second resume brought it back: both count on and share their memory"
stop_job "$LAUNCH_OUT"
echo "PASS"
