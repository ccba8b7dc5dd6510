#!/usr/bin/env bash
# A process that begins to use the GPU while a checkpoint or suspend is under
# way (after the job's processes were listed) would keep GPU state that the
# driver phase never saved: the operation rolls back and the whole job runs
# on. The job starts a CUDA worker inside the driver phase, which is made to
# last seconds: on the simulated driver its lock is slowed (FAKECUDA_DELAY,
# in the supervisor, which calls it); on the real one the first worker holds
# 4 GiB of device memory, which its checkpoint copies to host memory.
source "$(dirname "$0")/lib_checkpoint.sh"

FIRST_MIB=1
if fake_only "the slowed driver lock (FAKECUDA_DELAY); a first worker of 4 GiB makes the driver phase last instead"; then
  export FAKECUDA_DELAY=cuCheckpointProcessLock:3000
else
  FIRST_MIB=4096
fi
# The root (no CUDA) starts one worker now and one more at each trigger file.
cat >"$T/job.sh" <<EOF
#!/bin/bash
"$PATTERN_JOB" --mib $FIRST_MIB --interval-ms 20 &
for i in 1 2; do
  while [ ! -e "$T/go\$i" ]; do sleep 0.05; done
  "$PATTERN_JOB" --mib 1 --interval-ms 20 >"$T/late\$i.out" 2>&1 &
done
wait
EOF
chmod +x "$T/job.sh"

# The supervisor alone traces its driver calls (FAKECUDA_LOG; the simulated
# driver's only), for rolls_back_when to start a worker during its lock.
SUP_OUT=$T/launch.out
FAKECUDA_LOG=1 launch newcuda "$SUP_OUT" env -u FAKECUDA_LOG "$T/job.sh"
SUP=$LAST_SUPERVISOR
wait_count "$T/launch.out" 5
PID=$(wait_job newcuda)

# OP TRIGGER: runs `cusnap OP newcuda` and starts a worker during its lock;
# the operation must roll back and name the new process.
refused_for_new_worker() {
  local op=$1 i=$2
  rolls_back_when newcuda "$op" "$T/go$i" "began to use the GPU during the $op" \
    wait_count "$T/late$i.out" 1 "" 10
  expect_running newcuda "$PID" "$T/launch.out"
  local n
  n=$(last_count "$T/late$i.out")
  wait_count "$T/late$i.out" $((n + 2))
  pass "$op rolled back for a worker started during it: $(grep -o 'process [0-9]* ([^)]*) began' "$T/$op.out")"
}
refused_for_new_worker checkpoint 1
refused_for_new_worker suspend 2

# With no newcomer the same job checkpoints (all three workers) and restores.
"$CUSNAP" checkpoint newcuda -o "$T/ckpt" >"$T/ckpt.out" 2>&1 || fail "checkpoint failed: $(cat "$T/ckpt.out")"
wait_exit "$SUP"
wait_gone "$PID"
python3 - "$T/ckpt/manifest.json" <<'PY' || fail "the manifest does not list three CUDA processes"
import json, sys
m = json.load(open(sys.argv[1]))
assert len([p for p in m["processes"] if p["uses_cuda"]]) == 3, m["processes"]
PY
L0=$(last_count "$T/launch.out")
L1=$(last_count "$T/late1.out")
L2=$(last_count "$T/late2.out")
restore_bg "$T/ckpt" "$T/restore.out"
wait_count "$T/restore.out" $((L0 + 3))
wait_count "$T/late1.out" $((L1 + 3))
wait_count "$T/late2.out" $((L2 + 3))
grep -q "pattern mismatch" "$T/restore.out" "$T/late1.out" "$T/late2.out" &&
  fail "a restored worker found a wrong byte"
pass "the job with its two late workers was checkpointed and restored; all three count on"
echo "PASS"
