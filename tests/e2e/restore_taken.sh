#!/usr/bin/env bash
# What a restore needs that may be taken here: ids, the job's name, the
# directory of its shims' sockets.
#
# CRIU gives every process and thread of a checkpoint its old id back. A
# thread id taken by another process here is refused before CRIU runs (exit
# 3), naming what holds it. Two restores of one checkpoint at once: both pass
# that check, the first restores, the second's CRIU fails on the ids the first
# took; the second says so (exit 3) and leaves the first's job alone (its roll
# back killed whatever held the checkpoint's root pid: the first's job).
# In a pid namespace of its own: the thread-id case steers the next pid
# through ns_last_pid, which would steer the pids of tests running beside it
# (CTest runs several at once; gpu-test.sh, on the real driver, one at a time).
if [ -z "${CUSNAP_TEST_PIDNS:-}" ] && [ "${CUSNAP_REAL_DRIVER:-0}" != 1 ]; then
  exec env CUSNAP_TEST_PIDNS=1 unshare --pid --fork --mount-proc bash "$0" "$@"
fi
source "$(dirname "$0")/lib_checkpoint.sh"
source "$(dirname "$0")/lib_orphan.sh"

checkpointed_job pat "$T/launch.out" "$T/ckpt"
TID=$(python3 -c '
import json, re, sys
m = json.load(open(sys.argv[1]))
root = m["job"]["root_pid"]
tids = [int(x) for f in m["files"] for x in re.findall(r"^criu/core-(\d+)\.img$", f["path"])]
print(max(t for t in tids if t != root))' "$T/ckpt/manifest.json") ||
  fail "the checkpoint holds no thread besides the root: $(grep -o 'criu/core-[0-9]*' "$T/ckpt/manifest.json")"

# A process on the thread's id: the next pid is set through ns_last_pid
# (other processes may fork in between: tried until it lands). Python forks
# and reaps the misses: bash, its background jobs given the same pid again
# and again, lost track of them and hung in wait.
HOLDER=$(python3 - "$TID" <<'PY'
import os, signal, sys
want = int(sys.argv[1])
for _ in range(200):
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(want - 1))
    pid = os.fork()
    if pid == 0:
        os.setsid()
        devnull = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.execvp("sleep", ["sleep", "600"])
    if pid == want:
        print(pid)
        sys.exit(0)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
sys.exit(1)
PY
) || fail "could not start a process with pid $TID"
echo "$HOLDER" >>"$T/job-pids"
expect_refused 3 "process id $TID that the checkpoint restores is in use, by process $TID \(sleep\)" \
  timeout 60 "$CUSNAP" restore "$T/ckpt"
if ls -d "$T"/cusnap-restore-* >/dev/null 2>&1; then fail "a CRIU restore ran"; fi
kill "$HOLDER"
wait_gone "$HOLDER"
sed -i "/^$HOLDER\$/d" "$T/job-pids"
pass "a thread id of the checkpoint held by process $TID (sleep): refused before CRIU ran"

# Two restores at once, each CRIU started late by a wrapper (the first's
# after 1 s, the second's after 3 s): the second is refused (exit 3), the
# first's job counts on. (The second finds the first's runtime directory
# holding the shims' sockets; were it let through, its CRIU would fail on the
# ids the first took, and its roll back killed what then held the root pid:
# the first's job.)
REAL_CRIU=$(PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin command -v criu)
cat >"$T/criu-late" <<SH
#!/bin/sh
[ "\$1" = restore ] && sleep "\$CRIU_DELAY"
exec ${CUSNAP_CRIU:-$REAL_CRIU} "\$@"
SH
chmod +x "$T/criu-late"
CUSNAP_CRIU=$T/criu-late CRIU_DELAY=1 "$CUSNAP" restore "$T/ckpt" >"$T/first.out" 2>&1 &
FIRST=$!
SUPERVISORS+=("$FIRST")
# The second starts once the first holds the job's runtime directory.
for _ in $(seq 1 200); do
  [ -e "$CUSNAP_RUNTIME_BASE/pat/lock" ] && break
  sleep 0.05
done
[ -e "$CUSNAP_RUNTIME_BASE/pat/lock" ] || fail "the first restore made no runtime directory: $(cat "$T/first.out")"
rc=0
CUSNAP_CRIU=$T/criu-late CRIU_DELAY=3 timeout 60 "$CUSNAP" restore "$T/ckpt" --name second \
  >"$T/second.out" 2>&1 || rc=$?
[ "$rc" = 3 ] && grep -Eq "is now that of a running job|was taken while CRIU ran, by .*another restore of this checkpoint" "$T/second.out" ||
  fail "the second restore: exit $rc: $(cat "$T/second.out")"
wait_count "$T/first.out" $((LAST + 3))
kill -0 "$FIRST" 2>/dev/null || fail "the first restore's job is gone: $(cat "$T/first.out")"
N=$(last_count "$T/first.out")
wait_count "$T/first.out" $((N + 5))
[ "$(first_count "$T/first.out")" = $((LAST + 1)) ] ||
  fail "the first restore continued at $(first_count "$T/first.out"), expected $((LAST + 1))"
[ -z "$(job_field second pid)" ] || fail "cusnap ps shows the second restore's job"
pass "two restores at once: the second is refused (exit 3), the first's job counts on past $((N + 5))"
kill -TERM "$FIRST"
wait_exit "$FIRST"
wait_gone "$PID"

# Restored under another name, the job reaches its shims' sockets through
# BASE/pat, a link to its runtime directory: ps lists it once, by its name,
# and the name pat is taken while it runs (exit 3, naming the job).
restore_bg "$T/ckpt" "$T/ra.out" --name ra
RA=$LAST_SUPERVISOR
wait_count "$T/ra.out" $((LAST + 3))
[ -L "$CUSNAP_RUNTIME_BASE/pat" ] || fail "no link $CUSNAP_RUNTIME_BASE/pat for the shims of job ra"
"$CUSNAP" ps --json >"$T/ps.json"
python3 -c 'import json,sys; n=[j["name"] for j in json.load(open(sys.argv[1]))]; assert n == ["ra"], n' "$T/ps.json" ||
  fail "cusnap ps lists: $(cat "$T/ps.json")"
expect_refused 3 "the name 'pat' is taken: job 'ra', restored from a checkpoint of job pat, is already running" \
  "$CUSNAP" launch --name pat -- true
expect_refused 3 "the name 'pat' is taken: job 'ra'" "$CUSNAP" launch --name pat --runtime-dir "$T/elsewhere" -- true
[ "$(readlink "$CUSNAP_RUNTIME_BASE/pat")" = "$(job_field ra runtime_dir)" ] || fail "the shims' link was replaced"
wait_count "$T/ra.out" $(($(last_count "$T/ra.out") + 3))
pass "restored as ra: listed once, and the name pat is refused while it runs (the shims' link kept)"
kill -TERM "$RA"
wait_exit "$RA"

# A job of another kind now runs under the name pat: its runtime directory is
# where the checkpoint's shims had their sockets. A restore under another
# name is refused before CRIU runs (the other job's end would remove them).
launch pat "$T/other.out" sleep 600
OTHER=$LAST_SUPERVISOR
wait_job pat >/dev/null
expect_refused 3 "the checkpointed job's runtime directory $CUSNAP_RUNTIME_BASE/pat .* is now that of a running job" \
  "$CUSNAP" restore "$T/ckpt" --name rb
[ -z "$(job_field rb pid)" ] || fail "the refused restore left job rb"
pass "with another job named pat running, a restore as rb is refused before CRIU runs"
# A damaged copy of the checkpoint is said to be damaged (exit 5), not that
# the running job stands in the way: the user is not sent to stop a job for
# a checkpoint that cannot be restored.
cp -a "$T/ckpt" "$T/damaged"
img=$(find "$T/damaged/criu" -name 'pages-*.img' | head -n1)
[ -n "$img" ] || fail "no pages image in $T/damaged/criu"
python3 -c 'import sys; f=open(sys.argv[1], "r+b"); b=f.read(1); f.seek(0); f.write(bytes([b[0] ^ 0xff]))' "$img"
expect_refused 5 "$T/damaged" "$CUSNAP" restore "$T/damaged" --name rc
[ -z "$(job_field rc pid)" ] || fail "the refused restore left job rc"
[ -d "$CUSNAP_RUNTIME_BASE/pat" ] && [ ! -L "$CUSNAP_RUNTIME_BASE/pat" ] || fail "the damaged restore touched $CUSNAP_RUNTIME_BASE/pat"
pass "with another job named pat running, a damaged copy is refused as damaged (exit 5)"
# That job's supervisor killed with its guardian, its sleep running on: the
# directory is no dead supervisor's to reuse (ps removes it once the sleep
# ends, which would cut the restored shims off): refused, naming it.
ORPHAN=$(job_field pat pid)
orphan_job "$OTHER"
expect_refused 3 "is that of job pat, whose process $ORPHAN runs on without a supervisor" \
  timeout 60 "$CUSNAP" restore "$T/ckpt" --name rd
[ -z "$(job_field rd pid)" ] || fail "the refused restore left job rd"
kill -KILL "$ORPHAN"
wait_gone "$ORPHAN"
pass "with the job named pat running on unsupervised, a restore as rd is refused before CRIU runs"

# The job's working directory gone: refused before CRIU runs (exit 3),
# naming it and what to do; put back, the checkpoint restores.
mkdir "$T/wd"
(cd "$T/wd" && exec "$CUSNAP" launch --name inwd -- "$PATTERN_JOB" --mib 4 --interval-ms 20) \
  >"$T/wd.out" 2>&1 &
SUPERVISORS+=("$!")
WD_SUP=$!
wait_count "$T/wd.out" 3
WD_PID=$(wait_job inwd)
"$CUSNAP" checkpoint inwd -o "$T/wd.ck" >"$T/wd.ck.out" 2>&1 || fail "checkpoint: $(cat "$T/wd.ck.out")"
wait_exit "$WD_SUP"
wait_gone "$WD_PID"
rmdir "$T/wd"
expect_refused 3 "the job's working directory $T/wd is gone: CRIU restores the job with the files it had, where they were; put it back and restore again \(nothing was restored; the checkpoint is unchanged\)" \
  "$CUSNAP" restore "$T/wd.ck"
mkdir "$T/wd"
restore_bg "$T/wd.ck" "$T/wd.r.out"
WD_SUP=$LAST_SUPERVISOR
wait_count "$T/wd.r.out" "$(($(last_count "$T/wd.out") + 2))"
pass "the job's working directory gone: refused before CRIU (exit 3); put back, it restores"
kill -TERM "$WD_SUP"
wait_exit "$WD_SUP"
echo "PASS"
