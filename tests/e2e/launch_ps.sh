#!/usr/bin/env bash
# cusnap ps lists live jobs (text and JSON); names are unique among live
# jobs; a dead supervisor's directory is cleaned by ps.
source "$(dirname "$0")/lib_launch.sh"
source "$(dirname "$0")/lib_orphan.sh"

launch_bg psjob sleep 60
out=$("$CUSNAP" ps)
grep -q '^NAME' <<<"$out" || fail "no header: $out"
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
grep -q "$(printf '\033')" <<<"$out" && fail "ps wrote an escape byte raw: $out"
grep -qF 'x\x1b[31my\nz' <<<"$out" || fail "ps does not show the escaped argument: $out"
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
for _ in $(seq 1 100); do grep -q psjob <<<"$("$CUSNAP" ps)" || break; sleep 0.1; done
out=$("$CUSNAP" ps)
grep -q psjob <<<"$out" && fail "ps lists a dead job: $out"
[ ! -e "$CUSNAP_RUNTIME_BASE/psjob" ] || fail "stale directory not cleaned"
pass "a dead supervisor's directory is cleaned"
expect_eq "the name is free again" 0 "$(run_status "$CUSNAP" launch --name psjob -- true)"

# A supervisor killed with its guardian while the job runs on: ps says so on
# stderr (--json too, its output unchanged), keeps the job's directory (the
# record of it) and the name taken; once the process has ended, it goes.
launch_bg orphan sleep 300
wait_for 10 test -s "$CUSNAP_RUNTIME_BASE/orphan/job.json" || fail "orphan did not start"
root=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["root_pid"])' "$CUSNAP_RUNTIME_BASE/orphan/job.json")
orphan_job "$LAUNCH_PID"
for _ in $(seq 1 100); do grep -q orphan <<<"$("$CUSNAP" ps 2>/dev/null)" || break; sleep 0.1; done
kill -0 "$root" || fail "the job's process $root died with its supervisor"
"$CUSNAP" ps --json >"$SCRATCH/ps.json" 2>"$SCRATCH/ps.err" || fail "ps --json failed: $(cat "$SCRATCH/ps.err")"
[ "$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))))' "$SCRATCH/ps.json")" = 0 ] ||
  fail "ps --json lists: $(cat "$SCRATCH/ps.json")"
grep -q "warning: job orphan has no supervisor .* its process $root runs on, unsupervised: .*kill -- -$root)" "$SCRATCH/ps.err" ||
  fail "ps did not say that orphan runs unsupervised: $(cat "$SCRATCH/ps.err")"
[ -f "$CUSNAP_RUNTIME_BASE/orphan/job.json" ] || fail "ps removed the directory of a job that runs on"
rc=$(run_status "$CUSNAP" launch --name orphan -- true)
expect_eq "launch under the name of a job running unsupervised" 3 "$rc"
"$CUSNAP" launch --name orphan -- true >"$SCRATCH/refused.out" 2>&1 || true
grep -q "a job named 'orphan' runs on without a supervisor (its process $root" "$SCRATCH/refused.out" ||
  fail "the refusal does not say why: $(cat "$SCRATCH/refused.out")"
kill -KILL "$root"
for _ in $(seq 1 100); do kill -0 "$root" 2>/dev/null || break; sleep 0.05; done
"$CUSNAP" ps >/dev/null 2>"$SCRATCH/ps.err"
[ ! -s "$SCRATCH/ps.err" ] || fail "ps still warns after the process ended: $(cat "$SCRATCH/ps.err")"
[ ! -e "$CUSNAP_RUNTIME_BASE/orphan" ] || fail "the directory stayed after the process ended"
pass "a job whose supervisor and guardian were killed: said by ps, its name kept, until it ends"

# The same with the runtime directory outside the base (launch --runtime-dir):
# the link BASE/NAME stays with it, and it is said once.
"$CUSNAP" launch --name orphan2 --runtime-dir "$SCRATCH/rd2" -- sleep 300 >"$SCRATCH/orphan2.out" 2>&1 &
LAUNCH_PID=$!
BG_PIDS+=("$LAUNCH_PID")
wait_for 10 test -s "$SCRATCH/rd2/job.json" || fail "orphan2 did not start: $(cat "$SCRATCH/orphan2.out")"
root=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["root_pid"])' "$SCRATCH/rd2/job.json")
orphan_job "$LAUNCH_PID"
"$CUSNAP" ps >/dev/null 2>"$SCRATCH/ps.err"
[ "$(grep -c "warning: job orphan2 has no supervisor .* its process $root runs on" "$SCRATCH/ps.err")" = 1 ] ||
  fail "ps did not say once that orphan2 runs unsupervised: $(cat "$SCRATCH/ps.err")"
[ -L "$CUSNAP_RUNTIME_BASE/orphan2" ] || fail "ps removed the link to the directory of a job that runs on"
expect_eq "launch under the name of a job running unsupervised (elsewhere)" 3 "$(run_status "$CUSNAP" launch --name orphan2 -- true)"
kill -KILL "$root"
for _ in $(seq 1 100); do kill -0 "$root" 2>/dev/null || break; sleep 0.05; done
"$CUSNAP" ps >/dev/null 2>"$SCRATCH/ps.err"
[ ! -s "$SCRATCH/ps.err" ] && [ ! -e "$CUSNAP_RUNTIME_BASE/orphan2" ] ||
  fail "after the process ended: $(cat "$SCRATCH/ps.err"; ls -la "$CUSNAP_RUNTIME_BASE")"
pass "the same with its runtime directory outside the base: the link kept, said once, until it ends"

# inspect NAME: the running job of that name, even where a checkpoint
# directory of that name is here; a directory that holds no job is said to
# hold none.
launch_bg twin sleep 60
TWIN=$LAUNCH_PID
mkdir "$SCRATCH/twin" && echo '{}' >"$SCRATCH/twin/manifest.json"
(cd "$SCRATCH" && "$CUSNAP" inspect twin --json) | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["kind"] == "job" and d["name"] == "twin", d
' || fail "inspect twin does not describe the running job twin"
mkdir -m 755 "$SCRATCH/emptydir"
rc=0
(cd "$SCRATCH" && exec "$CUSNAP" suspend ./emptydir) 2>"$SCRATCH/empty.err" || rc=$?
[ "$rc" = 4 ] && grep -q "no job is running in ./emptydir" "$SCRATCH/empty.err" &&
  ! grep -q mode "$SCRATCH/empty.err" || fail "suspend ./emptydir: exit $rc: $(cat "$SCRATCH/empty.err")"
kill "$TWIN"; wait "$TWIN" 2>/dev/null || true
pass "inspect NAME is the running job before a directory NAME; suspend ./emptydir says no job runs there"

# A long command is cut at a character, never inside one.
launch_bg utf8job sh -c "sleep 60" "x$(printf 'é%.0s' $(seq 60))"
UTF=$LAUNCH_PID
"$CUSNAP" ps | python3 -c '
import sys
text = sys.stdin.buffer.read().decode("utf-8")
line = [l for l in text.splitlines() if l.startswith("utf8job ")][0]
cmd = line[line.index("sh -c"):]
assert cmd.endswith("...") and len(cmd) == 60, cmd
' || fail "ps cuts a long command inside a character: $("$CUSNAP" ps | grep utf8job)"
kill "$UTF"; wait "$UTF" 2>/dev/null || true
pass "ps cuts a long command at a character"

# A relative CUSNAP_RUNTIME_BASE is taken from the current directory: the
# job finds its runtime directory wherever it goes.
REAL=$(cd "$SCRATCH" && pwd -P)
out=$(cd "$SCRATCH" && CUSNAP_RUNTIME_BASE=relbase "$CUSNAP" launch --name rel -- sh -c 'cd / && echo "$CUSNAP_RUNTIME_DIR"')
expect_eq "a relative CUSNAP_RUNTIME_BASE" "$REAL/relbase/rel" "$out"

# The default runtime directory given explicitly; a job whose directory is
# another entry of the base is listed once.
out=$("$CUSNAP" launch --name zz --runtime-dir "$CUSNAP_RUNTIME_BASE/zz" -- echo hi 2>&1)
expect_eq "launch --runtime-dir BASE/NAME" hi "$out"
[ ! -e "$CUSNAP_RUNTIME_BASE/zz" ] || fail "launch --runtime-dir BASE/NAME left $(ls -la "$CUSNAP_RUNTIME_BASE/zz")"
"$CUSNAP" launch --name aa --runtime-dir "$CUSNAP_RUNTIME_BASE/bb" -- sleep 60 >/dev/null 2>&1 &
AA=$!
BG_PIDS+=("$AA")
wait_for 10 test -s "$CUSNAP_RUNTIME_BASE/bb/job.json" || fail "job aa did not start"
expect_eq "ps lists a job in BASE/OTHER once" 1 "$("$CUSNAP" ps | grep -c '^aa ')"
expect_eq "ps --json lists it once" 1 "$("$CUSNAP" ps --json | python3 -c 'import json,sys; print(sum(j["name"] == "aa" for j in json.load(sys.stdin)))')"
kill "$AA"; wait "$AA" 2>/dev/null || true

# Started with stdin, stdout and stderr closed: the job's output still goes
# to output.log, never into a file of cusnap's.
"$CUSNAP" launch --name closed -- sh -c 'echo out; echo err >&2; sleep 60' <&- >&- 2>&- &
CLOSED=$!
BG_PIDS+=("$CLOSED")
wait_for 10 grep -q err "$CUSNAP_RUNTIME_BASE/closed/output.log" ||
  fail "closed fds: output.log holds $(cat "$CUSNAP_RUNTIME_BASE/closed/output.log" 2>&1); lock holds $(cat "$CUSNAP_RUNTIME_BASE/closed/lock" 2>&1)"
grep -q out "$CUSNAP_RUNTIME_BASE/closed/output.log" || fail "closed fds: no stdout in output.log"
[ ! -s "$CUSNAP_RUNTIME_BASE/closed/lock" ] || fail "closed fds: the lock file holds $(cat "$CUSNAP_RUNTIME_BASE/closed/lock")"
kill "$CLOSED"; wait "$CLOSED" 2>/dev/null || true
pass "launched with fds 0-2 closed, the job's output goes to output.log"

# A job whose command is itself cusnap launch: the outer job's process is
# the inner job's supervisor, so that pid belongs to both. It is refused as
# ambiguous (exit 2, naming both jobs), not taken for "no such job".
launch_bg outer "$CUSNAP" launch --name inner -- sleep 60
OUTER=$LAUNCH_PID
wait_for 10 test -s "$CUSNAP_RUNTIME_BASE/inner/job.json" || fail "the inner job did not start: $(cat "$SCRATCH/outer.err")"
shared=$("$CUSNAP" ps --json | python3 -c 'import json,sys; print([j["pid"] for j in json.load(sys.stdin) if j["name"] == "outer"][0])')
for c in suspend inspect; do
  rc=0
  "$CUSNAP" $c "$shared" >"$SCRATCH/twice.out" 2>&1 || rc=$?
  [ "$rc" = 2 ] || fail "$c of a pid of two jobs exited $rc, expected 2: $(cat "$SCRATCH/twice.out")"
  grep -q "pid $shared belongs to more than one job (inner, outer): give the job's name instead" \
    "$SCRATCH/twice.out" || fail "$c of a pid of two jobs: $(cat "$SCRATCH/twice.out")"
done
[ "$("$CUSNAP" inspect inner --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["name"])')" = inner ] ||
  fail "inspect inner did not find the inner job"
kill "$OUTER"; wait "$OUTER" 2>/dev/null || true
pass "a pid of two jobs (a nested launch) is refused as ambiguous, naming both"

# --control-timeout stands for CUSNAP_CONTROL_TIMEOUT in the supervisor and
# the job (whose shims read it), not for the control socket alone.
got=$(CUSNAP_CONTROL_TIMEOUT=7 "$CUSNAP" launch --name ct --control-timeout 2.5 -- \
  sh -c 'echo "timeout [$CUSNAP_CONTROL_TIMEOUT]"' 2>&1)
grep -qxF "timeout [2.5]" <<<"$got" || fail "launch --control-timeout 2.5: the job saw $got"
got=$(CUSNAP_CONTROL_TIMEOUT=7 "$CUSNAP" launch --name ct -- sh -c 'echo "timeout [$CUSNAP_CONTROL_TIMEOUT]"' 2>&1)
grep -qxF "timeout [7]" <<<"$got" || fail "launch without --control-timeout: the job saw $got"
pass "launch --control-timeout is the job's and the supervisor's CUSNAP_CONTROL_TIMEOUT"
