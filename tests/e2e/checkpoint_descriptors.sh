#!/usr/bin/env bash
# The supervisor holds each process of the job by a descriptor (a pidfd)
# through a checkpoint, so that the stop, a roll back and the final kill
# reach every one. With too few descriptors left (its limit lowered while
# the job runs) the checkpoint must refuse before it changes anything,
# naming the limit, and the job must run on whole: a process it could not
# hold would otherwise be left out of the kill, stopped for good. Here the
# driver's cuInit, which needs descriptors too, is the first to find them
# short, on the real driver and the simulated one alike.
# A restore under too low a limit fails at whichever step runs short, says
# "ulimit -n", and leaves nothing behind.
source "$(dirname "$0")/lib_checkpoint.sh"

launch many "$T/launch.out" bash -c 'for _ in $(seq 40); do sleep 1000 & done; exec "$0" --mib 4 --interval-ms 20' "$PATTERN_JOB"
SUP=$LAST_SUPERVISOR
wait_count "$T/launch.out" 3
PID=$(wait_job many)
mapfile -t TREE < <(pgrep -s "$PID")
[ "${#TREE[@]}" -ge 41 ] || fail "the job has ${#TREE[@]} processes, expected at least 41"
open=$(find "/proc/$SUP/fd" -mindepth 1 | wc -l)
soft=$(prlimit --pid "$SUP" --nofile --output SOFT --noheadings | tr -d ' ')
prlimit --pid "$SUP" --nofile=$((open + 12)):  # the soft limit; the hard one stays
pass "job of ${#TREE[@]} processes; its supervisor's descriptor limit lowered to $((open + 12))"

# The driver needs 13 descriptors for its device files at cuInit, which
# comes first: with 12 left it fails CUDA_ERROR_NO_DEVICE (measured on an
# H200 and an H100; the simulated driver answers the same), and the refusal
# (exit 3) names the descriptors and the limit.
expect_refused 3 'no usable device: cuInit failed: CUDA_ERROR_NO_DEVICE.*descriptors open, too few left.*ulimit -n' \
  "$CUSNAP" checkpoint many -o "$T/ckpt"
[ ! -e "$T/ckpt" ] || fail "the refused checkpoint left $T/ckpt behind"
for p in "${TREE[@]}"; do
  state=$(awk '/^State:/ {print $2}' "/proc/$p/status" 2>/dev/null) || fail "process $p of the job is gone"
  [ "$state" != T ] || fail "process $p of the job was left stopped"
done
n=$(last_count "$T/launch.out")
wait_count "$T/launch.out" $((n + 3))
! grep -q "pattern mismatch" "$T/launch.out" || fail "the job's memory changed"
pass "refused before anything changed (exit 3); all ${#TREE[@]} processes run on, counting past $n"

prlimit --pid "$SUP" --nofile="$soft":
"$CUSNAP" checkpoint many -o "$T/ckpt" >"$T/ckpt2.out" 2>&1 || fail "checkpoint with the limit raised failed: $(cat "$T/ckpt2.out")"
wait_exit "$SUP"
for p in "${TREE[@]}"; do wait_gone "$p"; done
pass "with the limit raised again the checkpoint completes and every process is gone"

# A restore under too low a limit: whichever step runs short (listing the
# checkpoint, the supervisor's pipes, CRIU's version check, the driver's
# cuInit, CRIU's own descriptors above the job's), it fails saying
# "ulimit -n" once (a background supervisor short of descriptors still
# silences its own streams), leaves nothing in the runtime base and no job
# behind; in the foreground and with --detach.
# (At the lowest limits the loader may fail first, before cusnap runs, if
# the shell passes descriptors down: those limits are left out.)
for detach in "" --detach; do
  reached=0
  for n in 5 6 7 8 10 12 14 16 20 24 32 48 64; do
    rc=0
    (ulimit -n $n && exec timeout 60 "$CUSNAP" restore $detach "$T/ckpt") >"$T/low.out" 2>&1 || rc=$?
    what="restore $detach under ulimit -n $n"
    if [ "$rc" = 127 ] && [ "$n" -le 8 ] && grep -q "error while loading shared libraries" "$T/low.out"; then
      continue
    fi
    reached=$((reached + 1))
    [ "$rc" = 1 ] || [ "$rc" = 3 ] || fail "$what exited $rc: $(cat "$T/low.out")"
    grep -q 'raise "ulimit -n"' "$T/low.out" || fail "$what: no remedy: $(cat "$T/low.out")"
    [ "$(grep -c '^cusnap: error:' "$T/low.out")" = 1 ] || fail "$what: not one error: $(cat "$T/low.out")"
    left=$(find "$CUSNAP_RUNTIME_BASE" -mindepth 1 -maxdepth 1 ! -name .lock -printf '%f ')
    [ -z "$left" ] || fail "$what left $left in the runtime base: $(cat "$T/low.out")"
    [ -z "$(job_field many pid)" ] || fail "$what left job many"
    for p in "${TREE[@]}"; do ! kill -0 "$p" 2>/dev/null || fail "$what left process $p"; done
  done
  [ "$reached" -ge 9 ] || fail "restore $detach: only $reached of 13 limits got past the loader"
done
pass "restores under ulimit -n 5 to 64, with and without --detach, fail naming \"ulimit -n\", leaving nothing behind"
restore_bg "$T/ckpt" "$T/restore.out"
wait_count "$T/restore.out" $(($(last_count "$T/launch.out") + 3))
pass "with the limit as it was, the checkpoint restores and counts on"
echo "PASS"
