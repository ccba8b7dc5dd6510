#!/usr/bin/env bash
# Restore checks the GPUs: a checkpoint restores onto another GPU of the same
# model (the driver gets the UUID pairs), through --device-map onto a chosen
# one, and is refused (exit 3, nothing started) where no GPU of its model is.
# The simulated driver's FAKECUDA_UUID_SEED, FAKECUDA_DEVICES and
# FAKECUDA_DEVICE_NAME, given to `cusnap restore`, stand for another machine.
source "$(dirname "$0")/lib_checkpoint.sh"
fake_only "other GPUs are simulated through the simulated driver" || exit 77

launch dev "$T/launch.out" "$PATTERN_JOB" --mib 4 --interval-ms 20
wait_count "$T/launch.out" 3
PID=$(wait_job dev)
[ "$(memory_devices "$PID")" = "dev0 " ] ||
  fail "the job holds its device memory on '$(memory_devices "$PID")', expected dev0"
"$CUSNAP" checkpoint dev -o "$T/ckpt" >"$T/dev.ckpt.out" 2>&1 || fail "checkpoint of dev failed: $(cat "$T/dev.ckpt.out")"
wait_exit "$LAST_SUPERVISOR"
wait_gone "$PID"
LAST=$(last_count "$T/launch.out")

# No GPU of the recorded model: refused before anything starts.
FAKECUDA_DEVICE_NAME="Some Other GPU" FAKECUDA_UUID_SEED=9 expect_refused 3 "no .* is available here" \
  "$CUSNAP" restore "$T/ckpt"
[ -z "$(job_pids_all)" ] || fail "a job was started without a matching GPU"
[ -e "/proc/$PID" ] && fail "process $PID exists after a refused restore"
pass "another GPU model: refused"

# A device map naming a GPU that is not there.
expect_refused 3 "not a GPU here" "$CUSNAP" restore "$T/ckpt" --device-map 0=5
# A device map moving a GPU the checkpoint does not have: refused, not ignored.
FAKECUDA_DEVICES=2 expect_refused 3 "GPU 1 \\('1=0'\\), which the checkpoint does not name: its processes used GPU 0 \\(" \
  "$CUSNAP" restore "$T/ckpt" --device-map 1=0
pass "a device map naming a GPU the checkpoint did not use: refused"

# Another GPU of the same model (another UUID): restored onto it.
FAKECUDA_UUID_SEED=7 "$CUSNAP" restore "$T/ckpt" >"$T/restore1.out" 2>&1 &
SUPERVISORS+=($!)
SUP=$!
wait_count "$T/restore1.out" $((LAST + 3))
[ "$(memory_devices "$PID")" = "dev0 " ] ||
  fail "restored onto the one GPU, the job holds its memory on '$(memory_devices "$PID")'"
pass "restored onto another GPU of the same model"
kill -TERM "$SUP"
wait_exit "$SUP"
wait_gone "$PID"

# Two GPUs, mapped onto the second explicitly.
FAKECUDA_DEVICES=2 FAKECUDA_UUID_SEED=3 "$CUSNAP" restore "$T/ckpt" --device-map 0=1 \
  >"$T/restore2.out" 2>&1 &
SUPERVISORS+=($!)
wait_count "$T/restore2.out" $((LAST + 3))
# On the GPU the map names, not the first of its model (device 0).
[ "$(memory_devices "$PID")" = "dev1 " ] ||
  fail "restored with --device-map 0=1, the job holds its memory on '$(memory_devices "$PID")', expected dev1"
pass "restored onto GPU 1 through --device-map"
echo "PASS"
