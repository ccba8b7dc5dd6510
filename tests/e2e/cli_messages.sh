#!/usr/bin/env bash
# What a bad command line, a missing or unreadable checkpoint and an unusable
# runtime base say: what failed (an unknown option said to be one, with the
# option it likely stands for), with the documented exit status; and the
# --json objects of every command, success and failure, hold only the fields
# that their man page's --json entry names.
source "$(dirname "$0")/lib_checkpoint.sh"

# expect_err RC WHAT WORD... -- CMD...: CMD exits RC and its stderr holds
# each WORD; a WORD that starts with '!' must not be there.
expect_err() {
  local want=$1 what=$2 words=() rc=0
  shift 2
  while [ "$1" != -- ]; do words+=("$1"); shift; done
  shift
  "$@" >"$T/err.out" 2>"$T/err.err" || rc=$?
  [ "$rc" = "$want" ] || fail "$what: exit status $rc, expected $want (stderr: $(cat "$T/err.err"))"
  for w in "${words[@]}"; do
    if [ "${w:0:1}" = '!' ]; then
      ! grep -qF -- "${w:1}" "$T/err.err" || fail "$what: the error says '${w:1}': $(cat "$T/err.err")"
    else
      grep -qF -- "$w" "$T/err.err" || fail "$what: the error does not say '$w': $(cat "$T/err.err")"
    fi
  done
  pass "$what"
}

# An unknown option is called one, with the likely option (a typo) when
# there is one, in every command; an argument too many says the usage.
expect_err 2 "checkpoint --leave-runing" "unknown option '--leave-runing'; did you mean '--leave-running'?" -- \
  "$CUSNAP" checkpoint job --leave-runing
expect_err 2 "checkpoint --bogus" "unknown option '--bogus'" "!did you mean" "!not expected" -- \
  "$CUSNAP" checkpoint --bogus job
expect_err 2 "restore --detatch" "unknown option '--detatch'; did you mean '--detach'?" -- \
  "$CUSNAP" restore "$T/none" --detatch
expect_err 2 "restore --device-mapp=0=1" "unknown option '--device-mapp'; did you mean '--device-map'?" -- \
  "$CUSNAP" restore "$T/none" --device-mapp=0=1
expect_err 2 "suspend --timout 5" "unknown option '--timout'; did you mean '--timeout'?" -- \
  "$CUSNAP" suspend job --timout 5
expect_err 2 "ps --jsn" "unknown option '--jsn'; did you mean '--json'?" -- "$CUSNAP" ps --jsn
expect_err 2 "inspect -x" "unknown option '-x'" "!did you mean" -- "$CUSNAP" inspect -x job
expect_err 2 "launch --no-shin" "unknown option '--no-shin'; did you mean '--no-shim'?" "after '--'" -- \
  "$CUSNAP" launch --no-shin -- true
expect_err 2 "suspend a b" "unexpected argument 'b'" "cusnap suspend [OPTIONS] JOB" -- "$CUSNAP" suspend a b
# The exit status is the object's exit_code (2).
rc=0
"$CUSNAP" resume job --json --timout 5 >"$T/o.json" 2>/dev/null || rc=$?
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["exit_code"]==2==int(sys.argv[2]) and "did you mean '"'"'--timeout'"'"'" in d["error"], d' \
  "$T/o.json" "$rc" || fail "resume --json --timout: exit $rc: $(cat "$T/o.json")"
pass "resume --json --timout 5: the failure object says the same"

# An option before the command is said to be one, not taken for a mistyped
# command ("did you mean 'ps'?" for -v).
expect_err 2 "cusnap -v" "unknown option '-v'" "--version" "!did you mean" -- "$CUSNAP" -v
expect_err 2 "cusnap --versoin" "unknown option '--versoin'; did you mean '--version'?" -- "$CUSNAP" --versoin
expect_err 2 "cusnap --hlep" "unknown option '--hlep'; did you mean '--help'?" -- "$CUSNAP" --hlep
expect_err 2 "cusnap --json ps" "unknown option '--json' before the command" "did you mean 'cusnap ps --json'?" -- \
  "$CUSNAP" --json ps
expect_err 2 "cusnap --name x launch -- true" "did you mean 'cusnap launch --name x -- true'?" -- \
  "$CUSNAP" --name x launch -- true
expect_err 2 "cusnap chekpoint" "unknown command 'chekpoint'; did you mean 'checkpoint'?" -- "$CUSNAP" chekpoint
# With --json among the arguments, the failure object on stdout too (a
# script reads it); a --json after -- is the job's, not cusnap's.
for args in "chekpoint x --json" "--json ps"; do
  rc=0; "$CUSNAP" $args >"$T/o.json" 2>/dev/null || rc=$?
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ok"] is False and d["exit_code"]==2 and "unknown" in d["error"], d' \
    "$T/o.json" && [ "$rc" = 2 ] || fail "cusnap $args: exit $rc, stdout: $(cat "$T/o.json")"
done
rc=0; "$CUSNAP" lanch -- x --json >"$T/o.json" 2>/dev/null || rc=$?
[ "$rc" = 2 ] && [ ! -s "$T/o.json" ] || fail "cusnap lanch -- x --json: exit $rc, stdout: $(cat "$T/o.json")"
pass "a mistyped command given --json prints the failure object"
# --help, --version and version take no argument, help one COMMAND: more is
# a bad command line, not ignored.
for args in "--version junk" "version junk" "--help junk" "-h junk" "help checkpoint junk"; do
  read -r -a argv <<<"$args"
  expect_err 2 "cusnap $args" "unexpected argument 'junk'" "Run 'cusnap --help' for usage." -- "$CUSNAP" "${argv[@]}"
done
[ "$("$CUSNAP" version)" = "$("$CUSNAP" --version)" ] || fail "cusnap version and --version differ"

# An empty JOB or TARGET is a bad command line, as an empty DIR is.
expect_err 2 "checkpoint ''" "JOB" "empty" -- "$CUSNAP" checkpoint ''
expect_err 2 "suspend ''" "JOB" "empty" -- "$CUSNAP" suspend ''
expect_err 2 "inspect ''" "TARGET" "empty" -- "$CUSNAP" inspect ''
# A number is a name or a pid: the message says both were looked for.
expect_err 4 "checkpoint of a pid no job has" "no job named 4242424, nor with PID or SUPERV 4242424" \
  "cusnap ps" -- "$CUSNAP" checkpoint 4242424
# inspect NAME looks for a running job, then for the directory ./NAME: a
# failure says that neither is there.
mkdir -p "$T/here"
touch "$T/here/plain"
expect_err 4 "inspect of a name that is neither a job nor a directory here" \
  "no job named 'nonexist' is running (see cusnap ps), and there is no checkpoint directory ./nonexist" \
  -- env -C "$T/here" "$CUSNAP" inspect nonexist
expect_err 4 "inspect of a number that is neither a job nor a directory here" \
  "no job named 4242424, nor with PID or SUPERV 4242424" "and there is no checkpoint directory ./4242424" \
  -- env -C "$T/here" "$CUSNAP" inspect 4242424
# No job of that name, and ./NAME a file: taken as ./NAME would be (exit 5).
expect_err 5 "inspect of a name that is a file here" \
  "cannot inspect plain: no job of that name or pid is running, and ./plain is not a directory" \
  -- env -C "$T/here" "$CUSNAP" inspect plain

# A checkpoint directory that is not there (4), and one that is but cannot
# be searched by this user (1, Permission denied, not "no such").
expect_err 4 "restore of a missing directory" "cannot restore $T/none: No such file or directory" \
  "a checkpoint directory" -- "$CUSNAP" restore "$T/none"
mkdir -p "$T/private/ck"
chmod 700 "$T/private"
if command -v setpriv >/dev/null; then
  as_nobody=(setpriv --reuid=65534 --regid=65534 --clear-groups env "CUSNAP_RUNTIME_BASE=$T/nobody-base")
  expect_err 1 "restore of a directory this user cannot search" "cannot restore $T/private/ck: Permission denied" \
    "!no checkpoint directory" -- "${as_nobody[@]}" "$CUSNAP" restore "$T/private/ck"
  expect_err 1 "inspect of a directory this user cannot search" "cannot inspect $T/private/ck: Permission denied" -- \
    "${as_nobody[@]}" "$CUSNAP" inspect "$T/private/ck"
  # A checkpoint this user can reach but whose manifest (root's, mode 0600)
  # it cannot read: an error reading it (1) with what to do, not "not a
  # usable checkpoint" (5), for restore (with --detach too) and inspect.
  mkdir -m 755 "$T/shut"
  echo '{}' >"$T/shut/manifest.json"
  chmod 600 "$T/shut/manifest.json"
  chmod 711 "$T"
  for r in "restore" "restore --detach"; do
    # shellcheck disable=SC2086 # $r: the command and its option
    expect_err 1 "$r of a checkpoint whose manifest this user cannot read" \
      "cannot restore $T/shut: cannot read $T/shut/manifest.json: Permission denied" \
      "run the restore as a user who can read it (root)" "!not a usable checkpoint" -- \
      "${as_nobody[@]}" "$CUSNAP" $r "$T/shut"
  done
  expect_err 1 "inspect of a checkpoint whose manifest this user cannot read" \
    "cannot inspect $T/shut: cannot read $T/shut/manifest.json: Permission denied" \
    "inspect it as a user who can read it" "!not a usable checkpoint" -- \
    "${as_nobody[@]}" "$CUSNAP" inspect "$T/shut"
  rc=0
  "${as_nobody[@]}" "$CUSNAP" inspect "$T/shut" --json >"$T/shut.json" 2>"$T/shut.err" || rc=$?
  [ "$rc" = 1 ] && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ok"] is False and d["exit_code"]==1 and "Permission denied" in d["error"], d' "$T/shut.json" ||
    fail "inspect --json of an unreadable manifest: exit $rc: $(cat "$T/shut.json")"
  grep -q "cusnap: error: cannot inspect $T/shut" "$T/shut.err" ||
    fail "inspect --json of an unreadable manifest said nothing on stderr: $(cat "$T/shut.err")"
  rc=0
  "${as_nobody[@]}" "$CUSNAP" restore "$T/shut" --json >"$T/shut.json" 2>/dev/null || rc=$?
  [ "$rc" = 1 ] && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ok"] is False and d["exit_code"]==1 and "Permission denied" in d["error"], d' "$T/shut.json" ||
    fail "restore --json of an unreadable manifest: exit $rc: $(cat "$T/shut.json")"
  pass "restore --json and inspect --json of an unreadable manifest: exit_code 1"
  # A job's runtime directory of root's (0700, its lock hidden) given as
  # JOB: this user cannot look, which is no missing job (4) but an error (1).
  mkdir -m 700 "$T/rootrd"
  touch "$T/rootrd/lock"
  expect_err 1 "checkpoint of a runtime directory this user cannot look into" \
    "cannot look for a job in $T/rootrd: Permission denied" "run cusnap as the job's owner" -- \
    "${as_nobody[@]}" "$CUSNAP" checkpoint "$T/rootrd"
  chmod 700 "$T"
else
  echo "note: no setpriv: unreadable directories not tried"
fi

# A runtime base that cannot be used: what to do, as ps says it.
mkdir -m 755 "$T/openbase"
expect_err 1 "checkpoint with an unusable runtime base" "mode is 0755" "set CUSNAP_RUNTIME_BASE" -- \
  env "CUSNAP_RUNTIME_BASE=$T/openbase" "$CUSNAP" checkpoint foo

# --json: each command's object, on success and on failure, against the
# fields its man page's --json entry names.
launch docs "$T/docs.out" "$PATTERN_JOB" --mib 4 --interval-ms 20
SUP=$LAST_SUPERVISOR
wait_count "$T/docs.out" 3
PID=$(wait_job docs)
run_json() {  # run_json FILE CMD...: CMD's stdout into FILE, one JSON document
  local out=$1 rc=0
  shift
  "$@" >"$T/$out" 2>"$T/$out.err" || rc=$?
  python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$T/$out" ||
    fail "$* (exit $rc): stdout is not one JSON document: $(cat "$T/$out")"
}
run_json ck.json "$CUSNAP" checkpoint docs -o "$T/ck1" --leave-running --json
run_json suspend.json "$CUSNAP" suspend docs --json
run_json resume.json "$CUSNAP" resume docs --json
# A checkpoint the supervisor refuses (its directory is not empty): the
# failure object names the job and its state after the failure.
rc=0; "$CUSNAP" checkpoint docs -o "$T/ck1" --json >"$T/ck.refused.json" 2>/dev/null || rc=$?
[ "$rc" = 3 ] && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ok"] is False and d["exit_code"]==3 and d["name"]==d["job"]=="docs" and d["pid"]>0 and d["state"]=="running", d' "$T/ck.refused.json" ||
  fail "a refused checkpoint --json: exit $rc: $(cat "$T/ck.refused.json")"
rc=0; "$CUSNAP" resume docs --json >"$T/resume.refused.json" 2>/dev/null || rc=$?
[ "$rc" = 3 ] && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ok"] is False and d["name"]=="docs", d' "$T/resume.refused.json" ||
  fail "a refused resume --json: exit $rc: $(cat "$T/resume.refused.json")"
pass "a failure the supervisor answers names the job (and its state after a checkpoint's) in --json"
# Suspend of a suspended job and resume of a running one: refused (3),
# naming the command that helps.
expect_err 3 "resume of a running job" "job docs is not suspended" "cusnap suspend docs" -- \
  "$CUSNAP" resume docs
"$CUSNAP" suspend docs >/dev/null || fail "suspend docs failed"
expect_err 3 "suspend of a suspended job" "job docs is already suspended" "cusnap resume docs" -- \
  "$CUSNAP" suspend docs
"$CUSNAP" resume docs >/dev/null || fail "resume docs failed"
# A setting too long to send the supervisor: what it takes, and that
# unsetting it takes the default, as launch says of a bad value. Suspend
# and resume send only the settings they read: a checkpoint's own, however
# bad, refuses neither.
long=$(printf '1%.0s' $(seq 1 70))
CUSNAP_ALLOW_RANKS_SHARING_GPU=$long expect_err 2 "suspend with a 70-character CUSNAP_ALLOW_RANKS_SHARING_GPU" \
  "is neither 1 nor 0" "or unset it" -- "$CUSNAP" suspend docs
[ "$(job_field docs state)" = running ] || fail "a refused suspend changed the job's state"
CUSNAP_HASH_THREADS=$long CUSNAP_CRIU_GHOST_LIMIT=$long CUSNAP_CRIU_NETWORK_LOCK=$long \
  CUSNAP_CRIU_BREAKPOINTS=$long "$CUSNAP" suspend docs >"$T/susp.out" 2>&1 ||
  fail "suspend with 70-character checkpoint-only settings failed: $(cat "$T/susp.out")"
CUSNAP_RESTORE_MEMORY_MARGIN=$(printf '0%.0s' $(seq 1 70))1M expect_err 2 \
  "resume with a 72-character CUSNAP_RESTORE_MEMORY_MARGIN" "longer than 64 characters" -- "$CUSNAP" resume docs
[ "$(job_field docs state)" = suspended ] || fail "a refused resume changed the job's state"
CUSNAP_HASH_THREADS=$long CUSNAP_CRIU_GHOST_LIMIT=$long CUSNAP_ALLOW_RANKS_SHARING_GPU=$long \
  "$CUSNAP" resume docs >"$T/res.out" 2>&1 ||
  fail "resume with 70-character settings it does not read failed: $(cat "$T/res.out")"
pass "suspend and resume with 70-character settings they do not read"
CUSNAP_RESTORE_MEMORY_MARGIN=$(printf '0%.0s' $(seq 1 70))1M expect_err 2 \
  "checkpoint with a 72-character CUSNAP_RESTORE_MEMORY_MARGIN it takes" "longer than 64 characters" \
  "unset it for the default" -- "$CUSNAP" checkpoint docs -o "$T/long.ck"
[ ! -e "$T/long.ck" ] && [ "$(job_field docs state)" = running ] || fail "a refused setting changed something"
run_json ps.json "$CUSNAP" ps --json
run_json insj.json "$CUSNAP" inspect docs --json
run_json insc.json "$CUSNAP" inspect "$T/ck1" --json
# A job name in the manifest that cusnap does not accept: --json says a
# restore needs --name, as the text's verdict does.
# The name is changed in the text as cusnap writes it, and the manifest's
# own SHA-256 (manifest_sha256: that of the text less its line) computed
# again, or the manifest would be refused as altered.
cp -a "$T/ck1" "$T/badname"
python3 - "$T/badname/manifest.json" <<'PY'
import hashlib, re, sys
t = open(sys.argv[1], encoding="utf-8").read()
assert t.count('"name": "docs",') == 1, t
t = t.replace('"name": "docs",', '"name": "bad name",')
line = re.compile(r'^  "manifest_sha256": "[0-9a-f]{64}",\n', re.M)
assert len(line.findall(t)) == 1, t
digest = hashlib.sha256(line.sub("", t).encode()).hexdigest()
open(sys.argv[1], "w", encoding="utf-8").write(line.sub(f'  "manifest_sha256": "{digest}",\n', t))
PY
run_json insbad.json "$CUSNAP" inspect "$T/badname" --json
python3 - "$T/insc.json" "$T/insbad.json" <<'PY' || fail "inspect --json's needs_name: $(cat "$T/insc.json" "$T/insbad.json")"
import json, sys
good, bad = (json.load(open(f)) for f in sys.argv[1:])
assert good["needs_name"] is False and good["name"] == "docs", good
assert bad["needs_name"] is True and bad["name"] == "bad name", bad
PY
"$CUSNAP" inspect "$T/badname" >"$T/badname.txt" 2>&1 || true
grep -q "restorable with --name NAME only" "$T/badname.txt" ||
  fail "inspect of $T/badname: $(cat "$T/badname.txt")"
pass "inspect --json says needs_name for a manifest's job name cusnap does not accept"
# A directory given with a trailing slash reads as without it.
run_json insslash.json "$CUSNAP" inspect "$T/ck1/" --json
python3 - "$T/insslash.json" "$T/ck1" <<'PY' || fail "inspect --json of $T/ck1/: $(cat "$T/insslash.json")"
import json, os, sys
j = json.load(open(sys.argv[1]))
assert j["dir"] == os.path.abspath(sys.argv[2]) and j["valid"], j
PY
cp -a "$T/ck1" "$T/ckv"
rm "$(find "$T/ckv/criu" -name '*.img' | head -1)"
rc=0
"$CUSNAP" inspect "$T/ckv/" >"$T/ckv.out" 2>&1 || rc=$?
[ "$rc" = 5 ] || fail "inspect of a damaged checkpoint: exit $rc, expected 5: $(cat "$T/ckv.out")"
grep -qF "$T/ckv/criu/" "$T/ckv.out" && ! grep -qF "//" "$T/ckv.out" ||
  fail "inspect of $T/ckv/ names its files oddly: $(cat "$T/ckv.out")"
pass "a checkpoint given as DIR/ reads as DIR, in --json and in what a damaged one says"
# The restore it suggests is one shell word, whatever DIR holds; the
# supervisor is gone when it returns (no warning).
CK2="$T/ck 2's"
"$CUSNAP" checkpoint docs -o "$CK2" >"$T/ck2.out" 2>"$T/ck2.err" ||
  fail "checkpoint: $(cat "$T/ck2.out" "$T/ck2.err")"
[ ! -s "$T/ck2.err" ] || fail "checkpoint wrote on stderr: $(cat "$T/ck2.err")"
suggested=$(sed -n 's/^job docs stopped; restore it with: cusnap restore //p' "$T/ck2.out")
grep -qF "'\\''s'" <<<"$suggested" || fail "the suggested restore is not quoted: $suggested"
[ "$(eval "printf '%s' $suggested")" = "$CK2" ] || fail "the suggested restore names another directory: $suggested"
pass "checkpoint suggests 'cusnap restore DIR' with DIR quoted for the shell"
wait_exit "$SUP"
wait_gone "$PID"
run_json restore.json "$CUSNAP" restore "$CK2" --detach --json
kill -TERM "$(job_field docs supervisor_pid)"
run_json ck.fail.json "$CUSNAP" checkpoint nosuch --json
run_json suspend.fail.json "$CUSNAP" suspend nosuch --json
run_json resume.fail.json "$CUSNAP" resume nosuch --json
run_json insj.fail.json "$CUSNAP" inspect nosuch --json
run_json restore.fail.json "$CUSNAP" restore "$T/none" --json
run_json ps.fail.json "$CUSNAP" ps --json --bogus
M=${CUSNAP_SOURCE_DIR:-$(dirname "$0")/../..}/man
python3 - "$M" "$T" <<'PY' || fail "a --json object holds a field its man page does not name"
import json, re, sys
man, t = sys.argv[1], sys.argv[2]

def json_entry(page):
    """The words of the page's --json entry (OPTIONS), roff stripped."""
    lines, inside, words = open(f"{man}/{page}").read().split("\n"), False, set()
    options = False
    for line in lines:
        if line.startswith(".SH"):
            options = line.startswith(".SH OPTIONS")
            inside = False
            continue
        if options and line.startswith(".TP"):
            inside = False
            continue
        if options and re.fullmatch(r"\.B \\-\\-json", line):
            inside = True
            continue
        if inside:
            text = re.sub(r"\\f[BIRP]|\\\(dq|\\-", " ", line)
            text = re.sub(r"^\.[A-Z]+ ", "", text)
            words |= set(re.findall(r"[a-z_]+", text))
    return words

bad = []
def check(page, doc, what):
    words = json_entry(page)
    items = doc if isinstance(doc, list) else [doc]
    for item in items:
        for key in item:
            if key not in words:
                bad.append(f"{what}: field '{key}' is not in {page}'s --json entry")

load = lambda f: json.load(open(f"{t}/{f}"))
for f, page in [("ck.json", "cusnap-checkpoint.1"), ("ck.fail.json", "cusnap-checkpoint.1"),
                ("ck.refused.json", "cusnap-checkpoint.1"), ("resume.refused.json", "cusnap-suspend.1"),
                ("suspend.json", "cusnap-suspend.1"), ("suspend.fail.json", "cusnap-suspend.1"),
                ("resume.json", "cusnap-suspend.1"), ("resume.fail.json", "cusnap-suspend.1"),
                ("ps.json", "cusnap-ps.1"), ("ps.fail.json", "cusnap-ps.1"),
                ("insj.json", "cusnap-inspect.1"), ("insc.json", "cusnap-inspect.1"),
                ("insbad.json", "cusnap-inspect.1"),
                ("insj.fail.json", "cusnap-inspect.1"),
                ("restore.json", "cusnap-restore.1"), ("restore.fail.json", "cusnap-restore.1")]:
    check(page, load(f), f)
# inspect's "job" is as in ps --json: the same fields.
ps_keys = set(load("ps.json")[0])
job_keys = set(load("insj.json")["job"]) - {"root_pid"}
if ps_keys != job_keys:
    bad.append(f"inspect --json's job and ps --json differ: only in ps {sorted(ps_keys - job_keys)}, "
               f"only in inspect {sorted(job_keys - ps_keys)}")
for b in bad:
    print(b)
sys.exit(1 if bad else 0)
PY
pass "every --json object (checkpoint, suspend, resume, ps, inspect, restore; success and failure) holds only the fields its man page names; inspect's job is ps's"

# ps: the NAME column is as wide as the longest name shown, and the other
# columns line up under their headings.
LONGNAME=$(printf 'n%.0s' $(seq 1 45))
launch "$LONGNAME" "$T/longname.out" sleep 60
LONG_SUP=$LAST_SUPERVISOR
launch s "$T/s.out" sleep 60
S_SUP=$LAST_SUPERVISOR
wait_job "$LONGNAME" >/dev/null
wait_job s >/dev/null
"$CUSNAP" ps >"$T/ps.txt" 2>&1 || fail "ps failed: $(cat "$T/ps.txt")"
python3 - "$T/ps.txt" "$LONGNAME" <<'PY' || fail "ps's columns do not line up: $(cat "$T/ps.txt")"
import re, sys
lines = open(sys.argv[1]).read().splitlines()
head = lines[0]
rows = [re.match(r"(\S+) +(\d+) +(\d+) (\S+)", l) for l in lines[1:] if not l[:1] in "*!"]
names = [m.group(1) for m in rows]
assert sys.argv[2] in names and "s" in names, names
for m in rows:
    assert m.end(2) == head.index("PID") + 3, (head, m.group(0))
    assert m.end(3) == head.index("SUPERV") + 6, (head, m.group(0))
    assert m.start(4) == head.index("STATE"), (head, m.group(0))
assert head.index("PID") <= len(sys.argv[2]) + 6, head
PY
kill -TERM "$LONG_SUP" "$S_SUP"
wait_exit "$LONG_SUP"
wait_exit "$S_SUP"
pass "ps's NAME column is as wide as a 45-character name, and no wider"

# A control byte in what the user typed reaches the terminal escaped (an
# escape sequence would act on it), in every kind of error.
for args in "checkpoint|$(printf 'a\033[31mb')" "restore|$(printf '/no\033[2Jx')" \
  "launch|-n|$(printf 'x\033y')|--|true" "$(printf 'ch\033eckpoint')"; do
  IFS='|' read -r -a argv <<<"$args"
  rc=0
  "$CUSNAP" "${argv[@]}" >"$T/esc.out" 2>"$T/esc.err" || rc=$?
  [ "$rc" != 0 ] || fail "cusnap ${argv[*]} succeeded"
  ! grep -q $'\033' "$T/esc.err" || fail "cusnap ${argv[0]}: an escape byte reached stderr: $(od -c "$T/esc.err" | head -3)"
  grep -qF '\x1b' "$T/esc.err" || fail "cusnap ${argv[0]}: the escape byte is not shown as \\x1b: $(cat "$T/esc.err")"
done
pass "control bytes in a job name, a path, a --name and a command are shown as \\x1b in the errors"

# A supervisor whose details parse but are not what a command reads (not an
# object, or a "job" that is not one): inspect says they are malformed (1),
# suspend and resume, whose details only add to the summary, succeed; none
# aborts.
FAKE=$T/fakebase/fake
mkdir -p -m 0700 "$T/fakebase" "$FAKE"
cat >"$T/fake_supervisor.py" <<'PY'
import fcntl, json, os, socket, struct, sys
d, answers = sys.argv[1], sys.argv[2:]
lock = open(f"{d}/lock", "w")
fcntl.flock(lock, fcntl.LOCK_EX)
json.dump({"name": "fake", "root_pid": os.getpid(), "supervisor_pid": os.getpid(), "argv": ["x"],
           "owner_uid": os.geteuid(), "state": "running", "runtime_dir": d}, open(f"{d}/job.json", "w"))
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(f"{d}/control.sock")
srv.listen(8)
def s(text):
    b = text.encode()
    return (bytes([0xa0 | len(b)]) if len(b) < 32 else bytes([0xd9, len(b)])) + b
for details in answers:
    c, _ = srv.accept()
    n = struct.unpack("<I", c.recv(4, socket.MSG_WAITALL))[0]
    c.recv(n, socket.MSG_WAITALL)
    body = (b"\x93\x01" + s("result") + b"\x84" + s("ok") + b"\xc3" + s("exit_code") + b"\x00" +
            s("message") + s("") + s("details") + s(details))
    c.sendall(struct.pack("<I", len(body)) + body)
    c.close()
PY
python3 "$T/fake_supervisor.py" "$FAKE" '[1]' '[1]' '{"job": 5}' '{"job": {"name": 5}}' '[1]' '7' &
FAKE_SUP=$!
SUPERVISORS+=("$FAKE_SUP")
for _ in $(seq 100); do [ -S "$FAKE/control.sock" ] && break; sleep 0.1; done
for args in "inspect fake" "inspect fake --json" "inspect fake" "inspect fake"; do
  read -r -a argv <<<"$args"
  CUSNAP_RUNTIME_BASE=$T/fakebase expect_err 1 "$args, details not an object or without a job object" \
    "the job's supervisor sent details this cusnap cannot read" "use that version" -- "$CUSNAP" "${argv[@]}"
done
for args in "suspend fake --json" "resume fake --json"; do
  read -r -a argv <<<"$args"
  CUSNAP_RUNTIME_BASE=$T/fakebase run_json fake.json "$CUSNAP" "${argv[@]}"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ok"] is True, d' "$T/fake.json" ||
    fail "$args with details that are not an object: $(cat "$T/fake.json" "$T/fake.json.err")"
done
wait "$FAKE_SUP" || fail "the fake supervisor failed"
pass "details that are not an object, or whose job is not one, are malformed to inspect and ignored by suspend and resume"

# launch without --name says the name it chose, on a terminal only: script(1)
# gives it one; with stderr captured the job's output is all there is.
if command -v script >/dev/null; then
  script -qec "$(printf '%q ' "$CUSNAP" launch --no-shim -- sh -c 'echo out-of-the-job')" /dev/null \
    >"$T/tty.out" 2>&1 || fail "launch on a terminal failed: $(cat "$T/tty.out")"
  grep -qE "^cusnap: job sh-[A-Za-z0-9._-]+ \(cusnap ps lists it\)" "$T/tty.out" ||
    fail "launch on a terminal did not say the job's name: $(cat "$T/tty.out")"
  grep -q "out-of-the-job" "$T/tty.out" || fail "the job's output is missing: $(cat "$T/tty.out")"
  script -qec "$(printf '%q ' "$CUSNAP" launch --no-shim --name given -- true)" /dev/null \
    >"$T/tty.out" 2>&1 || fail "launch --name on a terminal failed: $(cat "$T/tty.out")"
  ! grep -q "cusnap: job" "$T/tty.out" || fail "launch --name said the name it was given: $(cat "$T/tty.out")"
  "$CUSNAP" launch --no-shim -- sh -c 'echo out-of-the-job' >"$T/notty.out" 2>"$T/notty.err" ||
    fail "launch failed: $(cat "$T/notty.err")"
  [ ! -s "$T/notty.err" ] || fail "launch with stderr captured wrote: $(cat "$T/notty.err")"
  pass "launch without --name says the job's name on a terminal, and only there"
else
  echo "note: no script(1): the terminal case was not tried"
fi
echo "PASS"
