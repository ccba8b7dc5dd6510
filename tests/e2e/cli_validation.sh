#!/usr/bin/env bash
# The command line is checked before anything runs: bad values are usage
# errors (exit status 2) that name the option or the entry and say what is
# expected, with a JSON object on stdout when --json was asked for; a
# relative --runtime-dir is taken from the current directory, so that the
# job's link in the runtime base works from anywhere (ps from another
# directory keeps it, a restore finds it).
source "$(dirname "$0")/lib_checkpoint.sh"

# expect_usage WHAT WORD... -- CMD...: CMD exits 2 and its error names each WORD.
expect_usage() {
  local what=$1 words=() rc=0
  shift
  while [ "$1" != -- ]; do words+=("$1"); shift; done
  shift
  "$@" >"$T/usage.out" 2>"$T/usage.err" || rc=$?
  [ "$rc" = 2 ] || fail "$what: exit status $rc, expected 2 (stderr: $(cat "$T/usage.err"))"
  for w in "${words[@]}"; do
    grep -qF -- "$w" "$T/usage.err" || fail "$what: the error does not say '$w': $(cat "$T/usage.err")"
  done
  pass "$what"
}

# --device-map: each entry OLD=NEW, each side an index or a GPU UUID, each
# OLD and each NEW once. (Checked before the directory is looked at.)
expect_usage "--device-map a=b" "'a'" "GPU index" "GPU UUID" -- "$CUSNAP" restore "$T/none" --device-map a=b
expect_usage "--device-map 0=0=0" "'0=0=0'" "OLD=NEW" -- "$CUSNAP" restore "$T/none" --device-map 0=0=0
expect_usage "--device-map with OLD twice" "'0=1'" "'0=2'" "each OLD GPU once" -- \
  "$CUSNAP" restore "$T/none" --device-map 0=1,0=2
expect_usage "--device-map with OLD twice, by another spelling" "'0=1'" "'00=2'" -- \
  "$CUSNAP" restore "$T/none" --device-map 0=1,00=2
expect_usage "--device-map with two OLD onto one NEW" "'0=2'" "'1=2'" "different NEW" -- \
  "$CUSNAP" restore "$T/none" --device-map 0=2,1=2
expect_usage "--device-map with a malformed UUID" "'GPU-12'" -- \
  "$CUSNAP" restore "$T/none" --device-map GPU-12=0
# 32 hex digits, but not grouped 8-4-4-4-12 as nvidia-smi -L writes them.
expect_usage "--device-map with a UUID's dashes misplaced" "'GPU-7-786ba57c-0384fe8b3cd-b745a07c38e0'" -- \
  "$CUSNAP" restore "$T/none" --device-map GPU-7-786ba57c-0384fe8b3cd-b745a07c38e0=0
expect_usage "--device-map with a UUID without dashes" "'GPU-7786ba57c0384fe8b3cdb745a07c38e0'" -- \
  "$CUSNAP" restore "$T/none" --device-map GPU-7786ba57c0384fe8b3cdb745a07c38e0=0
expect_usage "an empty --device-map" "--device-map" -- "$CUSNAP" restore "$T/none" --device-map ''
# An empty entry is named as one; each of these is a usage error said as
# every other is, with the line on --help.
expect_usage "--device-map with an empty last entry" "--device-map: entry 2 of '0=1,' is empty" \
  "Run 'cusnap restore --help' for usage." -- "$CUSNAP" restore "$T/none" --device-map 0=1,
expect_usage "--device-map with an empty first entry" "entry 1 of ',0=1' is empty" -- \
  "$CUSNAP" restore "$T/none" --device-map ,0=1
expect_usage "--device-map a=b, the usage line" "Run 'cusnap restore --help' for usage." -- \
  "$CUSNAP" restore "$T/none" --device-map a=b
# The exit status is the object's exit_code (2).
rc=0
"$CUSNAP" restore "$T/none" --device-map 0=1, --json >"$T/dm.json" 2>/dev/null || rc=$?
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["exit_code"]==2==int(sys.argv[2]) and "is empty" in d["error"], d' \
  "$T/dm.json" "$rc" || fail "restore --json --device-map 0=1,: exit $rc: $(cat "$T/dm.json")"
pass "restore --json --device-map 0=1,: the failure object says the same"
rc=0
"$CUSNAP" restore "$T/none" --device-map 0=1,1=0,gpu-00000000-0000-0000-0000-00000000000A=2 \
  2>"$T/usage.err" || rc=$?
[ "$rc" = 4 ] || fail "a valid --device-map: exit status $rc, expected 4 (no such directory): $(cat "$T/usage.err")"
pass "a valid --device-map (a swap and a UUID with a lower-case gpu- prefix and an upper-case digit) passes the command line"

# --timeout and --control-timeout: a value that rounds to 0 ms names the option and the range.
expect_usage "checkpoint --timeout 0.0001" "--timeout" "0.001" "604800" -- "$CUSNAP" checkpoint nosuch --timeout 0.0001
expect_usage "suspend --timeout 0" "--timeout" "0.001" -- "$CUSNAP" suspend nosuch --timeout 0
expect_usage "restore --timeout 1e9" "--timeout" "604800" -- "$CUSNAP" restore "$T/none" --timeout 1e9
expect_usage "launch --control-timeout 0" "--control-timeout" "31536000" -- "$CUSNAP" launch --control-timeout 0 -- true
# --timeout is plain decimal digits, at least 0.001: no hex, exponent, sign
# or blank (strtod's), nothing that only rounds up to 1 ms.
for bad in 0x3c " 60" "60 " 6e1 +60 .5 5. 0.0005 0.000999; do
  expect_usage "checkpoint --timeout '$bad'" "--timeout" "'$bad' is not a number of seconds from 0.001" -- \
    "$CUSNAP" checkpoint nosuch --timeout "$bad"
done
[ "$("$CUSNAP" checkpoint nosuch --timeout 604800 2>/dev/null; echo $?)" = 4 ] ||
  fail "checkpoint --timeout 604800 is refused"
# --control-timeout takes what CUSNAP_CONTROL_TIMEOUT takes: up to a year.
expect_usage "restore --control-timeout 31536001" "--control-timeout" "31536000" -- \
  "$CUSNAP" restore "$T/none" --control-timeout 31536001
"$CUSNAP" launch --control-timeout 31536000 -- true || fail "launch --control-timeout 31536000 is refused"
CUSNAP_CONTROL_TIMEOUT=31536000 "$CUSNAP" launch -- true || fail "CUSNAP_CONTROL_TIMEOUT=31536000 is refused"
CUSNAP_CONTROL_TIMEOUT=31536001 expect_usage "CUSNAP_CONTROL_TIMEOUT=31536001" "31536000" -- "$CUSNAP" launch -- true
pass "--control-timeout and CUSNAP_CONTROL_TIMEOUT both take up to 31536000 seconds"
# ... and plain decimals only, as --timeout.
for bad in 0x10 1e3 +5 " 5" inf .5; do
  expect_usage "launch --control-timeout '$bad'" "--control-timeout" "is not a number of seconds" -- \
    "$CUSNAP" launch --control-timeout "$bad" -- true
  CUSNAP_CONTROL_TIMEOUT=$bad expect_usage "CUSNAP_CONTROL_TIMEOUT='$bad'" \
    "CUSNAP_CONTROL_TIMEOUT=" "is not a number of seconds" -- "$CUSNAP" launch -- true
done
[ "$("$CUSNAP" checkpoint nosuch --timeout 0.001 2>/dev/null; echo $?)" = 4 ] ||
  fail "checkpoint --timeout 0.001 is refused"
pass "checkpoint --timeout 0.001 is accepted"

# Names and directories.
expect_usage "launch --name with a space" "invalid job name 'a b'" -- "$CUSNAP" launch --name 'a b' -- true
expect_usage "launch --name ''" "--name" "invalid job name ''" -- "$CUSNAP" launch --name '' -- true
expect_usage "restore --name ''" "--name" -- "$CUSNAP" restore "$T/none" --name ''
expect_usage "restore -n .x" "invalid job name '.x'" -- "$CUSNAP" restore "$T/none" -n .x
expect_usage "checkpoint -o ''" "--output" "empty" -- "$CUSNAP" checkpoint nosuch -o ''
expect_usage "launch --runtime-dir ''" "--runtime-dir" "empty" -- "$CUSNAP" launch --runtime-dir '' -- true
# Settings of the environment: what the shim would quietly replace by its
# default, and what any command or supervisor reads, are refused up front.
CUSNAP_SHIM_COPY_THREADS=100 expect_usage "launch with CUSNAP_SHIM_COPY_THREADS=100" \
  'CUSNAP_SHIM_COPY_THREADS="100"' "from 1 to 64" -- "$CUSNAP" launch -- true
CUSNAP_SHIM_STAGING_MIB=32M expect_usage "launch with CUSNAP_SHIM_STAGING_MIB=32M" \
  'CUSNAP_SHIM_STAGING_MIB="32M"' "MiB from 1 to 1024" -- "$CUSNAP" launch -- true
CUSNAP_CUT_HOLD_MS=-5 expect_usage "launch with CUSNAP_CUT_HOLD_MS=-5" 'CUSNAP_CUT_HOLD_MS="-5"' -- \
  "$CUSNAP" launch -- true
CUSNAP_SHIM_TRACK=false expect_usage "launch with CUSNAP_SHIM_TRACK=false" \
  'CUSNAP_SHIM_TRACK="false" is neither 0 nor 1' -- "$CUSNAP" launch -- true
CUSNAP_SHIM_LEGACY_VMM=off expect_usage "launch with CUSNAP_SHIM_LEGACY_VMM=off" \
  'CUSNAP_SHIM_LEGACY_VMM="off" is neither 0 nor 1' -- "$CUSNAP" launch -- true
CUSNAP_SHIM_DIRECT_IO=yes expect_usage "launch with CUSNAP_SHIM_DIRECT_IO=yes" \
  "off, auto and on" -- "$CUSNAP" launch -- true
CUSNAP_COLLECTIVE_KERNELS=,,, expect_usage "launch with CUSNAP_COLLECTIVE_KERNELS=,,," \
  'CUSNAP_COLLECTIVE_KERNELS=",,,"' "1 to 8 kernel name prefixes" -- "$CUSNAP" launch -- true
CUSNAP_COLLECTIVE_KERNELS=a,b,c,d,e,f,g,h,ncclKernel expect_usage \
  "launch with nine CUSNAP_COLLECTIVE_KERNELS prefixes" "1 to 8 kernel name prefixes" -- \
  "$CUSNAP" launch -- true
CUSNAP_SAVE_PARTS=0 expect_usage "launch --no-shim with CUSNAP_SAVE_PARTS=0" \
  'CUSNAP_SAVE_PARTS="0"' "from 1 to 64" -- "$CUSNAP" launch --no-shim -- true
CUSNAP_GUARDIAN_CRIU_WAIT_MS=1m expect_usage "restore with CUSNAP_GUARDIAN_CRIU_WAIT_MS=1m" \
  'CUSNAP_GUARDIAN_CRIU_WAIT_MS="1m"' -- "$CUSNAP" restore "$T/none"
CUSNAP_CRIU_KILL_GRACE_MS=5s expect_usage "launch with CUSNAP_CRIU_KILL_GRACE_MS=5s" \
  'CUSNAP_CRIU_KILL_GRACE_MS="5s"' "from 0 to 3600000" -- "$CUSNAP" launch -- true
CUSNAP_NETWORK_UNLOCK_TIMEOUT_MS=50 expect_usage "restore with CUSNAP_NETWORK_UNLOCK_TIMEOUT_MS=50" \
  'CUSNAP_NETWORK_UNLOCK_TIMEOUT_MS="50"' "from 100 to 3600000" -- "$CUSNAP" restore "$T/none"
CUSNAP_CONTROL_TIMEOUT=30s expect_usage "ps with CUSNAP_CONTROL_TIMEOUT=30s" \
  'CUSNAP_CONTROL_TIMEOUT="30s"' "seconds" -- "$CUSNAP" ps
rc=0
CUSNAP_CONTROL_TIMEOUT=30s "$CUSNAP" ps --json >"$T/ct.json" 2>/dev/null || rc=$?
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["exit_code"]==2==int(sys.argv[2]) and "CUSNAP_CONTROL_TIMEOUT" in j["error"], j' \
  "$T/ct.json" "$rc" ||
  fail "ps --json with a bad CUSNAP_CONTROL_TIMEOUT: exit $rc, expected 2 with a failure object saying so: $(cat "$T/ct.json")"
CUSNAP_CONTROL_TIMEOUT=30s "$CUSNAP" ps --help >/dev/null || fail "ps --help refused for a bad CUSNAP_CONTROL_TIMEOUT"
CUSNAP_SHIM_COPY_THREADS=100 "$CUSNAP" launch --no-shim -- true ||
  fail "launch --no-shim refused a setting only the shim reads"
[ -z "$(find "$CUSNAP_RUNTIME_BASE" -mindepth 1 -maxdepth 1 ! -name .lock 2>/dev/null)" ] ||
  fail "a refused launch left $(ls -A "$CUSNAP_RUNTIME_BASE") in the runtime base"

# A runtime base that cannot be searched is a failure (exit 1) with its
# reason, not "no such job" (4); ps says the same.
mkdir -m 755 "$T/openbase"
for c in suspend resume inspect checkpoint; do
  rc=0
  CUSNAP_RUNTIME_BASE=$T/openbase "$CUSNAP" $c foo >/dev/null 2>"$T/base.err" || rc=$?
  [ "$rc" = 1 ] || fail "$c with an unusable runtime base exited $rc, expected 1: $(cat "$T/base.err")"
  grep -q "cannot look for job 'foo'.*mode is 0755" "$T/base.err" || fail "$c: $(cat "$T/base.err")"
  grep -q "make it private (chmod 700) if it is cusnap's, or set CUSNAP_RUNTIME_BASE to the runtime base" \
    "$T/base.err" || fail "$c: no remedy for a base open to others: $(cat "$T/base.err")"
done
# A base that is no directory: no chmod to suggest, and CUSNAP_RUNTIME_BASE
# (the user's choice) is not to be moved away.
touch "$T/filebase"
rc=0
CUSNAP_RUNTIME_BASE=$T/filebase "$CUSNAP" ps >/dev/null 2>"$T/base.err" || rc=$?
[ "$rc" = 1 ] || fail "ps with a file for a runtime base exited $rc: $(cat "$T/base.err")"
grep -q "is not a directory: cusnap cannot list its jobs; set CUSNAP_RUNTIME_BASE to the runtime base" \
  "$T/base.err" || fail "ps with a file for a runtime base: $(cat "$T/base.err")"
pass "an unusable runtime base: exit 1 with the reason, for suspend, resume, inspect and checkpoint"

# Too few descriptors for a launch: exit 1, saying which descriptor could not
# be made and what to do, and nothing left in the runtime base. The limit at
# which each step fails depends on what the shell passes down: a few limits
# are tried, and at least one must fail. (At the lowest the loader may fail
# first, before cusnap runs: such a limit is left out.)
failed_low=0
for n in 4 5 6 7 8 9 10 11 12 13 14 15 16; do
  rc=0
  (ulimit -n $n && exec "$CUSNAP" launch --no-shim -- true) >/dev/null 2>"$T/nofile.err" || rc=$?
  [ "$rc" = 0 ] && continue
  [ "$rc" = 127 ] && grep -q "error while loading shared libraries" "$T/nofile.err" && continue
  [ "$rc" = 1 ] || fail "launch with ulimit -n $n exited $rc, expected 0 or 1: $(cat "$T/nofile.err")"
  grep -q 'Too many open files (this process reached its limit of [0-9]* open files: raise "ulimit -n"' \
    "$T/nofile.err" || fail "launch with ulimit -n $n: no remedy: $(cat "$T/nofile.err")"
  failed_low=$((failed_low + 1))
  # Checked after each failure (a later launch may clean what it left).
  left=$(find "$CUSNAP_RUNTIME_BASE" -mindepth 1 -maxdepth 1 ! -name .lock -printf '%f ' 2>/dev/null)
  [ -z "$left" ] || fail "a launch with ulimit -n $n left $left in the runtime base: $(cat "$T/nofile.err")"
done
[ "$failed_low" -gt 0 ] || fail "no launch failed with ulimit -n 4 to 16"
pass "a launch short of descriptors: exit 1 naming the descriptor and \"ulimit -n\" ($failed_low of 13 limits)"

# cusnap help COMMAND.
expect_usage "help of an unknown command" "'nosuch'" -- "$CUSNAP" help nosuch
"$CUSNAP" help ps >/dev/null || fail "cusnap help ps failed"
for a in help --help -h; do
  "$CUSNAP" help $a >"$T/help.out" 2>&1 || fail "cusnap help $a failed: $(cat "$T/help.out")"
  grep -q '^usage: cusnap COMMAND' "$T/help.out" || fail "cusnap help $a: $(head -3 "$T/help.out")"
done
"$CUSNAP" help version >"$T/help.out" 2>&1 || fail "cusnap help version failed: $(cat "$T/help.out")"
"$CUSNAP" launch --help >"$T/help.out" || fail "launch --help failed"
grep -q '^Usage: cusnap launch \[OPTIONS\] -- CMD \[ARGS...\]' "$T/help.out" ||
  fail "launch's usage line lacks '-- CMD': $(head -3 "$T/help.out")"
grep -q -- '--control-timeout.*default: \$CUSNAP_CONTROL_TIMEOUT or 10' "$T/help.out" ||
  fail "launch --help lacks the --control-timeout default"
grep -q -- '--timeout.*allowance that grows with memory' <<<"$("$CUSNAP" checkpoint --help)" ||
  fail "checkpoint --help does not mention the memory-scaled allowance"
pass "help: unknown command refused, launch's usage names CMD, defaults shown"
# --runtime-dir's default, as runtime_base() finds the base: each case said.
for c in launch restore; do
  "$CUSNAP" $c --help | grep -F -- '--runtime-dir' >"$T/rd.help" || fail "$c --help lacks --runtime-dir"
  for w in 'default: BASE/NAME' '$CUSNAP_RUNTIME_BASE when set' '/run/cusnap for root' \
    '$XDG_RUNTIME_DIR/cusnap when XDG_RUNTIME_DIR is set' '/tmp/cusnap-UID'; do
    grep -qF -- "$w" "$T/rd.help" || fail "$c --help: --runtime-dir's default does not say '$w': $(cat "$T/rd.help")"
  done
done
pass "help: --runtime-dir's default names each base (CUSNAP_RUNTIME_BASE, /run/cusnap, XDG_RUNTIME_DIR, /tmp/cusnap-UID)"

# An option's value that is '--' (the end of the options) or another option
# of the command is a missing value, not taken for the value.
expect_usage "launch -n -- true" "-n: 1 required NAME missing" "'--' after it ends the options" -- \
  "$CUSNAP" launch -n -- true
expect_usage "launch --runtime-dir -- true" "--runtime-dir: 1 required DIR missing" -- \
  "$CUSNAP" launch --runtime-dir -- true
expect_usage "launch --control-timeout -- true" "--control-timeout: 1 required SECONDS missing" -- \
  "$CUSNAP" launch --control-timeout -- true
expect_usage "checkpoint JOB -o --" "-o: 1 required DIR missing" -- "$CUSNAP" checkpoint nosuch -o --
expect_usage "checkpoint JOB -o --leave-running" "-o: 1 required DIR missing" \
  "'--leave-running' after it is an option of cusnap checkpoint" "--output=--leave-running" -- \
  "$CUSNAP" checkpoint nosuch -o --leave-running
expect_usage "restore DIR --runtime-dir --" "--runtime-dir: 1 required DIR missing" -- \
  "$CUSNAP" restore "$T/none" --runtime-dir --
expect_usage "restore DIR --name --json" "--name: 1 required NAME missing" -- \
  "$CUSNAP" restore "$T/none" --name --json
expect_usage "suspend JOB --timeout --" "--timeout: 1 required SECONDS missing" -- \
  "$CUSNAP" suspend nosuch --timeout --
[ ! -e ./-- ] && [ ! -e "$T/--" ] || fail "a '--' value made a directory"
# The job's own arguments are the job's: '-n --' after CMD is not looked at.
"$CUSNAP" launch --name own true -n -- || fail "launch --name own true -n -- failed"
pass "an option value of '--' or of an option is a missing value (exit 2); after CMD the job's"

# --json: a bad command line prints the failure object too.
# json_usage WHAT CMD...: CMD exits 2 with {"ok": false, "exit_code": 2, "error"} on stdout.
json_usage() {
  local what=$1 rc=0
  shift
  "$@" >"$T/json.out" 2>"$T/json.err" || rc=$?
  [ "$rc" = 2 ] || fail "$what: exit status $rc, expected 2"
  python3 - "$T/json.out" <<'PY' || fail "$what: no JSON failure on stdout: $(cat "$T/json.out")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ok"] is False and d["exit_code"] == 2 and d["error"], d
PY
  pass "$what"
}
json_usage "checkpoint --json without JOB" "$CUSNAP" checkpoint --json
json_usage "ps --json with an unknown option" "$CUSNAP" ps --json --bogus
json_usage "inspect --json with two targets" "$CUSNAP" inspect --json a b
json_usage "suspend --json --timeout 0" "$CUSNAP" suspend x --json --timeout 0
json_usage "restore --json --device-map a=b" "$CUSNAP" restore "$T/none" --json --device-map a=b
rc=0
"$CUSNAP" ps --bogus >"$T/json.out" 2>/dev/null || rc=$?
[ "$rc" = 2 ] && [ ! -s "$T/json.out" ] || fail "ps --bogus without --json: status $rc, stdout $(cat "$T/json.out")"
pass "without --json a bad command line prints nothing on stdout"
# '--json' where an option's value goes, or after '--', is not the flag: no
# JSON on stdout; a real --json before it still counts.
for args in "restore $T/none --name --json" "restore $T/none --runtime-dir --json" \
  "checkpoint x -o --json" "suspend x --timeout --json" "inspect -- --json"; do
  rc=0
  # shellcheck disable=SC2086 # the words of args are the command line
  "$CUSNAP" $args >"$T/json.out" 2>"$T/json.err" || rc=$?
  [ "$rc" != 0 ] && [ ! -s "$T/json.out" ] ||
    fail "$args: status $rc, stdout $(cat "$T/json.out") (stderr: $(cat "$T/json.err"))"
done
json_usage "restore --json --name --json" "$CUSNAP" restore "$T/none" --json --name --json
pass "an option's value of '--json', or one after '--', asks for no JSON"

# A relative --runtime-dir, from launch and from restore: the link in the
# runtime base points to the absolute directory, ps run elsewhere keeps it,
# and the job can be checkpointed and restored.
mkdir -p "$T/cwd1" "$T/cwd2"
CWD1=$(cd "$T/cwd1" && pwd -P)
CWD2=$(cd "$T/cwd2" && pwd -P)
(cd "$CWD1" && exec "$CUSNAP" launch --name rel --runtime-dir ./rd/ -- "$PATTERN_JOB" --mib 8 \
  --interval-ms 20) >"$T/launch.out" 2>&1 &
SUP=$!
SUPERVISORS+=("$SUP")
PID=$(cd "$CWD2" && wait_job rel)
wait_count "$T/launch.out" 3
[ "$(readlink "$CUSNAP_RUNTIME_BASE/rel")" = "$CWD1/rd" ] ||
  fail "the link of a relative --runtime-dir points to '$(readlink "$CUSNAP_RUNTIME_BASE/rel")', expected $CWD1/rd"
grep -q '^rel ' <<<"$(cd "$CWD2" && "$CUSNAP" ps)" || fail "ps from another directory does not list the job"
[ -L "$CUSNAP_RUNTIME_BASE/rel" ] || fail "ps from another directory removed the job's link"
[ "$(job_field rel runtime_dir)" = "$CWD1/rd" ] || fail "runtime_dir is $(job_field rel runtime_dir)"
pass "launch --runtime-dir ./rd/ is $CWD1/rd, and ps from elsewhere keeps its link"

(cd "$CWD2" && "$CUSNAP" checkpoint rel -o "$T/ckpt") >"$T/ckpt.out" 2>&1 ||
  fail "checkpoint of a job with a relative --runtime-dir failed: $(cat "$T/ckpt.out")"
wait_exit "$SUP"
wait_gone "$PID"
LAST=$(last_count "$T/launch.out")
(cd "$CWD2" && exec "$CUSNAP" restore "$T/ckpt" --name rel2 --runtime-dir rd2) >"$T/restore.out" 2>&1 &
SUP=$!
SUPERVISORS+=("$SUP")
wait_count "$T/restore.out" $((LAST + 3))
[ "$(readlink "$CUSNAP_RUNTIME_BASE/rel2")" = "$CWD2/rd2" ] ||
  fail "the restore's link points to '$(readlink "$CUSNAP_RUNTIME_BASE/rel2")', expected $CWD2/rd2"
grep -q '^rel2 ' <<<"$(cd "$CWD1" && "$CUSNAP" ps)" || fail "ps from another directory does not list the restored job"
[ -L "$CUSNAP_RUNTIME_BASE/rel2" ] || fail "ps from another directory removed the restored job's link"
PID=$(wait_job rel2)
# Named by its root process's pid (ps's PID column), into ../ckpt2/: the
# directory is $T/ckpt2, and --json says so plainly.
(cd "$CWD1" && "$CUSNAP" checkpoint "$PID" -o ../ckpt2/ --json) >"$T/ckpt2.out" 2>&1 ||
  fail "checkpoint of the restored job by its pid, into ../ckpt2/, failed: $(cat "$T/ckpt2.out")"
TREAL=$(cd "$T" && pwd -P)
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["dir"] == sys.argv[2], d["dir"]; assert d["supervisor_gone"] is True, d' \
  "$T/ckpt2.out" "$TREAL/ckpt2" || fail "checkpoint --json names the directory as: $(cat "$T/ckpt2.out")"
wait_exit "$SUP"
wait_gone "$PID"
pass "restore --runtime-dir rd2 is $CWD2/rd2; the restored job is found by its pid and checkpointed from elsewhere into ../ckpt2/ ($TREAL/ckpt2)"

# An option launch does not know is a usage error, never run as the command.
expect_usage "launch --bogus -- true" "unknown option '--bogus'" -- "$CUSNAP" launch --bogus -- true
expect_usage "launch --json -- true" "unknown option '--json'" -- "$CUSNAP" launch --json -- true
expect_usage "restore ''" "DIR" "empty" -- "$CUSNAP" restore ''
rc=0
"$CUSNAP" ps --json=false --bogus >"$T/json.out" 2>/dev/null || rc=$?
[ "$rc" = 2 ] && [ ! -s "$T/json.out" ] || fail "ps --json=false --bogus: status $rc, stdout $(cat "$T/json.out")"
pass "--json=false prints no JSON"

# --runtime-dir never takes, nor removes at the job's end, what a user keeps
# there; a missing parent is not made.
mkdir -p "$T/mine/suspended" && echo keep >"$T/mine/suspended/results.csv" && echo keep >"$T/mine/output.log"
chmod 755 "$T/mine"
rc=0
"$CUSNAP" launch --name mine --runtime-dir "$T/mine" -- true 2>"$T/mine.err" || rc=$?
[ "$rc" = 3 ] && grep -q "refusing runtime directory $T/mine: it holds '" "$T/mine.err" ||
  fail "launch into a directory of the user's: exit $rc: $(cat "$T/mine.err")"
[ "$(cat "$T/mine/suspended/results.csv" "$T/mine/output.log")" = "$(printf 'keep\nkeep')" ] &&
  [ "$(stat -c %a "$T/mine")" = 755 ] || fail "a refused --runtime-dir was changed: $(ls -la "$T/mine")"
rc=0
"$CUSNAP" launch --name deep --runtime-dir "$T/nowhere/x/rd" -- true 2>"$T/deep.err" || rc=$?
[ "$rc" = 3 ] && grep -q "($T/nowhere/x) does not exist" "$T/deep.err" && [ ! -e "$T/nowhere" ] ||
  fail "launch --runtime-dir with missing parents: exit $rc: $(cat "$T/deep.err"); $(ls "$T")"
echo x >"$T/plainfile"
rc=0
"$CUSNAP" launch --name underfile --runtime-dir "$T/plainfile/rd" -- true 2>"$T/underfile.err" || rc=$?
[ "$rc" = 3 ] && grep -q "($T/plainfile) is not a directory" "$T/underfile.err" ||
  fail "launch --runtime-dir below a file: exit $rc: $(cat "$T/underfile.err")"
mkdir "$T/empty" && chmod 755 "$T/empty"
"$CUSNAP" launch --name empty --runtime-dir "$T/empty" -- true 2>"$T/empty.err" ||
  fail "launch into an empty directory: $(cat "$T/empty.err")"
[ ! -e "$T/empty" ] || fail "the job's end left its runtime directory: $(ls -la "$T/empty")"
pass "--runtime-dir refuses a directory holding the user's files (unchanged) and a missing parent; takes an empty one"

# A runtime base with no room for job.json: refused before the job starts
# (exit 1, naming why), not a job that cusnap ps, checkpoint and inspect
# cannot find.
# full_tmpfs DIR: a 64 KiB tmpfs on DIR, filled.
full_tmpfs() {
  mkdir -p "$1"
  mount -t tmpfs -o size=64k tmpfs "$1" || fail "cannot mount a tmpfs to fill (root is needed for this test)"
  dd if=/dev/zero of="$1/fill" bs=4k count=64 2>/dev/null || true
}
full_tmpfs "$T/fullbase"
rc=0
CUSNAP_RUNTIME_BASE=$T/fullbase/run "$CUSNAP" launch --name full -- \
  sh -c "echo started >'$T/full.started'" 2>"$T/full.err" || rc=$?
left=$(find "$T/fullbase/run" -mindepth 1 -maxdepth 1 ! -name .lock 2>/dev/null)
umount -l "$T/fullbase"
[ "$rc" = 1 ] && grep -q "cannot write the runtime directory $T/fullbase/run/full: No space left on device" "$T/full.err" &&
  [ ! -e "$T/full.started" ] && [ -z "$left" ] ||
  fail "launch with a full runtime base: exit $rc, started: $(cat "$T/full.started" 2>&1), left: $left: $(cat "$T/full.err")"
pass "a full runtime base is refused before the job starts (exit 1), leaving nothing"

# A full TMPDIR (CRIU's log and work files): said before CRIU runs, the
# checkpoint unchanged, nothing started.
full_tmpfs "$T/fulltmp"
rc=0
TMPDIR=$T/fulltmp "$CUSNAP" restore "$T/ckpt" --name fulltmp >"$T/fulltmp.out" 2>&1 || rc=$?
umount -l "$T/fulltmp"
[ "$rc" = 1 ] && grep -q "cannot write the temporary directory $T/fulltmp/cusnap-restore-.*: No space left on device: free space there, or set TMPDIR" "$T/fulltmp.out" ||
  fail "restore with a full TMPDIR: exit $rc: $(cat "$T/fulltmp.out")"
[ -z "$(job_field fulltmp pid)" ] || fail "the refused restore left a job"
"$CUSNAP" inspect "$T/ckpt" >/dev/null || fail "the checkpoint does not verify after the refused restore"
pass "a full TMPDIR is said before CRIU runs (exit 1); the checkpoint is unchanged"

# A TMPDIR that does not exist: named, with what to do; for a checkpoint,
# whose CRIU runs in the job's supervisor, the TMPDIR the job was launched
# with is the one that counts, and the message says so.
rc=0
TMPDIR=$T/no-such-tmp "$CUSNAP" restore "$T/ckpt" --name notmp >"$T/notmp.out" 2>&1 || rc=$?
[ "$rc" = 1 ] && grep -q "cannot create a temporary directory in $T/no-such-tmp (TMPDIR): No such file or directory: create that directory, or set TMPDIR to another directory" "$T/notmp.out" ||
  fail "restore with a missing TMPDIR: exit $rc: $(cat "$T/notmp.out")"
mkdir "$T/tmp-gone"
TMPDIR=$T/tmp-gone "$CUSNAP" launch --name tmpgone -- "$PATTERN_JOB" --mib 4 --interval-ms 20 \
  >"$T/tmpgone.out" 2>&1 &
SUPERVISORS+=("$!")
TG=$!
wait_count "$T/tmpgone.out" 2
rmdir "$T/tmp-gone"
rc=0
"$CUSNAP" checkpoint tmpgone -o "$T/tmpgone.ck" --leave-running >"$T/tmpgone.ck.out" 2>&1 || rc=$?
[ "$rc" != 0 ] && grep -q "cannot create a temporary directory in $T/tmp-gone (TMPDIR): No such file or directory: create that directory, or launch (or restore) the job with TMPDIR set to another directory: its supervisor keeps CRIU's files in the TMPDIR it started with, not in this command's" "$T/tmpgone.ck.out" ||
  fail "checkpoint with the supervisor's TMPDIR gone: exit $rc: $(cat "$T/tmpgone.ck.out")"
kill -TERM "$TG"
wait_exit "$TG"
pass "a missing TMPDIR is named (restore exit 1, checkpoint exit $rc), and a checkpoint says the supervisor's counts"

# Looking a job up by a directory changes nothing in it.
mkdir "$T/shared" && chmod 1777 "$T/shared"
for cmd in checkpoint suspend resume inspect; do
  rc=0
  "$CUSNAP" "$cmd" "$T/shared" >/dev/null 2>"$T/shared.err" || rc=$?
  [ "$rc" != 0 ] && [ "$(stat -c %a "$T/shared")" = 1777 ] ||
    fail "$cmd of a directory: exit $rc, its mode now $(stat -c %a "$T/shared"): $(cat "$T/shared.err")"
done
pass "checkpoint, suspend, resume and inspect of a directory that is no job's leave its mode as it was"

# inspect of a path that is not there says what it expected (exit 4), as JSON too.
rc=0
"$CUSNAP" inspect "$T/nowhere/ckpt" >"$T/ins.out" 2>"$T/ins.err" || rc=$?
[ "$rc" = 4 ] || fail "inspect of a missing path: exit $rc, expected 4"
grep -q "cannot inspect $T/nowhere/ckpt: No such file or directory (a checkpoint directory" "$T/ins.err" ||
  fail "inspect of a missing path does not say so: $(cat "$T/ins.err")"
rc=0
"$CUSNAP" inspect "$T/nowhere/ckpt" --json >"$T/ins.json" 2>/dev/null || rc=$?
[ "$rc" = 4 ] && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ok"] is False and "No such file" in d["error"]' "$T/ins.json" ||
  fail "inspect --json of a missing path: exit $rc, $(cat "$T/ins.json")"
pass "inspect of a missing path names it and what was expected (exit 4)"
# Of a file: not a checkpoint (exit 5, as restore), said as such.
: >"$T/afile"
rc=0
"$CUSNAP" inspect "$T/afile" >"$T/ins.out" 2>"$T/ins.err" || rc=$?
[ "$rc" = 5 ] || fail "inspect of a file: exit $rc, expected 5: $(cat "$T/ins.err")"
grep -q "cannot inspect $T/afile: it is not a directory (a checkpoint directory" "$T/ins.err" ||
  fail "inspect of a file does not say so: $(cat "$T/ins.err")"
pass "inspect of a file says it is not a directory (exit 5)"

# A runtime base cusnap refuses (a link) is an error for ps, not an empty list.
mkdir -p "$T/realbase" && chmod 700 "$T/realbase"
ln -s "$T/realbase" "$T/linkbase"
rc=0
CUSNAP_RUNTIME_BASE=$T/linkbase "$CUSNAP" ps >"$T/ps.out" 2>"$T/ps.err" || rc=$?
[ "$rc" = 1 ] || fail "ps with a linked runtime base: exit status $rc, expected 1: $(cat "$T/ps.out" "$T/ps.err")"
grep -q "symbolic link" "$T/ps.err" || fail "ps does not say why: $(cat "$T/ps.err")"
rc=0
CUSNAP_RUNTIME_BASE=$T/linkbase "$CUSNAP" ps --json >"$T/ps.json" 2>/dev/null || rc=$?
[ "$rc" = 1 ] && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ok"] is False and "symbolic link" in d["error"]' "$T/ps.json" ||
  fail "ps --json with a linked runtime base: exit $rc, $(cat "$T/ps.json")"
pass "ps refuses a linked runtime base, saying so (exit 1, and as JSON)"

# A command line too long for the job's record (job.json, which ps reads) is
# refused before anything is made: such a job could not be listed, and its
# checkpoint not restored. Eight arguments of 120 KiB: about 960 KiB.
big=$(head -c $((120 * 1024)) /dev/zero | tr '\0' x)
expect_usage "launch with about 960 KiB of arguments" "job.json" "pass long data in a file" -- \
  "$CUSNAP" launch --name toolong -- true "$big" "$big" "$big" "$big" "$big" "$big" "$big" "$big"
[ ! -e "$CUSNAP_RUNTIME_BASE/toolong" ] || fail "the refused launch left $CUSNAP_RUNTIME_BASE/toolong"
pass "the refused launch left no runtime directory"
unset big
echo "PASS"
