#!/usr/bin/env bash
# A restore killed (SIGKILL) before the job is back. Its watch (restore_watch.h)
# ends what was restored, CRIU dies with the restore, and the checkpoint is
# unchanged and restores afterwards:
#  - killed while CRIU runs: a CRIU that restores the job, then waits before
#    it ends (the restored process is there, CRIU has not ended);
#  - killed in the driver's restore (every cuCheckpointProcessRestore of the
#    restoring process takes 3 s; simulated driver only): the restored
#    process, its GPU state still checkpointed, is ended;
#  - restore --detach, its background supervisor killed while CRIU runs: the
#    watch's message reaches the waiting command's stderr.
# Before the watch, each left the restored process running unsupervised,
# holding its ids (a second restore was refused: "process id ... in use").
source "$(dirname "$0")/lib_checkpoint.sh"
REAL_CRIU=${CUSNAP_CRIU:-$(PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin command -v criu)}

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
  kill -KILL "$R"
  wait "$R" || rc=$?
  [ "$rc" = 137 ] || fail "$name: the restore exited $rc, not killed"
  wait_gone "$PID" 10
  for _ in $(seq 1 100); do grep -q "the checkpoint is unchanged" "$T/$name.out" && break; sleep 0.05; done
  grep -q "cusnap: the restore of $T/ck ended before the job was back (the restoring process was killed): its restored process $PID was ended; the checkpoint is unchanged and restores again" \
    "$T/$name.out" || fail "$name: the watch did not say what it did: $(cat "$T/$name.out")"
  [ -z "$(job_pids_all)" ] || fail "$name: a job is left: $("$CUSNAP" ps)"
  [ "$SUM0" = "$(sums)" ] || fail "$name: the killed restore changed the checkpoint"
}

# --- killed while CRIU runs
cat >"$T/criu-hold" <<SH
#!/bin/sh
if [ "\$1" = restore ]; then
  "$REAL_CRIU" "\$@" || exit \$?
  echo \$\$ >"$T/hold.pid"
  exec sleep 120
fi
exec "$REAL_CRIU" "\$@"
SH
chmod 755 "$T/criu-hold"
CUSNAP_CRIU="$T/criu-hold" "$CUSNAP" restore "$T/ck" >"$T/criu.out" 2>&1 &
R=$!
SUPERVISORS+=("$R")
killed_restore criu test -e "$T/hold.pid"
HOLD=$(cat "$T/hold.pid")
wait_gone "$HOLD" 10 # CRIU (here its wrapper) died with the restore
pass "killed while CRIU ran: CRIU and the restored process ended, the watch said so, no job left"

# --- restore --detach, its background supervisor killed while CRIU runs: the
# watch says so on the waiting command's stderr (the supervisor's own goes to
# /dev/null), and the command, left without a result, fails.
rm -f "$T/hold.pid"
CUSNAP_CRIU="$T/criu-hold" "$CUSNAP" restore "$T/ck" --detach >"$T/detach.out" 2>"$T/detach.err" &
W=$!
SUPERVISORS+=("$W")
for _ in $(seq 1 600); do [ -e "$T/hold.pid" ] && [ -e "/proc/$PID" ] && break; sleep 0.05; done
[ -e "$T/hold.pid" ] || fail "detach: the restore never got to CRIU: $(cat "$T/detach.err")"
HOLD=$(cat "$T/hold.pid")
BG=$(ps -o ppid= -p "$HOLD" | tr -d ' ')
[ -n "$BG" ] && [ "$BG" != "$W" ] && [ "$BG" != 1 ] || fail "detach: no background supervisor above CRIU ($BG)"
kill -KILL "$BG"
rc=0
wait "$W" || rc=$?
[ "$rc" != 0 ] || fail "detach: the waiting command succeeded though its restore was killed"
grep -q "the background restore ended without a result" "$T/detach.err" ||
  fail "detach: the waiting command did not say its restore ended: $(cat "$T/detach.err")"
wait_gone "$PID" 10
wait_gone "$HOLD" 10
for _ in $(seq 1 100); do grep -q "the checkpoint is unchanged" "$T/detach.err" && break; sleep 0.05; done
grep -q "cusnap: the restore of $T/ck ended before the job was back (the restoring process was killed): its restored process $PID was ended" \
  "$T/detach.err" || fail "detach: the watch's message did not reach the waiting command: $(cat "$T/detach.err")"
[ -z "$(job_pids_all)" ] || fail "detach: a job is left: $("$CUSNAP" ps)"
[ "$SUM0" = "$(sums)" ] || fail "detach: the killed restore changed the checkpoint"
pass "restore --detach, its supervisor killed while CRIU ran: the watch said so on the command's stderr, no job left"

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
  pass "killed in the driver's restore: the restored process ended, the watch said so, no job left"
fi

# --- the checkpoint restores afterwards and the job counts on
restore_continues "$T/ck" "$T/r.out" rkill "$PID" "$LAST"
pass "the checkpoint restores after the killed restores, counting on from $FIRST"
kill -TERM "$SUP"
wait_exit "$SUP"
wait_gone "$PID"
