#!/usr/bin/env bash
# suspend of two processes sharing a POSIX-fd allocation: the shim's gate
# holds their driver calls, so neither count advances while suspended and
# both processes stay; resume: both count on, the bytes intact, each seeing
# the other's writes again. The supervisor killed during a suspend: its
# guardian rebuilds the shared memory and removes what was saved.
source "$(dirname "$0")/lib_shared.sh"

PREFIXES=("" "importer ")
LAUNCH_OUT=$T/launch.out
start_job susp "$LAUNCH_OUT" "$SHARE_JOB" --mib 4 --interval-ms 20
"$CUSNAP" suspend susp >"$T/suspend.out" 2>&1 || fail "suspend failed (exit $?): $(cat "$T/suspend.out")"
counts_held "$LAUNCH_OUT" 1.5
for p in $(ready_pids "$LAUNCH_OUT"); do kill -0 "$p" || fail "process $p is gone while suspended"; done
pass "suspended: counts held at ${LAST[*]}"

"$CUSNAP" resume susp >"$T/resume.out" 2>&1 || fail "resume failed (exit $?): $(cat "$T/resume.out")"
note_last "$LAUNCH_OUT"
for p in "${PREFIXES[@]}"; do expect_running susp "$PID" "$LAUNCH_OUT" "$p"; done
for k in "${!PREFIXES[@]}"; do wait_seen "$LAUNCH_OUT" "${PREFIXES[k]}" "${SEEN[k]}"; done
no_errors "$LAUNCH_OUT"
pass "resumed: both count on and share their memory"

# The supervisor killed during a suspend, after the release: its guardian
# rebuilds the shared memory from what the suspend saved, and removes it
# (before: left in the runtime directory, its records naming processes to a
# later resume's rebuild); a suspend and resume through the guardian work.
LAUNCH_OUT=$T/orphan.out
if [ "$REAL_DRIVER" = 1 ]; then
  # The real driver is neither traced nor slowed: each process holds 16 GiB
  # of its own, which its driver checkpoint copies (seconds on an H100; with
  # 4 MiB the whole suspend could end within the half second below).
  start_job orphan "$LAUNCH_OUT" "$SHARE_JOB" --mib 4 --interval-ms 20 --private-mib 16384
else
  slow_driver_checkpoint_job orphan "$LAUNCH_OUT"
fi
SAVED=$CUSNAP_RUNTIME_BASE/orphan/suspended
"$CUSNAP" suspend orphan >"$T/orphan.suspend.out" 2>&1 &
SU=$!
# Killed once the driver checkpoint has begun: the save and release are done.
# On the real driver: the first saved file, then half a second.
if [ "$REAL_DRIVER" = 1 ]; then
  for _ in $(seq 1 100); do [ -n "$(ls "$SAVED/shared" 2>/dev/null)" ] && break; sleep 0.02; done
  sleep 0.5
else
  wait_driver_checkpoint "$LAUNCH_OUT" "$SU"
fi
[ -n "$(ls "$SAVED/shared" 2>/dev/null)" ] || fail "the suspend saved nothing in $SAVED"
kill -KILL "$SUP"
wait "$SU" 2>/dev/null && fail "the suspend reported success after its supervisor was killed"
LOG=$CUSNAP_RUNTIME_BASE/orphan/output.log
# The guardian waits for the driver checkpoint under way, then restores:
# seconds on the real driver (32 GiB copied out and back on an H100 took
# longer than 10 s), so up to 120 s, until it says how the job ended up.
for _ in $(seq 1 2400); do
  grep -qE "guardian: (the job (runs on|cannot|could not|has ended)|cannot supervise)" "$LOG" 2>/dev/null && break
  sleep 0.05
done
grep -q "guardian: shared memory of 2 process(es): rebuilt" "$LOG" ||
  fail "the guardian did not rebuild the shared memory: $(grep 'cusnap:' "$LOG" 2>/dev/null)"
for p in "${PREFIXES[@]}"; do
  n=$(last_count "$LOG" "$p")
  wait_count "$LOG" $((n + 3)) "$p" 30
done
[ ! -e "$SAVED" ] || fail "what the suspend saved was left after the guardian rebuilt it: $(ls -R "$SAVED")"
"$CUSNAP" suspend orphan >"$T/orphan.suspend2.out" 2>&1 ||
  fail "a suspend through the guardian failed: $(cat "$T/orphan.suspend2.out")"
"$CUSNAP" resume orphan >"$T/orphan.resume2.out" 2>&1 ||
  fail "a resume through the guardian failed: $(cat "$T/orphan.resume2.out")"
for p in "${PREFIXES[@]}"; do
  n=$(last_count "$LOG" "$p")
  wait_count "$LOG" $((n + 3)) "$p" 30
  wait_seen "$LOG" "$p" "$(last_seen "$LOG" "$p")"
done
no_errors "$LOG"
pass "supervisor killed during a suspend: the guardian rebuilt the shared memory and removed what was saved; suspend and resume work after"
for p in $(ready_pids "$LAUNCH_OUT"); do kill -KILL "$p" 2>/dev/null; done
echo "PASS"
