#!/usr/bin/env bash
# A job that shares no device memory when a checkpoint or suspend looks at it,
# and begins to share while the driver phase runs: the driver would save an
# importer it cannot restore, so the operation rolls back, naming the process,
# and the job runs on; the next checkpoint sees the sharing, saves it through
# the shim, and restores. A shim that cannot be asked again counts as
# sharing. The sharing has to begin before the driver has locked every
# process (it is checked then, before any driver checkpoint): the simulated
# driver's lock is slowed (FAKECUDA_DELAY, in the supervisor, which calls
# it); the real driver's lock takes milliseconds.
source "$(dirname "$0")/lib_checkpoint.sh"
fake_only "a slowed driver lock (FAKECUDA_DELAY)" || skip "needs the simulated driver's slowed lock"
export FAKECUDA_DELAY=cuCheckpointProcessLock:1500
# job.sh TAG: a pattern worker, and two pairs that begin to share at their
# trigger files $T/go-TAG-1 and -2 (output in $T/share-TAG-I.out).
cat >"$T/job.sh" <<EOF
#!/bin/bash
"$PATTERN_JOB" --mib 1 --interval-ms 20 &
for i in 1 2; do
  "$SHARE_JOB" --mib 4 --interval-ms 20 --share-after "$T/go-\$1-\$i" >"$T/share-\$1-\$i.out" 2>&1 &
done
wait
EOF
chmod +x "$T/job.sh"

# start TAG: launches job TAG; sets SUP and PID once every process is set up.
# The supervisor alone traces its driver calls into SUP_OUT (FAKECUDA_LOG),
# for rolls_back_when to begin the sharing during its lock.
start() {
  SUP_OUT=$T/$1.out
  FAKECUDA_LOG=1 launch "$1" "$SUP_OUT" env -u FAKECUDA_LOG "$T/job.sh" "$1"
  SUP=$LAST_SUPERVISOR
  wait_count "$T/$1.out" 5
  PID=$(wait_job "$1")
  local i
  for i in 1 2; do
    for _ in $(seq 1 400); do
      [ "$(grep -c waiting "$T/share-$1-$i.out" 2>/dev/null)" = 2 ] && break
      sleep 0.05
    done
    [ "$(grep -c waiting "$T/share-$1-$i.out")" = 2 ] || fail "pair $i of $1 did not set up"
  done
}

# refused_for_sharing OP TAG: runs `cusnap OP TAG` on a job that shares
# nothing, and lets its first pair begin to share during the driver phase.
refused_for_sharing() {
  local op=$1 tag=$2
  rolls_back_when "$tag" "$op" "$T/go-$tag-1" "began to share device memory" \
    wait_count "$T/share-$tag-1.out" 1 "importer " 20
  expect_running "$tag" "$PID" "$T/$tag.out"
  local n
  n=$(last_count "$T/share-$tag-1.out" "importer ")
  wait_count "$T/share-$tag-1.out" $((n + 2)) "importer "
  grep -q "mismatch\|ended" "$T/share-$tag-1.out" && fail "pair 1 of $tag found a wrong byte"
  pass "$op rolled back: $(grep -o 'process [0-9]*: it began to share device memory' "$T/$op.out")"
}

start su
refused_for_sharing suspend su

# A shim that cannot be asked again (its socket removed during the driver
# phase) may have begun to share: the checkpoint rolls back as well.
SUP_OUT=$T/gone.out
FAKECUDA_LOG=1 launch gone "$SUP_OUT" env -u FAKECUDA_LOG "$PATTERN_JOB" --mib 1 --interval-ms 20
wait_count "$T/gone.out" 5
GONE=$(wait_job gone)
rolls_back_when gone checkpoint "$T/go-gone" "its shim did not answer a second look" \
  bash -c "rm -f '$CUSNAP_RUNTIME_BASE'/gone/shim-ctl.*.sock"
expect_running gone "$GONE" "$T/gone.out"
pass "a shim gone silent during the driver phase: rolled back, the job runs on"
start ck
refused_for_sharing checkpoint ck

# Seen sharing now, the job is checkpointed through the shim, its gates
# closed: the second pair, told to share during it, waits at its gate (or
# shared before the gates closed, which the records read then show).
"$CUSNAP" checkpoint ck -o "$T/ckpt" >"$T/ckpt.out" 2>&1 &
CMD=$!
sleep 0.5
touch "$T/go-ck-2"
wait "$CMD" || fail "checkpoint failed: $(cat "$T/ckpt.out")"
wait_exit "$SUP"
wait_gone "$PID"
L0=$(last_count "$T/ck.out")
declare -A L
for i in 1 2; do
  L[$i]=$(last_count "$T/share-ck-$i.out")
  L[i$i]=$(last_count "$T/share-ck-$i.out" "importer ")
done
restore_bg "$T/ckpt" "$T/restore.out"
wait_count "$T/restore.out" $((L0 + 3))
for i in 1 2; do
  wait_count "$T/share-ck-$i.out" $((L[$i] + 3))
  wait_count "$T/share-ck-$i.out" $((L[i$i] + 3)) "importer "
  grep -q "mismatch\|ended" "$T/share-ck-$i.out" && fail "restored pair $i found a wrong byte"
done
pass "checkpointed through the shim (pair 2's importer at ${L[i2]} before it) and restored; every process counts on"
echo "PASS"
