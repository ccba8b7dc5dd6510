#!/usr/bin/env bash
# What a job sharing device memory must never be checkpointed through, and
# that the shim never stalls the application meanwhile:
#  - a shim whose control socket is gone (its runtime directory changed):
#    the checkpoint is refused (exit 3) naming the process, the job runs on;
#  - the job's whole runtime directory removed: the application keeps
#    working (the shim needs it only to checkpoint), and the job cannot be
#    checkpointed (its supervisor's socket went with it).
source "$(dirname "$0")/lib_shared.sh"

PREFIXES=("" "importer ")
LAUNCH_OUT=$T/launch.out
start_job lost "$LAUNCH_OUT" "$SHARE_JOB" --mib 4 --interval-ms 20
RUNDIR=$CUSNAP_RUNTIME_BASE/lost
IMPORTER=$(ready_pids "$LAUNCH_OUT" | tail -1)
[ -S "$RUNDIR/shim-ctl.$IMPORTER.sock" ] || fail "no control socket of the importer's shim in $RUNDIR"
rm -f "$RUNDIR/shim-ctl.$IMPORTER.sock"
RC=0
"$CUSNAP" checkpoint lost -o "$T/ck" >"$T/ck.out" 2>&1 || RC=$?
[ "$RC" = 3 ] || fail "checkpoint exited $RC, expected 3 (refused): $(cat "$T/ck.out")"
grep -q "process $IMPORTER runs the cusnap shim with tracking on, but its control socket" "$T/ck.out" ||
  fail "the refusal does not name the process and the missing socket: $(cat "$T/ck.out")"
[ ! -e "$T/ck/manifest.json" ] || fail "a refused checkpoint wrote a manifest"
for k in "${!PREFIXES[@]}"; do
  p=${PREFIXES[k]}
  n=$(last_count "$LAUNCH_OUT" "$p")
  wait_count "$LAUNCH_OUT" $((n + 3)) "$p" 30
  wait_seen "$LAUNCH_OUT" "$p" "$(last_seen "$LAUNCH_OUT" "$p")"
done
no_errors "$LAUNCH_OUT"
pass "a shim without its control socket: refused ($(grep -m1 '^cusnap' "$T/ck.out" | cut -c1-120)...), the job runs on"

rm -rf "$RUNDIR"
for k in "${!PREFIXES[@]}"; do
  p=${PREFIXES[k]}
  n=$(last_count "$LAUNCH_OUT" "$p")
  wait_count "$LAUNCH_OUT" $((n + 5)) "$p" 30
done
no_errors "$LAUNCH_OUT"
RC=0
"$CUSNAP" checkpoint lost -o "$T/ck2" >"$T/ck2.out" 2>&1 || RC=$?
[ "$RC" != 0 ] || fail "a job without its runtime directory was checkpointed"
[ ! -e "$T/ck2/manifest.json" ] || fail "a manifest was written for a job without its runtime directory"
pass "the runtime directory removed: the application keeps working; checkpoint exits $RC ($(head -c 100 "$T/ck2.out"))"
for p in $(ready_pids "$LAUNCH_OUT"); do kill -KILL "$p" 2>/dev/null; done
echo "PASS"
