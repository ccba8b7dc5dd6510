#!/usr/bin/env bash
# A checkpoint that fails after it has started changing things rolls back:
# the job runs on as the same processes with their GPU state restored and
# their patterns intact, no checkpoint is left, and the error names the
# process and the phase. Failures are injected into the simulated driver
# (FAKECUDA_FAIL, in the supervisor that drives it) and into CRIU (a wrapper
# that fails dump).
source "$(dirname "$0")/lib_checkpoint.sh"

REAL_CRIU=${CUSNAP_CRIU:-$(PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin command -v criu)}

# rollback NAME TEXT JOB-ARGS... : the job's supervisor gets $ENVS.
rollback() {
  local name=$1 text=$2
  shift 2
  env "${ENVS[@]}" "$CUSNAP" launch --name "$name" -- "$PATTERN_JOB" "$@" >"$T/$name.out" 2>&1 &
  SUPERVISORS+=($!)
  wait_count "$T/$name.out" 3
  local pid
  pid=$(wait_job "$name")
  expect_refused 1 "$text" "$CUSNAP" checkpoint "$name" -o "$T/$name.ckpt"
  [ ! -e "$T/$name.ckpt" ] || fail "$name: the failed checkpoint left $T/$name.ckpt"
  expect_running "$name" "$pid" "$T/$name.out"
  if [ "${CHILD:-0}" = 1 ]; then expect_running "$name" "$pid" "$T/$name.out" "child 1 "; fi
  pass "$name: rolled back, job unchanged"
}

if fake_only "driver fault injection (FAKECUDA_FAIL)"; then
# The driver checkpoint of the (only) process fails: it is unlocked again.
ENVS=(FAKECUDA_FAIL=cuCheckpointProcessCheckpoint:1:2)
rollback drvfail "checkpoint phase.*cuCheckpointProcessCheckpoint of process [0-9]+" \
  --mib 4 --interval-ms 20

# Two processes; the lock of the second fails: the first is unlocked.
ENVS=(FAKECUDA_FAIL=cuCheckpointProcessLock:2:2)
CHILD=1 rollback lockfail "lock phase.*cuCheckpointProcessLock of process [0-9]+" \
  --mib 4 --children 1 --interval-ms 20

# Two processes; the checkpoint of the second fails: the first is restored.
ENVS=(FAKECUDA_FAIL=cuCheckpointProcessCheckpoint:2:2)
CHILD=1 rollback ckptfail2 "checkpoint phase.*of process [0-9]+" \
  --mib 4 --children 1 --interval-ms 20

fi

# CRIU dump fails after every process was checkpointed by the driver.
mkdir -p "$T/badcriu"
cat >"$T/badcriu/criu" <<SH
#!/bin/sh
if [ "\$1" = dump ]; then echo "Error (fake): dump refused for the test" >&2; exit 1; fi
exec "$REAL_CRIU" "\$@"
SH
chmod +x "$T/badcriu/criu"
ENVS=(CUSNAP_CRIU="$T/badcriu/criu")
CHILD=1 rollback dumpfail "CRIU dump phase|criu dump failed" --mib 4 --children 1 --interval-ms 20
echo "PASS"
