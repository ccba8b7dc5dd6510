#!/usr/bin/env bash
# A restore killed (SIGKILL) before the job is back. Its watch (restore_watch.h)
# ends what was restored, CRIU dies with the restore, and the checkpoint is
# unchanged and restores afterwards:
#  - killed while CRIU runs: CRIU held at post-restore (criu_hold_at): the
#    process is restored under its id, CRIU has not yet unlocked the network
#    nor let the tree run; CRIU dies with the restore and nothing of the
#    half-restored job (no process whose command line names this test's
#    files: CRIU, the watch) is left;
#  - killed in the driver's restore (every cuCheckpointProcessRestore of the
#    restoring process takes 3 s; simulated driver only): the restored
#    process, its GPU state still checkpointed, is ended;
#  - restore --detach, its background supervisor killed while CRIU runs: the
#    watch's message reaches the waiting command's stderr.
# Before the watch, each left the restored process running unsupervised,
# holding its ids (a second restore was refused: "process id ... in use").
# In each the watch then removes the killed restore's temporary directories
# (cusnap-restore-PID-*, cusnap-noplugins-PID-*: CRIU's work files and log),
# there before the kill, gone within 5 s after it.
#  - the restore and its watch both killed (as the OOM killer might): the
#    directories stay; a later restore leaves them while they are younger
#    than 10 minutes, then sweeps them (here aged by hand before the last
#    restore).
#  - a job that forks on, its restore killed in the driver's restore: the
#    watch ends what the restored processes started since CRIU let them run
#    (not in the checkpoint) with them.
source "$(dirname "$0")/lib_checkpoint.sh"

checkpointed_job rkill "$T/job.out" "$T/ck"
sums() { (cd "$T/ck" && find . -type f ! -name stats-restore -exec sha256sum {} + | sort | sha256sum); }
SUM0=$(sums)

# killed_restore CASE TRIGGER...: the restore started in the background as R
# (output $T/CASE.out) is killed once the restored process is there and the
# command TRIGGER succeeds (the restore is where the case kills it); then
# nothing of the job may be left.
killed_restore() {
  local name=$1 rc=0
  shift
  for _ in $(seq 1 600); do
    [ -e "/proc/$PID" ] && "$@" && break
    sleep 0.05
  done
  [ -e "/proc/$PID" ] && "$@" ||
    fail "$name: the restore never got there: $(cat "$T/$name.out")"
  kill -0 "$R" 2>/dev/null || fail "$name: the restore ended before it was killed: $(cat "$T/$name.out")"
  [ "$(temp_dirs "$R" | wc -l)" = 2 ] || fail "$name: the restore's temporary directories: $(temp_dirs "$R")"
  kill -KILL "$R"
  wait "$R" || rc=$?
  [ "$rc" = 137 ] || fail "$name: the restore exited $rc, not killed"
  wait_gone "$PID" 10
  for _ in $(seq 1 100); do grep -q "the checkpoint is unchanged" "$T/$name.out" && break; sleep 0.05; done
  grep -q "cusnap: the restore of $T/ck ended before the job was back (the restoring process was killed): its restored process $PID was ended; the checkpoint is unchanged and restores again" \
    "$T/$name.out" || fail "$name: the watch did not say what it did: $(cat "$T/$name.out")"
  [ -z "$(job_pids_all)" ] || fail "$name: a job is left: $("$CUSNAP" ps)"
  [ "$SUM0" = "$(sums)" ] || fail "$name: the killed restore changed the checkpoint"
  temps_removed "$name" "$R"
}

# nothing_left WHAT: within 5 s, no process whose command line names this
# test's directory (CRIU's -D, the restore and its watch, the hold's action
# script) runs.
nothing_left() {
  local left=
  for _ in $(seq 1 100); do
    left=$(pgrep -f -- "$T/" || true)
    [ -z "$left" ] && return 0
    sleep 0.05
  done
  fail "$1: processes left: $(ps -o pid=,ppid=,args= -p "${left//$'\n'/,}")"
}

# temp_dirs PID: the restore temporary directories process PID made here.
temp_dirs() { find "$T" -maxdepth 1 \( -name "cusnap-restore-$1-*" -o -name "cusnap-noplugins-$1-*" \) | sort; }

# temps_removed CASE PID: within 5 s, the killed restore PID's temporary
# directories are gone (its watch removes them once it has ended the job).
temps_removed() {
  for _ in $(seq 1 100); do
    [ -z "$(temp_dirs "$2")" ] && return 0
    sleep 0.05
  done
  fail "$1: the killed restore's temporary directories are left: $(temp_dirs "$2")"
}

# --- killed while CRIU runs: held at post-restore, every process of the tree
# restored under its id and still CRIU's (it has neither unlocked the network
# nor let the tree run: that comes after pre-resume).
criu_hold_at post-restore
CUSNAP_CRIU="$HOLD_CRIU" "$CUSNAP" restore "$T/ck" >"$T/criu.out" 2>&1 &
R=$!
SUPERVISORS+=("$R")
criu_held 30 || fail "criu: CRIU's restore did not reach post-restore: $(cat "$T/criu.out")"
[ -e "/proc/$PID" ] || fail "criu: the process is not restored at post-restore"
[ "$(ps -o ppid= -p "$HELD_CRIU" | tr -d ' ')" = "$R" ] || fail "criu: the held CRIU is not the restore's"
[ "$(ps -o ppid= -p "$PID" | tr -d ' ')" = "$HELD_CRIU" ] || fail "criu: the restored process is not CRIU's child"
killed_restore criu true
wait_gone "$HELD_CRIU" 10 # CRIU died with the restore
criu_release              # its action script, orphaned, ends
nothing_left criu
pass "killed while CRIU ran (post-restore): CRIU and the restored process ended, the watch said so and removed the temporary directories, nothing left running"

# --- restore --detach, its background supervisor killed while CRIU runs: the
# watch says so on the waiting command's stderr (the supervisor's own goes to
# /dev/null), and the command, left without a result, fails.
criu_hold_at post-restore
CUSNAP_CRIU="$HOLD_CRIU" "$CUSNAP" restore "$T/ck" --detach >"$T/detach.out" 2>"$T/detach.err" &
W=$!
SUPERVISORS+=("$W")
criu_held 30 || fail "detach: CRIU's restore did not reach post-restore: $(cat "$T/detach.err")"
[ -e "/proc/$PID" ] || fail "detach: the process is not restored at post-restore"
BG=$(ps -o ppid= -p "$HELD_CRIU" | tr -d ' ')
[ -n "$BG" ] && [ "$BG" != "$W" ] && [ "$BG" != 1 ] || fail "detach: no background supervisor above CRIU ($BG)"
[ "$(temp_dirs "$BG" | wc -l)" = 2 ] || fail "detach: the restore's temporary directories: $(temp_dirs "$BG")"
kill -KILL "$BG"
rc=0
wait "$W" || rc=$?
[ "$rc" != 0 ] || fail "detach: the waiting command succeeded though its restore was killed"
grep -q "the background restore ended without a result" "$T/detach.err" ||
  fail "detach: the waiting command did not say its restore ended: $(cat "$T/detach.err")"
wait_gone "$PID" 10
wait_gone "$HELD_CRIU" 10
criu_release
for _ in $(seq 1 100); do grep -q "the checkpoint is unchanged" "$T/detach.err" && break; sleep 0.05; done
grep -q "cusnap: the restore of $T/ck ended before the job was back (the restoring process was killed): its restored process $PID was ended" \
  "$T/detach.err" || fail "detach: the watch's message did not reach the waiting command: $(cat "$T/detach.err")"
[ -z "$(job_pids_all)" ] || fail "detach: a job is left: $("$CUSNAP" ps)"
[ "$SUM0" = "$(sums)" ] || fail "detach: the killed restore changed the checkpoint"
nothing_left detach
temps_removed detach "$BG"
pass "restore --detach, its supervisor killed while CRIU ran: the watch said so on the command's stderr and removed the temporary directories, no job left"

# --- killed in the driver's restore
# (FAKECUDA_LOG traces each driver call as it begins, before its delay: the
# restore is killed once its cuCheckpointProcessRestore is under way, not
# while CRIU may still run.)
if fake_only "FAKECUDA_DELAY slows the simulated driver's restore"; then
  FAKECUDA_LOG=1 FAKECUDA_DELAY="cuCheckpointProcessRestore:3000" \
    "$CUSNAP" restore "$T/ck" >"$T/driver.out" 2>&1 &
  R=$!
  SUPERVISORS+=("$R")
  killed_restore driver grep -q "^fakecuda\[[0-9]*\]: cuCheckpointProcessRestore$" "$T/driver.out"
  nothing_left driver
  pass "killed in the driver's restore: the restored process ended, the watch said so and removed the temporary directories, no job left"
fi

# --- the restore and its watch both killed while CRIU runs (held at
# post-restore): nothing removes its temporary directories then. The
# restored process, which the watch would have ended, is killed here.
criu_hold_at post-restore
CUSNAP_CRIU="$HOLD_CRIU" "$CUSNAP" restore "$T/ck" >"$T/both.out" 2>&1 &
R=$!
SUPERVISORS+=("$R")
criu_held 30 || fail "both: CRIU's restore did not reach post-restore: $(cat "$T/both.out")"
[ -e "/proc/$PID" ] || fail "both: the process is not restored at post-restore"
# The watch: the restore's child that leads a session of its own (setsid).
WATCH=$(ps -o pid=,sid=,comm= --ppid "$R" | awk '$1 == $2 && $3 == "cusnap" {print $1}')
[ -n "$WATCH" ] || fail "both: no watch under the restore: $(ps -o pid=,sid=,args= --ppid "$R")"
[ "$(temp_dirs "$R" | wc -l)" = 2 ] || fail "both: the restore's temporary directories: $(temp_dirs "$R")"
kill -KILL "$WATCH" "$R"
rc=0
wait "$R" || rc=$?
[ "$rc" = 137 ] || fail "both: the restore exited $rc, not killed"
wait_gone "$HELD_CRIU" 10
criu_release
kill -KILL "$PID" 2>/dev/null || true
wait_gone "$PID" 10
nothing_left both
! grep -q "the checkpoint is unchanged" "$T/both.out" || fail "both: the killed watch acted: $(cat "$T/both.out")"
sleep 1
[ "$(temp_dirs "$R" | wc -l)" = 2 ] || fail "both: the temporary directories of the restore killed with its watch: $(temp_dirs "$R")"
pass "the restore and its watch both killed: the temporary directories stay"

# --- the checkpoint restores afterwards and the job counts on; it sweeps the
# temporary directories that the restore killed with its watch left, once
# they are 10 minutes old (TempDir, sweep_stale_temp_dirs): aged here by
# hand.
temp_dirs "$R" | xargs -r touch -d "-11 minutes"
restore_continues "$T/ck" "$T/r.out" rkill "$PID" "$LAST"
pass "the checkpoint restores after the killed restores, counting on from $FIRST"
[ -z "$(temp_dirs "$R")" ] || fail "the killed restore $R's temporary directories were not swept: $(temp_dirs "$R")"
pass "the next restore swept the temporary directories of the restore killed with its watch"
kill -TERM "$SUP"
wait_exit "$SUP"
wait_gone "$PID"

# --- a job that forks on (a process starting "sleep 987654" every 100 ms,
# its CUDA child a pattern job), its restore killed in the driver's restore:
# the watch ends, with the restored processes, what they started once CRIU
# let them run on, which the checkpoint does not hold (before, those were
# left running, children of init).
if fake_only "FAKECUDA_DELAY slows the simulated driver's restore"; then
  cat >"$T/forker.py" <<'PY'
import os, subprocess, sys, time
subprocess.Popen([sys.argv[1], "--mib", "4", "--interval-ms", "20"], stdout=subprocess.DEVNULL)
n = 0
while True:
    n += 1
    subprocess.Popen(["sleep", "987654"])
    os.write(1, b"count %d ok\n" % n)
    time.sleep(0.1)
PY
  sleeps() { pgrep -f "^sleep 987654$" | wc -l; }
  launch forker "$T/forker.out" python3 "$T/forker.py" "$PATTERN_JOB"
  wait_count "$T/forker.out" 5
  FPID=$(wait_job forker)
  "$CUSNAP" checkpoint forker -o "$T/fk" >"$T/fk.out" 2>&1 || fail "forker: checkpoint failed: $(cat "$T/fk.out")"
  wait_exit "$LAST_SUPERVISOR"
  wait_gone "$FPID"
  [ "$(sleeps)" = 0 ] || fail "forker: the checkpoint left $(sleeps) of its processes"
  FAKECUDA_LOG=1 FAKECUDA_DELAY="cuCheckpointProcessRestore:3000" \
    "$CUSNAP" restore "$T/fk" >"$T/fkr.out" 2>&1 &
  R=$!
  SUPERVISORS+=("$R")
  wait_driver_call "$T/fkr.out" cuCheckpointProcessRestore 0 "$R" ||
    fail "forker: the restore never reached the driver's restore: $(cat "$T/fkr.out")"
  restored=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["processes"]) - 2)' "$T/fk/manifest.json")
  for _ in $(seq 1 40); do [ "$(sleeps)" -gt "$restored" ] && break; sleep 0.05; done
  [ "$(sleeps)" -gt "$restored" ] || fail "forker: the restored job started nothing new ($(sleeps) sleeps, $restored restored)"
  kill -KILL "$R"
  wait "$R" 2>/dev/null || true
  for _ in $(seq 1 100); do [ "$(sleeps)" = 0 ] && break; sleep 0.05; done
  [ "$(sleeps)" = 0 ] || fail "forker: $(sleeps) processes the restored job started are left: $(pgrep -af '^sleep 987654$' | head -3)"
  for _ in $(seq 1 100); do grep -q "the checkpoint is unchanged" "$T/fkr.out" && break; sleep 0.05; done
  grep -q "were ended (with what they started since CRIU let them run: [0-9]* process" "$T/fkr.out" ||
    fail "forker: the watch did not say it ended what the job started: $(grep cusnap: "$T/fkr.out")"
  [ -z "$(job_pids_all)" ] || fail "forker: a job is left: $("$CUSNAP" ps)"
  pass "a job that forks on, its restore killed in the driver's restore: the watch ended the restored processes and the $(sed -n 's/.*let them run: \([0-9]*\) process.*/\1/p' "$T/fkr.out") they started since"
fi
