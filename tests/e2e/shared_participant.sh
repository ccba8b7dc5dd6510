#!/usr/bin/env bash
# A participant dies in the middle of a checkpoint of a job sharing device
# memory: the importer of cusnap-share-job is killed (SIGKILL) while the
# creator's shim saves the shared bytes (slowed by FAKECUDA_DELAY in the job).
# The checkpoint must fail promptly (exit 1, no manifest, nothing hangs), the
# creator's gate must open again (it runs on until it notices its importer
# is gone, and then ends as the program does: exit 4), and the supervisor
# ends with the job's status.
source "$(dirname "$0")/lib_shared.sh"
fake_only "FAKECUDA_DELAY" || exit 77

PREFIXES=("" "importer ")
LAUNCH_OUT=$T/launch.out
start_job part "$LAUNCH_OUT" env FAKECUDA_DELAY=cuMemcpyDtoHAsync:1500 "$SHARE_JOB" --mib 4 --interval-ms 20
IMPORTER=$(sed -n 's/^importer ready pid \([0-9]*\).*/\1/p' "$LAUNCH_OUT")
CREATOR=$(sed -n 's/^ready pid \([0-9]*\).*/\1/p' "$LAUNCH_OUT")
START=$(date +%s)
"$CUSNAP" checkpoint part -o "$T/ck" --timeout 20 >"$T/ck.out" 2>&1 &
CK=$!
for _ in $(seq 1 200); do [ -n "$(ls "$T/ck/shared" 2>/dev/null)" ] && break; sleep 0.02; done
[ -n "$(ls "$T/ck/shared" 2>/dev/null)" ] || fail "the save phase did not start"
kill -KILL "$IMPORTER"
RC=0
wait "$CK" || RC=$?
SECS=$(( $(date +%s) - START ))
[ "$RC" = 1 ] || fail "the checkpoint exited $RC, expected 1: $(cat "$T/ck.out")"
[ ! -e "$T/ck/manifest.json" ] || fail "a manifest was written although a participant died"
[ "$SECS" -le 30 ] || fail "the checkpoint took $SECS s to give up"
grep -m1 "^cusnap" "$T/ck.out" | cut -c1-160
# The creator was let go: it ends as the program does when its importer dies.
wait_exit "$SUP"
[ "$EXIT_RC" = 4 ] || fail "the supervisor exited $EXIT_RC, expected the job's 4 (its importer gone)"
grep -q "pattern mismatch" "$LAUNCH_OUT" && fail "a wrong byte was read"
kill -0 "$CREATOR" 2>/dev/null && fail "the creator still runs"
pass "the importer killed during the save: checkpoint exit 1 in $SECS s, no manifest; the creator's gate opened and it ended with status 4"
echo "PASS"
