#!/usr/bin/env bash
# cusnap ps lists live jobs (text and JSON); names are unique among live
# jobs; a dead supervisor's directory is cleaned by ps.
source "$(dirname "$0")/lib_launch.sh"

launch_bg psjob sleep 60
out=$("$CUSNAP" ps)
echo "$out" | grep -q '^NAME' || fail "no header: $out"
echo "$out" | grep -E "^psjob +[0-9]+ +$LAUNCH_PID +running .*sleep 60" >/dev/null || fail "job not listed: $out"
pass "ps lists the job"
json=$("$CUSNAP" ps --json)
python3 - "$json" "$LAUNCH_PID" <<'PY' || fail "ps --json: $json"
import json, sys
jobs = json.loads(sys.argv[1])
assert len(jobs) == 1, jobs
j = jobs[0]
assert j["name"] == "psjob" and j["supervisor_pid"] == int(sys.argv[2]), j
assert j["argv"] == ["sleep", "60"] and j["state"] == "running", j
assert j["pid"] > 0 and j["uptime_seconds"] >= 0
PY
pass "ps --json describes the job"

# Control bytes of a command line are shown escaped, never written raw to
# the terminal (an escape sequence could rewrite the screen).
PS_SUPERVISOR=$LAUNCH_PID
launch_bg ctrljob sh -c "sleep 60" "$(printf 'x\033[31my\nz')"
out=$("$CUSNAP" ps)
echo "$out" | grep -q "$(printf '\033')" && fail "ps wrote an escape byte raw: $out"
echo "$out" | grep -qF 'x\x1b[31my\nz' || fail "ps does not show the escaped argument: $out"
"$CUSNAP" inspect ctrljob >"$SCRATCH/ctrl.txt"
grep -q "$(printf '\033')" "$SCRATCH/ctrl.txt" && fail "inspect wrote an escape byte raw: $(cat -v "$SCRATCH/ctrl.txt")"
grep -qF 'x\x1b[31my\nz' "$SCRATCH/ctrl.txt" || fail "inspect does not show the escaped argument: $(cat "$SCRATCH/ctrl.txt")"
"$CUSNAP" ps --json | python3 -c '
import json, sys
j = [j for j in json.load(sys.stdin) if j["name"] == "ctrljob"][0]
assert j["argv"][-1] == "x\x1b[31my\nz", j["argv"]' || fail "ps --json does not give the argument as it is"
kill "$LAUNCH_PID"; wait "$LAUNCH_PID" 2>/dev/null || true
LAUNCH_PID=$PS_SUPERVISOR
pass "ps and inspect show control bytes escaped; --json gives them as they are"

rc=$(run_status "$CUSNAP" launch --name psjob -- true 2>"$SCRATCH/dup.err")
expect_eq "a duplicate name is refused" 3 "$rc"
grep -q "already running" "$SCRATCH/dup.err" || fail "unclear refusal: $(cat "$SCRATCH/dup.err")"

# inspect JOB names its processes.
"$CUSNAP" inspect psjob --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["kind"] == "job" and d["job"]["name"] == "psjob", d
assert d["name"] == "psjob" and d["pid"] == d["job"]["pid"], d
assert d["processes"] and d["processes"][0]["cmdline"][0] == "sleep", d
' || fail "inspect --json"
pass "inspect JOB lists the processes"
expect_eq "inspect of an unknown job" 4 "$(run_status "$CUSNAP" inspect no-such-job 2>/dev/null)"
expect_eq "checkpoint of an unknown job" 4 "$(run_status "$CUSNAP" checkpoint no-such-job 2>/dev/null)"

# A supervisor that dies, with its job, leaves a stale directory once its
# guardian (which takes over a job that survives) sees the job gone: ps removes
# it and the name is free again.
root=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["root_pid"])' "$CUSNAP_RUNTIME_BASE/psjob/job.json")
kill -KILL "$LAUNCH_PID"
wait "$LAUNCH_PID" 2>/dev/null || true
kill -KILL "$root" 2>/dev/null || true
for _ in $(seq 1 100); do "$CUSNAP" ps | grep -q psjob || break; sleep 0.1; done
out=$("$CUSNAP" ps)
echo "$out" | grep -q psjob && fail "ps lists a dead job: $out"
[ ! -e "$CUSNAP_RUNTIME_BASE/psjob" ] || fail "stale directory not cleaned"
pass "a dead supervisor's directory is cleaned"
expect_eq "the name is free again" 0 "$(run_status "$CUSNAP" launch --name psjob -- true)"
