#!/usr/bin/env bash
# The supervisor through a job's whole life with real CRIU and the simulated
# driver: a checkpoint that stops the job ends `cusnap launch` with status 0
# and a message; `restore --detach` leaves a supervisor in the background that
# ps lists and that serves later checkpoints (--leave-running), suspend and
# resume; a restore under a live job's name is refused.
source "$(dirname "$0")/lib_launch.sh"

[ "$(id -u)" = 0 ] || { echo "SKIP: CRIU needs root"; exit 77; }
command -v criu >/dev/null || [ -x /usr/local/sbin/criu ] || { echo "SKIP: criu not installed"; exit 77; }
: "${CUSNAP_FAKECUDA_DIR:?set by CTest}"
JOB_BIN="$CUSNAP_BINARY_DIR/bin/cusnap-pattern-job"
[ -x "$JOB_BIN" ] || fail "$JOB_BIN is not built"
[ -e "$CUSNAP_FAKECUDA_DIR/libcuda.so.1" ] || fail "$CUSNAP_FAKECUDA_DIR/libcuda.so.1 is not built"
export LD_LIBRARY_PATH="$CUSNAP_FAKECUDA_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cd "$SCRATCH"

count_of() { grep -o '^count [0-9]* ok' "$1" | tail -n1 | awk '{print $2}'; }

launch_bg pj "$JOB_BIN" --mib 4 --interval-ms 100
wait_for 10 grep -q '^count 3 ok' "$SCRATCH/pj.out" || fail "job not counting: $(cat "$SCRATCH/pj.err")"
"$CUSNAP" checkpoint pj -o "$SCRATCH/ck1" >"$SCRATCH/ck1.out" 2>&1 || fail "checkpoint: $(cat "$SCRATCH/ck1.out")"
grep -q "checkpointed job pj to $SCRATCH/ck1" "$SCRATCH/ck1.out" || fail "no summary: $(cat "$SCRATCH/ck1.out")"
wait_job "$LAUNCH_PID"
expect_eq "launch exits 0 after a checkpoint stopped its job" 0 "$RC"
grep -q "cusnap: job pj checkpointed to $SCRATCH/ck1 and stopped" "$SCRATCH/pj.err" ||
  fail "no stop message: $(cat "$SCRATCH/pj.err")"
[ ! -e "$CUSNAP_RUNTIME_BASE/pj" ] || fail "runtime directory left behind"
before=$(count_of "$SCRATCH/pj.out")

name=$("$CUSNAP" restore "$SCRATCH/ck1" --detach) || fail "restore --detach"
expect_eq "restore --detach prints the name" pj "$name"
sup=$("$CUSNAP" ps --json | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j[0]["supervisor_pid"] if j else "")')
[ -n "$sup" ] || fail "ps does not list the restored job"
BG_PIDS+=("$sup")
log="$CUSNAP_RUNTIME_BASE/pj/output.log"
wait_for 10 grep -q "^count $((before + 2)) ok" "$log" || fail "restored job not counting on: $(tail -3 "$log")"
pass "the restored job counts on from $before"
"$CUSNAP" inspect pj --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["job"]["restored_from"].endswith("/ck1"), d
assert d["processes"][0]["uses_cuda"], d
' || fail "inspect of the restored job"

rc=$(run_status "$CUSNAP" restore "$SCRATCH/ck1" --detach 2>"$SCRATCH/dup.err")
expect_eq "restore under a live name" 3 "$rc"

"$CUSNAP" checkpoint pj -o "$SCRATCH/ck2" --leave-running --json >"$SCRATCH/ck2.json" || fail "leave-running"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ok"] and not d["job_stopped"], d' "$SCRATCH/ck2.json"
# The JSON of checkpoint, inspect, suspend and ps name the job alike, and
# checkpoint and inspect give the same size and directory.
"$CUSNAP" inspect "$SCRATCH/ck2" --json >"$SCRATCH/ck2.inspect.json" || fail "inspect ck2"
"$CUSNAP" ps --json >"$SCRATCH/ps.json" || fail "ps --json"
python3 - "$SCRATCH/ck2.json" "$SCRATCH/ck2.inspect.json" "$SCRATCH/ps.json" <<'PY' || fail "the JSON outputs disagree"
import json, os, sys
ck, ins, ps = (json.load(open(f)) for f in sys.argv[1:])
job = [j for j in ps if j["name"] == "pj"][0]
assert ck["name"] == ck["job"] == "pj" and ck["pid"] == job["pid"], (ck, job)
assert ins["name"] == "pj" and ins["bytes"] == ck["bytes"], (ins["bytes"], ck["bytes"])
assert ins["dir"] == ck["dir"] and os.path.isabs(ins["dir"]), (ins["dir"], ck["dir"])
PY
pass "checkpoint, inspect and ps --json agree on the job, the size and the directory"
n=$(count_of "$log")
wait_for 10 grep -q "^count $((n + 2)) ok" "$log" || fail "job stopped counting after --leave-running"
pass "checkpoint --leave-running keeps the restored job running"

"$CUSNAP" suspend pj --json >"$SCRATCH/suspend.json" || fail "suspend"
python3 - "$SCRATCH/suspend.json" "$("$CUSNAP" ps --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["pid"])')" <<'PY' || fail "suspend --json: $(cat "$SCRATCH/suspend.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ok"] and d["name"] == "pj" and d["pid"] == int(sys.argv[2]) and d["state"] == "suspended", d
PY
expect_eq "state after suspend" suspended "$("$CUSNAP" ps --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["state"])')"
expect_eq "second suspend refused" 3 "$(run_status "$CUSNAP" suspend pj 2>/dev/null)"
"$CUSNAP" resume pj >/dev/null || fail "resume"
n=$(count_of "$log")
wait_for 10 grep -q "^count $((n + 2)) ok" "$log" || fail "job not counting after resume"
pass "suspend and resume through the restored supervisor"

kill -TERM "$sup"
wait_for 10 sh -c "! kill -0 $sup" || fail "restored supervisor did not end on SIGTERM"
pass "the restored supervisor forwards SIGTERM and ends"
