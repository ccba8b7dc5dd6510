#!/usr/bin/env bash
# A job whose command line and working directory are not UTF-8 (bytes a
# Latin-1 file name carries) is launched, listed, inspected, checkpointed and
# restored like any other: what cusnap records as JSON (job.json, the
# manifest, --json output) shows each bad byte as U+FFFD, and no supervisor
# ends on it. A checkpoint or runtime directory that is not UTF-8 is refused
# before anything is made, as cusnap could not record it whole.
source "$(dirname "$0")/lib_checkpoint.sh"

BAD=$'caf\xe9'
mkdir -p "$T/dir-$BAD"
cd "$T/dir-$BAD"
# The shell stays (the pattern job is its child), so its /proc cmdline, read
# into the manifest's processes, carries the bytes too.
launch bytes "$T/bytes.out" sh -c '"$0" --mib 4 --interval-ms 20; exit $?' "$PATTERN_JOB" "$BAD"
SUP=$LAST_SUPERVISOR
wait_count "$T/bytes.out" 5
PID=$(wait_job bytes)
cd "$T"
kill -0 "$SUP" 2>/dev/null || fail "the supervisor ended: $(cat "$T/bytes.out")"
pass "launched from a directory and with an argument that are not UTF-8"

"$CUSNAP" ps >"$T/ps.out" 2>&1 || fail "cusnap ps failed: $(cat "$T/ps.out")"
grep -q '^bytes ' "$T/ps.out" || fail "cusnap ps does not list the job: $(cat "$T/ps.out")"
"$CUSNAP" ps --json >"$T/ps.json" || fail "cusnap ps --json failed"
"$CUSNAP" inspect bytes --json >"$T/inspect.json" || fail "cusnap inspect --json failed"
"$CUSNAP" inspect bytes >"$T/inspect.out" || fail "cusnap inspect failed"
python3 - "$T/ps.json" "$T/inspect.json" <<'PY' || fail "the JSON of ps or inspect is wrong"
import json, sys
jobs = [j for j in json.load(open(sys.argv[1])) if j["name"] == "bytes"]
assert len(jobs) == 1, jobs
assert jobs[0]["argv"][-1] == "caf\ufffd", jobs[0]["argv"]
assert jobs[0]["cwd"].endswith("dir-caf\ufffd"), jobs[0]["cwd"]
text = open(sys.argv[2], encoding="utf-8").read()
ins = json.loads(text)
# The same job, named the same way as ps names it.
assert ins["ok"] is True and ins["kind"] == "job", ins
assert ins["job"]["pid"] == jobs[0]["pid"] == ins["job"]["root_pid"], (ins["job"], jobs[0])
assert ins["job"]["name"] == jobs[0]["name"], ins["job"]
assert "caf\ufffd" in text, text
PY
pass "ps and inspect show the bytes, replaced, as valid JSON"

# Directories cusnap must record whole: refused, nothing made.
expect_refused 2 "is not valid UTF-8" "$CUSNAP" checkpoint bytes -o "$T/ckpt-$BAD"
[ ! -e "$T/ckpt-$BAD" ] || fail "the refused checkpoint made its directory"
expect_refused 2 "runtime-dir.*is not valid UTF-8" "$CUSNAP" launch --name rt --runtime-dir "$T/run-$BAD" -- true
expect_refused 3 "is not valid UTF-8" env CUSNAP_RUNTIME_BASE="$T/base-$BAD" "$CUSNAP" launch --name rt -- true
[ ! -e "$T/base-$BAD" ] || fail "the refused launch made its runtime base"
[ ! -e "$T/run-$BAD" ] || fail "the refused launch made its runtime directory"
# A path longer than any the supervisor takes is refused by the command,
# naming -o (not as a request from another program).
long=$T$(for _ in $(seq 17); do printf '/%0250d' 0; done)
expect_refused 2 "bytes long, more than the 4096 a path may be: give -o a shorter one" \
  "$CUSNAP" checkpoint bytes -o "$long"
[ ! -e "$T/$(printf '%0250d' 0)" ] || fail "the refused checkpoint made a directory"
expect_running bytes "$PID" "$T/bytes.out"
pass "a checkpoint or runtime directory that is not UTF-8, or a checkpoint directory too long, is refused, the job runs on"

"$CUSNAP" checkpoint bytes -o "$T/ckpt" >"$T/ckpt.out" 2>&1 || fail "checkpoint failed: $(cat "$T/ckpt.out")"
wait_exit "$SUP"
[ "$EXIT_RC" = 0 ] || fail "the supervisor of the checkpointed job exited $EXIT_RC, expected 0"
wait_gone "$PID"
LAST=$(last_count "$T/bytes.out")
python3 - "$T/ckpt/manifest.json" <<'PY' || fail "the manifest is not the job's, or not valid JSON"
import json, sys
m = json.load(open(sys.argv[1], encoding="utf-8"))
assert m["job"]["argv"][-1] == "caf\ufffd", m["job"]["argv"]
assert any("caf\ufffd" in " ".join(p.get("cmdline", [])) for p in m["processes"]), m["processes"]
PY
"$CUSNAP" inspect "$T/ckpt" --json >"$T/inspect-ckpt.json" || fail "inspect of the checkpoint failed"
pass "checkpointed at count $LAST; the manifest holds the bytes, replaced"

restore_continues "$T/ckpt" "$T/restore.out" bytes "$PID" "$LAST"
pass "restored, continuing at count $FIRST"
kill -TERM "$SUP"
wait_exit "$SUP"
