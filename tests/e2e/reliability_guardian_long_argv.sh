#!/usr/bin/env bash
# A job whose command line is longer than one exec argument may be (128 KiB)
# keeps a working guardian. The supervisor hands the guardian the job's
# description in a memory file; it used to pass it as one argument, which
# exec refused (E2BIG), leaving the guardian in the supervisor's image — after
# a restore, a process forked from one that initialized the driver, where
# cuInit and device queries fail (tests/gpu/probes/fork_after_init.cpp):
#   - launch a job with about 160 KiB of arguments; its guardian runs as
#     `cusnap __guardian`;
#   - checkpoint it, restore it: the restore's guardian runs as
#     `cusnap __guardian` too, and the job counts on from the next count;
#   - the restore's supervisor is killed in the middle of a checkpoint, in its
#     CRIU dump (a CRIU that waits there), the job's GPU state checkpointed:
#     its guardian brings the job back, driver state running, the job
#     counting on in its log with every byte right, supervised by the
#     guardian, the unfinished checkpoint removed.
source "$(dirname "$0")/lib_checkpoint.sh"
source "$(dirname "$0")/lib_reliability.sh"

NAME=longargv
OUT=$T/$NAME.out
# env's assignments make the job's command line long without changing what
# the pattern job does.
LONG=()
for i in $(seq 1 1600); do LONG+=("CUSNAP_LONG_$i=$(printf '%0100d' "$i")"); done
launch "$NAME" "$OUT" env "${LONG[@]}" "$PATTERN_JOB" --mib 4 --interval-ms 20
SUP=$LAST_SUPERVISOR
wait_count "$OUT" 3
PID=$(wait_job "$NAME")
# The command line the supervisor recorded (env's, not the pattern job's
# after env executed it).
BYTES=$(python3 -c 'import json, sys; print(sum(len(a) + 1 for a in json.load(open(sys.argv[1]))["argv"]))' \
  "$CUSNAP_RUNTIME_BASE/$NAME/job.json")
[ "$BYTES" -gt $((150 * 1024)) ] || fail "the job's command line is $BYTES bytes, meant to be over 150 KiB"

# guardian_of SUPERVISOR: the guardian's pid (the child named cusnap-guardian).
guardian_of() {
  local g
  for _ in $(seq 1 100); do
    g=$(ps -o pid=,comm= --ppid "$1" | awk '$2 == "cusnap-guardian" {print $1; exit}')
    [ -n "$g" ] && { echo "$g"; return; }
    sleep 0.05
  done
  fail "supervisor $1 has no guardian"
}
# expect_exec_guardian SUPERVISOR: its guardian runs as `cusnap __guardian`.
expect_exec_guardian() {
  local g cmd
  g=$(guardian_of "$1")
  cmd=$(tr '\0' ' ' <"/proc/$g/cmdline" | cut -c1-80)
  case $cmd in
    "cusnap __guardian "*) ;;
    *) fail "the guardian of supervisor $1 runs as '$cmd', not as cusnap __guardian (it was not executed)" ;;
  esac
}
expect_exec_guardian "$SUP"
pass "a job with $BYTES bytes of command line: its guardian runs as cusnap __guardian"

"$CUSNAP" checkpoint "$NAME" -o "$T/ck" >"$T/ck.out" 2>&1 || fail "checkpoint: $(cat "$T/ck.out")"
wait_exit "$SUP"
wait_gone "$PID"
LAST=$(last_count "$OUT")
# The restore's CRIU: the real one, except that a dump waits, so that the
# supervisor can be killed in the middle of a checkpoint whose driver
# checkpoint is done (the job's GPU state out of the GPU).
REAL_CRIU=${CUSNAP_CRIU:-$(PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin command -v criu)}
cat >"$T/criu-wait" <<SH
#!/bin/sh
if [ "\$1" = dump ]; then echo \$\$ >"$T/dump.pid"; exec sleep 120; fi
exec "$REAL_CRIU" "\$@"
SH
chmod 755 "$T/criu-wait"
CUSNAP_CRIU="$T/criu-wait" restore_continues "$T/ck" "$T/r.out" "$NAME" "$PID" "$LAST"
expect_exec_guardian "$SUP"
pass "restored from count $FIRST: the restore's guardian runs as cusnap __guardian"

"$CUSNAP" checkpoint "$NAME" -o "$T/ck2" >"$T/ck2.out" 2>&1 &
CK=$!
for _ in $(seq 1 1200); do [ -s "$T/dump.pid" ] && break; sleep 0.05; done
[ -s "$T/dump.pid" ] || fail "the checkpoint never reached its dump: $(cat "$T/ck2.out")"
cat "$T/dump.pid" >>"$T/job-pids"
kill -KILL "$SUP"
wait "$SUP" 2>/dev/null || true
kill -KILL "$(cat "$T/dump.pid")" 2>/dev/null || true
RC=0; wait "$CK" || RC=$?
[ "$RC" != 0 ] || fail "the checkpoint reported success after its supervisor was killed"
kill -0 "$PID" 2>/dev/null || fail "the job died with its supervisor"
expect_guardian_brought_back "$NAME" "$PID"
[ "$(job_field "$NAME" pid)" = "$PID" ] || fail "cusnap ps does not list the job the guardian supervises"
[ -z "$(ls -A "$T/ck2" 2>/dev/null)" ] || fail "the unfinished checkpoint was left: $(ls "$T/ck2")"
grep "cusnap: guardian:" "$LOG" | sed 's/^/   /'
pass "the restore's supervisor killed in the dump: its guardian brought the job back (count $N -> $(last_count "$LOG"))"
echo "PASS"
