#!/usr/bin/env bash
# The supervising cusnap killed (SIGKILL) while `criu dump` runs, in a
# checkpoint of a job sharing device memory (cusnap-share-job): the shims
# have saved and released the shared memory, the driver has checkpointed
# both processes, and CRIU has dumped the tree and holds it seized (ptrace).
# The supervisor's CRIU (CUSNAP_CRIU) is the real one with an action script
# (lib_checkpoint.sh's criu_hold_at) that holds it at post-dump (every image
# written, the tree still seized) until the test releases it.
#   finish  CRIU is held 3 s after the kill, then finishes its dump as an
#           orphan (--leave-stopped: the tree stays stopped); the guardian
#           waits for it before it brings the job back
#   hung    CRIU is held until killed; the guardian waits
#           CUSNAP_GUARDIAN_CRIU_WAIT_MS (2 s here), then kills it
# In both: the checkpoint does not report success, no criu process is left,
# the unfinished checkpoint is removed (restoring it fails: no manifest), the
# job counts on with every byte right and each process seeing the other's
# writes, the guardian supervises it, and a later checkpoint works and
# restores.
source "$(dirname "$0")/lib_shared.sh"
fake_only "the guardian's recovery of the simulated driver's state" || exit 77

PREFIXES=("" "importer ")
criu_hold_setup
criu_left() { pgrep -f "criu.* $T/" 2>/dev/null || true; }

# tracers PID...: the TracerPid of every thread of the processes.
tracers() {
  local p
  for p in "$@"; do cat /proc/"$p"/task/*/status 2>/dev/null | awk '/^TracerPid:/ {print $2}'; done | sort -u
}

run_case() {
  local name=$1 sup_env=$2 ck=$T/$1.ckpt p n rc=0
  LAUNCH_OUT=$T/$name.out
  env CUSNAP_CRIU="$HOLD_CRIU" $sup_env "$CUSNAP" launch --name "$name" -- \
    "$SHARE_JOB" --mib 4 --interval-ms 20 >"$LAUNCH_OUT" 2>&1 &
  SUPERVISORS+=($!)
  SUP=$!
  for p in "${PREFIXES[@]}"; do wait_count "$LAUNCH_OUT" 5 "$p" 30; done
  PID=$(wait_job "$name")
  ready_pids "$LAUNCH_OUT" >>"$T/job-pids"
  local pids
  pids=$(ready_pids "$LAUNCH_OUT")
  criu_hold_at post-dump
  "$CUSNAP" checkpoint "$name" -o "$ck" >"$T/$name.ck.out" 2>&1 &
  local CK=$!
  criu_held 30 || fail "$name: CRIU's dump did not reach post-dump: $(cat "$T/$name.ck.out")"
  # CRIU holds the tree now: every thread of the job is traced by it.
  local tr
  tr=$(tracers $pids)
  [ -n "$tr" ] && [ "$tr" != 0 ] || fail "$name: the job's threads are not traced during the dump ($tr)"
  [ -n "$(criu_left)" ] || fail "$name: no criu runs during the dump"
  kill -KILL "$SUP"
  echo "   $name: supervisor $SUP killed while criu ($(criu_left | tr '\n' ' ')) holds the job (TracerPid $tr)"
  [ "$name" = finish ] && { sleep 3; criu_release; }
  wait "$CK" || rc=$?
  [ "$rc" != 0 ] || fail "$name: the checkpoint reported success after its supervisor was killed"
  grep -q "^cusnap: .*restored job\|checkpointed to" "$T/$name.ck.out" &&
    fail "$name: the checkpoint client reported a checkpoint: $(cat "$T/$name.ck.out")"
  local LOG=$CUSNAP_RUNTIME_BASE/$name/output.log
  for _ in $(seq 1 600); do grep -q "guardian: the job runs on" "$LOG" 2>/dev/null && break; sleep 0.05; done
  grep -q "guardian: the job runs on, supervised by process" "$LOG" ||
    fail "$name: the guardian did not bring the job back: $(grep 'cusnap:' "$LOG" 2>/dev/null)"
  grep "cusnap: guardian:" "$LOG" | sed 's/^/     /'
  grep -q "guardian: CRIU (process [0-9, ]*) of the dead supervisor" "$LOG" ||
    fail "$name: the guardian did not see to the dead supervisor's CRIU"
  criu_release
  [ -z "$(criu_left)" ] || fail "$name: criu processes left: $(criu_left)"
  [ "$(tracers $pids)" = 0 ] || fail "$name: the job's threads are still traced: $(tracers $pids)"
  # The job runs on, its bytes right, each side seeing the other's writes.
  for p in "${PREFIXES[@]}"; do
    n=$(last_count "$LOG" "$p")
    wait_count "$LOG" $((n + 3)) "$p" 30
    wait_seen "$LOG" "$p" "$(last_seen "$LOG" "$p")"
  done
  for p in $pids; do
    kill -0 "$p" 2>/dev/null || fail "$name: process $p of the job died"
    grep -q "^State:.*[tT] (" /proc/"$p"/status && fail "$name: process $p is left stopped"
  done
  no_errors "$LOG"
  # The unfinished checkpoint: removed, and it does not restore.
  [ ! -e "$ck/manifest.json" ] || fail "$name: the unfinished checkpoint has a manifest"
  [ -z "$(ls -A "$ck" 2>/dev/null)" ] || fail "$name: the unfinished checkpoint was left: $(ls -A "$ck")"
  rc=0
  "$CUSNAP" restore "$ck" >"$T/$name.bad-restore.out" 2>&1 || rc=$?
  [ "$rc" != 0 ] || fail "$name: the unfinished checkpoint restored"
  for p in $pids; do kill -0 "$p" 2>/dev/null || fail "$name: restoring the unfinished checkpoint hurt process $p"; done
  pass "$name: killed mid-dump: no checkpoint (restore exits $rc), no criu left, the job counts on"

  # The guardian supervises the job: a later checkpoint works and restores.
  local GUARD
  GUARD=$(job_field "$name" supervisor_pid)
  [ -n "$GUARD" ] && [ "$GUARD" != "$SUP" ] || fail "$name: cusnap ps does not show the guardian supervising the job"
  rm -rf "$ck"
  # The log goes with the job's runtime directory when it stops: a copy.
  tail -n +1 -f "$LOG" >"$T/$name.log" &
  local TAIL=$!
  "$CUSNAP" checkpoint "$name" -o "$ck" >"$T/$name.ck2.out" 2>&1 ||
    fail "$name: a checkpoint after the guardian took over failed: $(cat "$T/$name.ck2.out")"
  for p in $pids; do wait_gone "$p" 20; done
  wait_gone "$GUARD" 20
  sleep 0.3
  kill "$TAIL"
  wait "$TAIL" 2>/dev/null || true
  no_errors "$T/$name.log"
  note_last "$T/$name.log"
  restore_bg "$ck" "$T/$name.restore.out"
  SUP=$LAST_SUPERVISOR
  expect_continued "$T/$name.restore.out" 1
  pass "$name: a later checkpoint of the guardian-supervised job restored"
  stop_job "$LAUNCH_OUT"
}

run_case finish ""
run_case hung "CUSNAP_GUARDIAN_CRIU_WAIT_MS=2000"
echo "PASS"
