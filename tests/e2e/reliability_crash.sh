#!/usr/bin/env bash
# Crashes and races around a checkpoint:
#  - the disk fills during the dump (an 8 MiB tmpfs): the checkpoint fails,
#    nothing restorable is left, the job runs on intact;
#  - CRIU fails the restore: nothing is left running, the checkpoint is
#    unchanged and restores afterwards;
#  - the job exits during a checkpoint or a suspend: it fails cleanly (exit
#    1), saying the job ended, and the supervisor ends with the job's status;
#  - a checkpoint asked for while the job is being launched: it is refused
#    or it completes and restores; the job is never lost;
#  - the supervising cusnap is killed (SIGKILL) while the driver has the job
#    locked: the guardian brings the job back (docs/reliability.md); so is
#    the guardian once it supervises the job: a guardian of its own does;
#  - it is killed before its checkpoint claimed its -o DIR, into which
#    another job's checkpoint writes: that checkpoint is left whole.
source "$(dirname "$0")/lib_checkpoint.sh"
source "$(dirname "$0")/lib_reliability.sh"
REAL_CRIU=${CUSNAP_CRIU:-$(PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin command -v criu)}
SMALL=$T/small
cleanup_mount() { mountpoint -q "$SMALL" 2>/dev/null && umount -l "$SMALL" || true; }
trap 'st=$?; set +e; cleanup_mount; (exit $st); cleanup_checkpoint_test' EXIT

# A kill meant to land inside a slowed driver call waits for that call's
# trace line (wait_driver_call, lib_checkpoint.sh); launch_env keeps
# FAKECUDA_LOG=1 from the job.
# wait_entered PID FILE CALL BEFORE CMD CMD-OUT: waits (30 s at most, while the
# command CMD runs) until PID has begun more than BEFORE CALLs, or fails. Sets
# ABSENT to the last moment (usecs) that call had surely not begun.
wait_entered() {
  wait_driver_call "$2" "$3" "$4" "$5" "$1" ||
    fail "process $1 did not begin $3 (command ended: $(kill -0 "$5" 2>/dev/null && echo no || echo yes)): $(cat "$6")"
}

# --- the disk fills during the dump
mkdir -p "$SMALL"
if mount -t tmpfs -o size=8m tmpfs "$SMALL" 2>/dev/null; then
  launch full "$T/full.out" "$PATTERN_JOB" --mib 32 --interval-ms 20
  wait_count "$T/full.out" 3
  PID=$(wait_job full)
  expect_refused 1 "CRIU dump phase|No space|space" "$CUSNAP" checkpoint full -o "$SMALL/ck"
  [ ! -e "$SMALL/ck/manifest.json" ] || fail "a full disk left a manifest"
  [ -z "$(ls -A "$SMALL")" ] || fail "a full disk left files behind: $(ls -R "$SMALL" | head)"
  expect_running full "$PID" "$T/full.out"
  pass "disk full during the dump: no checkpoint left, the job runs on"
  kill -TERM "$LAST_SUPERVISOR"; wait_exit "$LAST_SUPERVISOR"; wait_gone "$PID"
  cleanup_mount
else
  echo "note: cannot mount a tmpfs here; the disk-full case was not run"
fi

# --- a checkpoint to restore from
checkpointed_job base "$T/base.out" "$T/ck"

# --- CRIU fails the restore
mkdir -p "$T/badcriu"
cat >"$T/badcriu/criu" <<SH
#!/bin/sh
if [ "\$1" = restore ]; then echo "Error (fake): restore refused for the test" >&2; exit 1; fi
exec "$REAL_CRIU" "\$@"
SH
chmod +x "$T/badcriu/criu"
SUM0=$(cd "$T/ck" && find . -type f ! -name stats-restore -exec sha256sum {} + | sort | sha256sum)
expect_refused 1 "CRIU restore phase|criu restore" env CUSNAP_CRIU="$T/badcriu/criu" "$CUSNAP" restore "$T/ck"
sleep 0.3
[ ! -e "/proc/$PID" ] || fail "a failed CRIU restore left process $PID"
[ -z "$(job_pids_all)" ] || fail "a failed CRIU restore left a job"
SUM1=$(cd "$T/ck" && find . -type f ! -name stats-restore -exec sha256sum {} + | sort | sha256sum)
[ "$SUM0" = "$SUM1" ] || fail "the failed restore changed the checkpoint"
restore_bg "$T/ck" "$T/r1.out"
wait_count "$T/r1.out" $((LAST + 3))
[ "$(first_count "$T/r1.out")" = $((LAST + 1)) ] || fail "the restore after a CRIU failure did not continue"
pass "CRIU restore failure: nothing left running, the checkpoint restores afterwards"
kill -TERM "$LAST_SUPERVISOR"; wait_exit "$LAST_SUPERVISOR"; wait_gone "$PID"

# --- the job exits during a checkpoint (the lock is slowed down)
if fake_only "the job killed during a checkpoint and a suspend (needs FAKECUDA_DELAY)"; then
launch_env quit "$T/quit.out" FAKECUDA_LOG=1 FAKECUDA_DELAY=cuCheckpointProcessLock:1500 -- --mib 4 --interval-ms 20
SUP=$LAST_SUPERVISOR
wait_count "$T/quit.out" 3
PID=$(wait_job quit)
before=$(calls_begun "$T/quit.out" cuCheckpointProcessLock "$SUP")
"$CUSNAP" checkpoint quit -o "$T/quit.ck" >"$T/quit-ck.out" 2>&1 &
CK=$!
# Killed once the supervisor is in the (slowed) lock.
wait_entered "$SUP" "$T/quit.out" cuCheckpointProcessLock "$before" "$CK" "$T/quit-ck.out"
kill -KILL "$PID"
RC=0; wait "$CK" || RC=$?
[ "$RC" != 0 ] && [ "$RC" != 6 ] || fail "checkpoint of a job that died under it: exit $RC: $(cat "$T/quit-ck.out")"
[ ! -e "$T/quit.ck/manifest.json" ] || fail "a checkpoint of a dead job wrote a manifest"
grep -q "process $PID ended during the driver's lock.*the job ended" "$T/quit-ck.out" ||
  fail "the checkpoint does not say the job ended: $(cat "$T/quit-ck.out")"
wait_exit "$SUP"
[ "$EXIT_RC" = 137 ] || fail "the supervisor exited $EXIT_RC, expected 137 (the job's SIGKILL)"
[ ! -e "$CUSNAP_RUNTIME_BASE/quit" ] || fail "the runtime directory of the ended job is still there"
pass "job killed during a checkpoint: exit $RC ($(grep -m1 'cusnap:' "$T/quit-ck.out" | cut -c1-100)), supervisor exits 137"

# --- the job exits during a suspend's driver checkpoint: nothing is left
# suspended (was exit 6 and "run cusnap resume", for a job that was gone)
launch_env squit "$T/squit.out" FAKECUDA_LOG=1 FAKECUDA_DELAY=cuCheckpointProcessCheckpoint:1500 -- --mib 4 --interval-ms 20
SUP=$LAST_SUPERVISOR
wait_count "$T/squit.out" 3
PID=$(wait_job squit)
before=$(calls_begun "$T/squit.out" cuCheckpointProcessCheckpoint "$SUP")
"$CUSNAP" suspend squit >"$T/squit-s.out" 2>&1 &
CK=$!
# Killed once the supervisor is in the (slowed) driver checkpoint.
wait_entered "$SUP" "$T/squit.out" cuCheckpointProcessCheckpoint "$before" "$CK" "$T/squit-s.out"
kill -KILL "$PID"
RC=0; wait "$CK" || RC=$?
[ "$RC" = 1 ] || fail "suspend of a job that died under it: exit $RC, expected 1: $(cat "$T/squit-s.out")"
grep -q "process $PID ended during the driver's checkpoint.*the job ended" "$T/squit-s.out" ||
  fail "the suspend does not say the job ended: $(cat "$T/squit-s.out")"
grep -q "resume" "$T/squit-s.out" && fail "the suspend sends the user to resume a job that is gone: $(cat "$T/squit-s.out")"
wait_exit "$SUP"
[ "$EXIT_RC" = 137 ] || fail "the supervisor exited $EXIT_RC, expected 137 (the job's SIGKILL)"
pass "job killed during a suspend: exit 1, the job said to have ended"

fi

# --- a checkpoint asked for while the job is being launched
"$CUSNAP" launch --name early -- "$PATTERN_JOB" --mib 4 --interval-ms 20 >"$T/early.out" 2>&1 &
SUPERVISORS+=($!)
SUP=$!
RC=none
for _ in $(seq 1 200); do
  rc=0; "$CUSNAP" checkpoint early -o "$T/early.ck" --leave-running >"$T/early-ck.out" 2>&1 || rc=$?
  if [ "$rc" != 4 ]; then RC=$rc; break; fi  # 4: not there yet
  sleep 0.01
done
case $RC in
  0) [ -f "$T/early.ck/manifest.json" ] || fail "early checkpoint without a manifest" ;;
  1 | 3) [ ! -e "$T/early.ck/manifest.json" ] || fail "a refused early checkpoint left a manifest" ;;
  *) fail "checkpoint during launch: exit $RC: $(cat "$T/early-ck.out")" ;;
esac
wait_count "$T/early.out" 3
PID=$(wait_job early)
expect_running early "$PID" "$T/early.out"
pass "checkpoint during launch: exit $RC, the job runs on"
if [ "$RC" = 0 ]; then
  kill -TERM "$SUP"; wait_exit "$SUP"; wait_gone "$PID"
  restore_bg "$T/early.ck" "$T/early-r.out"
  wait_count "$T/early-r.out" 3
  grep -q "pattern mismatch" "$T/early-r.out" && fail "the early checkpoint restored damaged"
  pass "the checkpoint taken during launch restores"
  kill -TERM "$LAST_SUPERVISOR"; wait_exit "$LAST_SUPERVISOR"; wait_gone "$PID"
else
  kill -TERM "$SUP"; wait_exit "$SUP"; wait_gone "$PID"
fi

# --- the supervising cusnap is killed while the driver holds the job locked
CU_PROCESS_STATE_LOCKED=1  # cuda.h's CUprocessState, as fakecuda_ckpt prints it
if fake_only "the supervisor killed mid-checkpoint (needs FAKECUDA_DELAY, fakecuda_ckpt)"; then
launch_env orphan "$T/orphan.out" FAKECUDA_LOG=1 FAKECUDA_DELAY=cuCheckpointProcessCheckpoint:3000 -- --mib 4 --interval-ms 20
SUP=$LAST_SUPERVISOR
wait_count "$T/orphan.out" 3
PID=$(wait_job orphan)
before=$(calls_begun "$T/orphan.out" cuCheckpointProcessCheckpoint "$SUP")
"$CUSNAP" checkpoint orphan -o "$T/orphan.ck" --json >"$T/orphan-ck.json" 2>"$T/orphan-ck.out" &
CK=$!
# Killed once the supervisor is in the (slowed) driver checkpoint: the job
# is locked.
wait_entered "$SUP" "$T/orphan.out" cuCheckpointProcessCheckpoint "$before" "$CK" "$T/orphan-ck.out"
kill -KILL "$SUP"
RC=0; wait "$CK" || RC=$?
wait "$SUP" 2>/dev/null || true
[ "$RC" = 1 ] || fail "the checkpoint exited $RC after its supervisor was killed: $(cat "$T/orphan-ck.out")"
# Its JSON names the job, whose supervisor had answered.
python3 -c '
import json, sys
j = json.loads(open(sys.argv[1]).read())
assert j["ok"] is False and j["exit_code"] == 1 and j["error"], j
assert j["job"] == j["name"] == "orphan" and j["pid"] == int(sys.argv[2]), j' "$T/orphan-ck.json" "$PID" ||
  fail "the failed checkpoint's --json: $(cat "$T/orphan-ck.json")"
[ ! -e "$T/orphan.ck/manifest.json" ] || fail "a manifest exists after the supervisor was killed"
kill -0 "$PID" 2>/dev/null || fail "the job died with its supervisor"
# The guardian brings the job back: driver state running again, the job's
# output flowing into its log, the unfinished checkpoint removed, with the
# directory it made.
expect_guardian_brought_back orphan "$PID"
BRINGS="cusnap: the supervisor of job orphan died during checkpoint; the guardian brings the job back"
[ "$(grep -cF "$BRINGS" "$LOG")" = 1 ] ||
  fail "the guardian did not say once that it brings the job back from the checkpoint: $(grep cusnap: "$LOG")"
[ ! -e "$T/orphan.ck" ] || fail "the unfinished checkpoint was left: $(ls -la "$T/orphan.ck")"
echo "   after the supervisor's death: job $PID running (driver state 0), counting on in its log ($N -> $(last_count "$LOG")), client exit $RC"
grep "cusnap: guardian:" "$LOG" | sed 's/^/   /'
# The guardian supervises it now: ps finds it, and a later checkpoint works
# and restores.
[ "$(job_field orphan pid)" = "$PID" ] || fail "cusnap ps does not list the job the guardian supervises"
GUARD=$(job_field orphan supervisor_pid)
# The guardian, supervising now, killed during a checkpoint too: a guardian of
# its own brings the job back and supervises it (before: it had none; the job
# stayed locked, and ps removed its runtime directory).
# The guardian traces nothing (its stderr is /dev/null): the driver's state
# of the job tells when it is locked, which it stays through the slowed
# driver checkpoint. This time the directory is given empty: it stays, empty.
mkdir -m 0700 "$T/orphan.ck"
"$CUSNAP" checkpoint orphan -o "$T/orphan.ck" >"$T/orphan-ck.out" 2>&1 &
CK=$!
wait_driver_state "$PID" "$CU_PROCESS_STATE_LOCKED" "$CK" 30 ||
  fail "the guardian's checkpoint did not lock the job (driver state '$DRIVER_STATE'): $(cat "$T/orphan-ck.out")"
kill -KILL "$GUARD"
RC=0; wait "$CK" || RC=$?
[ "$RC" != 0 ] || fail "the checkpoint reported success after its supervisor (a guardian) was killed"
for _ in $(seq 1 200); do
  [ "$(grep -c "guardian: the job runs on, supervised by process" "$LOG")" -ge 2 ] && break
  sleep 0.05
done
[ "$(grep -c "guardian: the job runs on, supervised by process" "$LOG")" -ge 2 ] ||
  fail "no guardian brought the job back after the guardian supervising it was killed: $(grep cusnap: "$LOG")"
[ "$(grep -cF "$BRINGS" "$LOG")" = 2 ] ||
  fail "the second guardian did not say it brings the job back from the checkpoint: $(grep cusnap: "$LOG")"
wait_guardian orphan "$GUARD" running
state=$("$CUSNAP_FAKECUDA_DIR/fakecuda_ckpt" state "$PID" 2>&1 || true)
case $state in *"state 0"*) ;; *) fail "after the second guardian's recovery the driver state is '$state'" ;; esac
N=$(last_count "$LOG")
wait_count "$LOG" $((N + 5)) "" 20
[ -d "$T/orphan.ck" ] && [ -z "$(ls -A "$T/orphan.ck")" ] ||
  fail "the directory given empty is gone or not empty: $(ls -la "$T/orphan.ck" 2>&1)"
echo "   the guardian supervising the job killed mid-checkpoint: brought back again, supervised by $GUARD"
rm -rf "$T/orphan.ck"
BEFORE_CK=$(last_count "$LOG")
"$CUSNAP" checkpoint orphan -o "$T/orphan.ck2" >"$T/orphan-ck2.out" 2>&1 ||
  fail "a checkpoint after the guardian took over failed: $(cat "$T/orphan-ck2.out")"
wait_gone "$PID"
for _ in $(seq 1 100); do kill -0 "$GUARD" 2>/dev/null || break; sleep 0.05; done
kill -0 "$GUARD" 2>/dev/null && fail "the guardian (supervisor $GUARD) did not end with the job"
# (The log went with the runtime directory when the job stopped.)
restore_bg "$T/orphan.ck2" "$T/orphan-r.out"
wait_count "$T/orphan-r.out" $((BEFORE_CK + 2))
[ "$(first_count "$T/orphan-r.out")" -gt "$BEFORE_CK" ] ||
  fail "the restored job began at $(first_count "$T/orphan-r.out"), not after $BEFORE_CK"
grep -q "pattern mismatch" "$T/orphan-r.out" && fail "the restored job found a wrong byte"
# Its supervisor killed while idle: the guardian that takes over keeps when
# the job started and what it was restored from (cusnap ps showed neither).
STARTED=$(job_field orphan started)
[ "$(job_field orphan restored_from)" = "$T/orphan.ck2" ] || fail "restored_from: '$(job_field orphan restored_from)'"
kill -KILL "$LAST_SUPERVISOR"
wait "$LAST_SUPERVISOR" 2>/dev/null || true
for _ in $(seq 1 200); do
  GUARD=$(job_field orphan supervisor_pid)
  [ -n "$GUARD" ] && [ "$GUARD" != "$LAST_SUPERVISOR" ] && break
  sleep 0.05
done
[ -n "$GUARD" ] && [ "$GUARD" != "$LAST_SUPERVISOR" ] || fail "no guardian took over the restored job"
[ "$(job_field orphan started)" = "$STARTED" ] ||
  fail "after the guardian took over, started is $(job_field orphan started), was $STARTED"
[ "$(job_field orphan restored_from)" = "$T/orphan.ck2" ] ||
  fail "after the guardian took over, restored_from is '$(job_field orphan restored_from)'"
kill -TERM "$GUARD"; wait_gone "$PID"
pass "supervisor killed mid-checkpoint: no checkpoint; the guardian brought the job back and supervises it: a later checkpoint restores"

# --- the supervising cusnap killed before its checkpoint claimed its -o DIR,
# while another job's checkpoint writes into that DIR: the guardian of the
# first leaves the second's files alone (it removed them, taking the DIR it
# had found absent for its own), and the second checkpoint completes and
# restores.
# early2's checkpoint waits in its checks: its driver version query, which
# only an operation's checks make (not the guardian's recovery, though it
# inherits FAKECUDA_DELAY), is slowed, long enough for the other checkpoint's
# claim on a loaded machine.
EARLY2_MS=10000
launch_env early2 "$T/early2.out" FAKECUDA_LOG=1 FAKECUDA_DELAY=cuDriverGetVersion:$EARLY2_MS -- --mib 4 --interval-ms 20
SUP1=$LAST_SUPERVISOR
launch_env other "$T/other.out" FAKECUDA_DELAY=cuCheckpointProcessCheckpoint:3000 -- --mib 4 --interval-ms 20
wait_count "$T/early2.out" 3
wait_count "$T/other.out" 3
PID1=$(wait_job early2)
PID2=$(wait_job other)
SHARED_DIR=$T/shared.ck
before=$(calls_begun "$T/early2.out" cuDriverGetVersion "$SUP1")
"$CUSNAP" checkpoint early2 -o "$SHARED_DIR" >"$T/early2-ck.out" 2>&1 &
CK1=$!
wait_entered "$SUP1" "$T/early2.out" cuDriverGetVersion "$before" "$CK1" "$T/early2-ck.out"
"$CUSNAP" checkpoint other -o "$SHARED_DIR" --leave-running >"$T/other-ck.out" 2>&1 &
CK2=$!
# The claim, and the kill, well before early2's query returns (2 s spare).
while [ $(($(usecs "$EPOCHREALTIME") - ABSENT)) -lt $(((EARLY2_MS - 2000) * 1000)) ]; do
  [ -d "$SHARED_DIR/criu" ] && break
  sleep 0.02
done
[ -d "$SHARED_DIR/criu" ] ||
  fail "the second checkpoint did not claim $SHARED_DIR within $((EARLY2_MS / 1000 - 2)) s: $(cat "$T/other-ck.out")"
kill -KILL "$SUP1"
wait "$SUP1" 2>/dev/null || true
wait "$CK1" 2>/dev/null || true
expect_guardian_brought_back early2 "$PID1"
RC=0; wait "$CK2" || RC=$?
[ "$RC" = 0 ] || fail "the other job's checkpoint into $SHARED_DIR failed (exit $RC): $(cat "$T/other-ck.out")"
grep -q "unfinished checkpoint in $SHARED_DIR was removed" "$LOG" &&
  fail "the guardian of early2 removed what the other job's checkpoint wrote"
"$CUSNAP" inspect "$SHARED_DIR" >"$T/shared-inspect.out" 2>&1 ||
  fail "the other job's checkpoint does not verify: $(cat "$T/shared-inspect.out")"
expect_running other "$PID2" "$T/other.out"
kill -TERM "$LAST_SUPERVISOR"; wait_exit "$LAST_SUPERVISOR"; wait_gone "$PID2"
restore_bg "$SHARED_DIR" "$T/other-r.out"
wait_count "$T/other-r.out" 3
grep -q "pattern mismatch" "$T/other-r.out" && fail "the other job's checkpoint restored damaged"
kill -TERM "$LAST_SUPERVISOR"; wait_exit "$LAST_SUPERVISOR"; wait_gone "$PID2"
GUARD=$(job_field early2 supervisor_pid)
kill -TERM "$GUARD"
wait_gone "$PID1"
pass "supervisor killed before its checkpoint claimed its directory: another job's checkpoint there completed and restores"
fi
echo "PASS"
