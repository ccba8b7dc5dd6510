#!/usr/bin/env bash
# While a checkpoint runs, the supervisor still answers ps and inspect, and a
# second checkpoint (or a suspend) is refused at once with exit status 3; the
# first one completes. CRIU is slowed by a wrapper so the window is wide.
source "$(dirname "$0")/lib_launch.sh"

[ "$(id -u)" = 0 ] || { echo "SKIP: CRIU needs root"; exit 77; }
REAL_CRIU=$(command -v criu || echo /usr/local/sbin/criu)
[ -x "$REAL_CRIU" ] || { echo "SKIP: criu not installed"; exit 77; }
: "${CUSNAP_FAKECUDA_DIR:?set by CTest}"
JOB_BIN="$CUSNAP_BINARY_DIR/bin/cusnap-pattern-job"
[ -x "$JOB_BIN" ] || fail "$JOB_BIN is not built"
[ -e "$CUSNAP_FAKECUDA_DIR/libcuda.so.1" ] || fail "$CUSNAP_FAKECUDA_DIR/libcuda.so.1 is not built"
export LD_LIBRARY_PATH="$CUSNAP_FAKECUDA_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

cat >"$SCRATCH/slow-criu" <<SH
#!/bin/sh
case "\$1" in dump) sleep 3 ;; esac
exec "$REAL_CRIU" "\$@"
SH
chmod +x "$SCRATCH/slow-criu"
export CUSNAP_CRIU="$SCRATCH/slow-criu"

launch_bg cc "$JOB_BIN" --mib 4 --interval-ms 100
wait_for 10 grep -q '^count 2 ok' "$SCRATCH/cc.out" || fail "job not counting"
"$CUSNAP" checkpoint cc -o "$SCRATCH/ck" --leave-running --json >"$SCRATCH/first.json" 2>"$SCRATCH/first.err" &
first=$!
state() { "$CUSNAP" ps --json | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j[0]["state"] if j else "")'; }
wait_for 10 sh -c "[ \"\$(CUSNAP_RUNTIME_BASE=$CUSNAP_RUNTIME_BASE '$CUSNAP' ps --json | grep -c checkpointing)\" = 1 ]" ||
  fail "ps never showed the checkpoint"
pass "ps answers during a checkpoint"

start=$(date +%s%N)
rc=0; "$CUSNAP" checkpoint cc -o "$SCRATCH/ck2" 2>"$SCRATCH/second.err" || rc=$?
expect_eq "a second checkpoint is refused" 3 "$rc"
grep -q "a checkpoint of job cc is already running" "$SCRATCH/second.err" || fail "unclear: $(cat "$SCRATCH/second.err")"
[ $(( ($(date +%s%N) - start) / 1000000 )) -lt 2000 ] || fail "the refusal waited for the checkpoint"
[ ! -e "$SCRATCH/ck2" ] || fail "the refused checkpoint created its directory"
rc=0; "$CUSNAP" suspend cc 2>/dev/null || rc=$?
expect_eq "a suspend during the checkpoint is refused" 3 "$rc"
"$CUSNAP" inspect cc >/dev/null || fail "inspect during the checkpoint"
pass "inspect answers during a checkpoint"

wait_job "$first"
expect_eq "the first checkpoint completes" 0 "$RC"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ok"] and not d["job_stopped"], d' "$SCRATCH/first.json"
expect_eq "state afterwards" running "$(state)"
n=$(grep -c '^count .* ok' "$SCRATCH/cc.out")
wait_for 10 sh -c "[ \$(grep -c '^count .* ok' '$SCRATCH/cc.out') -gt $((n + 1)) ]" || fail "job stopped counting"
pass "the job runs on after the checkpoint"
