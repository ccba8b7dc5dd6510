#!/usr/bin/env bash
# The free-memory check before the driver's restore (src/coord/gpu_memory.h):
# a restore that finds the GPU's memory taken loses the process for good
# (docs/design.md section 1), so cusnap compares each GPU's free memory
# (NVML) with what the job's processes used there before their suspend, plus
# CUSNAP_RESTORE_MEMORY_MARGIN, and does not try when it falls short. On the
# simulated driver every device has FAKECUDA_TOTAL_MEM (128 MiB here), NVML
# counts the memory of every process on the machine, and a "hog"
# (fakecuda_holder, 2 x 56 MiB) takes it.
#   resume      with the hog: refused (exit 3) naming the GPU, its free
#               memory and the need; the job stays suspended and counts on
#               once the hog is gone and it is resumed
#   restore     a checkpoint on disk, with the hog: refused (exit 3) before
#               CRIU restores anything, the checkpoint unchanged; with
#               --device-map 0=1,1=0 onto the other GPU, where the memory is
#               free, it restores (the job's processes have both GPUs open,
#               so the map swaps them: sending two onto one is refused)
#   roll back   a checkpoint whose dump fails while the hog takes the memory
#               the driver checkpoint freed: the roll back does not try the
#               restore, the job is left suspended (exit 6); a resume with
#               the hog still there is refused (exit 3, the job as it was),
#               and brings it back once the hog is gone
#   guardian    the supervisor killed during the dump of a checkpoint,
#               the hog holding the memory: the guardian's recovery checks
#               with the margin the checkpoint's client set (the supervisor
#               has the check off), does not try the restore, leaves the
#               job suspended; resumed once the hog is gone
#   control     CUSNAP_RESTORE_MEMORY_MARGIN=off: the resume asks the driver,
#               which fails CUDA_ERROR_OUT_OF_MEMORY, and the job is lost
#               (exit 6, suspended!); a later resume fails as before (exit 1)
#   the setting a bad value is refused before it is sent (exit 2 from
#               checkpoint and suspend, as from launch)
#   hostpids    NVML listing the processes under other pids (a container):
#               the rise of the free memory at the driver checkpoint stands
#               for the job's use, and the resume is refused all the same
#   tight       a job that ran with less free memory than the margin: the
#               margin is capped at that, and it resumes and restores
# On a GPU (scripts/gpu-test.sh restore-memory-check): a 4 GiB job, and a
# PyTorch hog that leaves 1 GiB free; the device-map case needs two GPUs.
source "$(dirname "$0")/lib_checkpoint.sh"
export CUSNAP_RESTORE_MEMORY_MARGIN=8M
if [ "$REAL_DRIVER" = 1 ]; then
  JOB_MIB=4096
  FREE_RE="[0-9]*"
  cat >"$T/hog.py" <<'PY'
import os, sys, time
import torch
free, total = torch.cuda.mem_get_info()
leave = int(os.environ.get("HOG_LEAVE_MIB", "1024")) << 20
x = torch.empty(max(0, free - leave), dtype=torch.uint8, device="cuda")
print(f"ready {os.getpid()} holds {x.numel() >> 20} MiB of {free >> 20} free", flush=True)
time.sleep(3600)
PY
  hog_cmd() { echo "env CUDA_VISIBLE_DEVICES=$1 python3 $T/hog.py"; }
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
else
  [ -e "$CUSNAP_FAKECUDA_DIR/libnvidia-ml.so.1" ] || fail "the simulated NVML is not built"
  # A seed of its own: another machine, whose devices' memory the tests
  # running beside this one do not take.
  export FAKECUDA_TOTAL_MEM=$((128 << 20)) FAKECUDA_DEVICES=2 FAKECUDA_UUID_SEED=$((70000 + $$))
  JOB_MIB=24
  FREE_RE=16
  hog_cmd() { echo "$CUSNAP_FAKECUDA_DIR/fakecuda_holder 56 0 $1"; }
  GPUS=2
fi

start() {  # start NAME [SUPERVISOR-ENV...]: a pattern job; sets SUP, PID, OUT
  local name=$1
  shift
  OUT=$T/$name.out
  env "$@" "$CUSNAP" launch --name "$name" -- "$PATTERN_JOB" --mib "$JOB_MIB" --interval-ms 20 \
    >"$OUT" 2>&1 &
  SUPERVISORS+=($!)
  SUP=$!
  wait_count "$OUT" 3 "" 120
  PID=$(wait_job "$name")
}
hog_start() {  # hog_start [DEVICE]: the hog on DEVICE (0), until it holds the memory; sets HOG
  # Emptied here, not by the redirection of the background command, which
  # may come after the wait below has read the last hog's "ready".
  : >"$T/hog.out"
  $(hog_cmd "${1:-0}") >>"$T/hog.out" 2>&1 &
  HOG=$!
  echo "$HOG" >>"$T/job-pids"  # killed by the cleanup should the test fail
  for _ in $(seq 1 1200); do grep -q "^ready" "$T/hog.out" && return 0; sleep 0.05; done
  fail "the hog did not start: $(cat "$T/hog.out")"
}
hog_end() { kill -9 "$HOG" 2>/dev/null || true; wait "$HOG" 2>/dev/null || true; wait_gone "$HOG" 30; }
held() { expect_held "$1" "$OUT"; }
SHORT="not enough free device memory for the driver's restore: GPU 0 (GPU-[0-9a-f-]*) has $FREE_RE MiB free, the job needs [0-9]* MiB there and a margin of 8 MiB"

# ---- resume
start resume
op suspend resume
[ "$RC" = 0 ] || fail "suspend exited $RC"
hog_start
op resume resume
[ "$RC" = 3 ] || fail "resume with the hog exited $RC, expected 3"
said "$SHORT" resume
said "so it was not tried" resume
said "the job stays suspended; run cusnap resume resume again once the memory is free" resume
held resume
hog_end
op resume resume
[ "$RC" = 0 ] || fail "resume after the hog exited $RC"
expect_running resume "$PID" "$OUT"
pass "resume: refused while the memory is taken, the job kept; resumed once it is free"
term_job

# ---- NVML cannot see the job's pids (a container): the rise of the free
# memory at the driver checkpoint stands for the job's use
if [ "$REAL_DRIVER" != 1 ]; then
  start hostpids FAKECUDA_NVML=hostpids
  op suspend hostpids
  [ "$RC" = 0 ] || fail "suspend exited $RC"
  hog_start
  op resume hostpids
  [ "$RC" = 3 ] || fail "resume with the hog, NVML not seeing the pids, exited $RC, expected 3"
  said "GPU 0 (GPU-[0-9a-f-]*) has 16 MiB free, the job needs 24 MiB there" resume
  held hostpids
  hog_end
  op resume hostpids
  [ "$RC" = 0 ] || fail "resume after the hog exited $RC"
  expect_running hostpids "$PID" "$OUT"
  term_job
  pass "NVML not seeing the job's pids: the need taken from the free memory's rise; refused, then resumed"
fi

# ---- a job that ran with less than the margin free: the margin is capped
# at what was free before the suspend, so that it comes back into the memory
# it freed (a filler started after the job leaves 4 MiB free here, 16 MiB on
# a GPU)
start tight
if [ "$REAL_DRIVER" = 1 ]; then
  HOG_LEAVE_MIB=16 python3 "$T/hog.py" >"$T/filler.out" 2>&1 &
else
  "$CUSNAP_FAKECUDA_DIR/fakecuda_holder" 50 0 0 >"$T/filler.out" 2>&1 &
fi
FILLER=$!
echo "$FILLER" >>"$T/job-pids"
for _ in $(seq 1 1200); do grep -q "^ready" "$T/filler.out" && break; sleep 0.05; done
grep -q "^ready" "$T/filler.out" || fail "the filler did not start: $(cat "$T/filler.out")"
op suspend tight
[ "$RC" = 0 ] || fail "suspend exited $RC"
op resume tight
[ "$RC" = 0 ] || fail "resume of a job that ran with less free memory than the margin exited $RC"
expect_running tight "$PID" "$OUT"
op checkpoint tight -o "$T/tight.ckpt"
[ "$RC" = 0 ] || fail "checkpoint exited $RC"
wait_exit "$SUP"; wait_gone "$PID" 20
grep -q '"gpu_free"' "$T/tight.ckpt/manifest.json" || fail "the manifest has no gpu_free"
OUT=$T/tight-restored.out
restore_bg "$T/tight.ckpt" "$OUT" --name tight
SUP=$LAST_SUPERVISOR
wait_count "$OUT" 5 "" 120
expect_running tight "$PID" "$OUT"
term_job
kill -9 "$FILLER" 2>/dev/null; wait "$FILLER" 2>/dev/null || true; wait_gone "$FILLER" 30
pass "a job that ran with less free than the margin resumes and restores beside the filler (the margin capped)"

# ---- the setting
start resume
CUSNAP_RESTORE_MEMORY_MARGIN=lots op checkpoint resume -o "$T/bad.ckpt"
[ "$RC" = 2 ] || fail "checkpoint with a bad margin exited $RC, expected 2"
said 'CUSNAP_RESTORE_MEMORY_MARGIN="lots" is not a size' checkpoint
CUSNAP_RESTORE_MEMORY_MARGIN=-1 op suspend resume
[ "$RC" = 2 ] || fail "suspend with a bad margin exited $RC, expected 2"
expect_running resume "$PID" "$OUT"
term_job
pass "a bad CUSNAP_RESTORE_MEMORY_MARGIN is refused, the job runs on"

# ---- restore from disk
start disk
op checkpoint disk -o "$T/disk.ckpt"
[ "$RC" = 0 ] || fail "checkpoint exited $RC"
grep -q '"gpu_memory"' "$T/disk.ckpt/manifest.json" || fail "the manifest has no gpu_memory"
"$CUSNAP" inspect "$T/disk.ckpt" >"$T/inspect.txt" || true
grep -q "needs: .* of device memory on gpu 0" "$T/inspect.txt" ||
  fail "inspect does not say what the restore needs: $(cat "$T/inspect.txt")"
AT=$(last_count "$OUT")
wait_exit "$SUP"; wait_gone "$PID" 20  # the checkpoint stopped the job
SUM=$(cd "$T/disk.ckpt" && find . -type f -exec sha256sum {} + | sort)
hog_start
op restore "$T/disk.ckpt" --detach --name disk
[ "$RC" = 3 ] || fail "restore with the hog exited $RC, expected 3"
said "$SHORT" restore
said "Or restore onto another GPU of the same model with room: --device-map OLD=NEW" restore
said "nothing was restored; the checkpoint is unchanged" restore
kill -0 "$PID" 2>/dev/null && fail "the job's process runs after a refused restore"
[ "$SUM" = "$(cd "$T/disk.ckpt" && find . -type f -exec sha256sum {} + | sort)" ] ||
  fail "the refused restore changed the checkpoint"
if [ "$GPUS" -ge 2 ]; then
# The other GPU is free: restored there, it fits.
OUT=$T/disk-moved.out
restore_bg "$T/disk.ckpt" "$OUT" --device-map 0=1,1=0 --name disk
SUP=$LAST_SUPERVISOR
wait_count "$OUT" $((AT + 2)) "" 120
expect_running disk "$PID" "$OUT"
term_job
hog_end
# The hog on GPU 1: a restore mapped there is refused, naming GPU 1.
hog_start 1
op restore "$T/disk.ckpt" --detach --name disk --device-map 0=1,1=0
[ "$RC" = 3 ] || fail "restore onto GPU 1 with the hog there exited $RC, expected 3"
said "GPU 1 (GPU-[0-9a-f-]*) has $FREE_RE MiB free" restore
hog_end
pass "restore: refused before CRIU while GPU 0 is full; restored onto GPU 1; refused onto a full GPU 1"
else
hog_end
OUT=$T/disk-again.out
restore_bg "$T/disk.ckpt" "$OUT" --name disk
SUP=$LAST_SUPERVISOR
wait_count "$OUT" $((AT + 2)) "" 120
expect_running disk "$PID" "$OUT"
term_job
pass "restore: refused before CRIU while the GPU is full; restored once it is free (one GPU: no device map)"
fi

# ---- roll back: the dump fails once the hog took the freed memory
REAL_CRIU=$(PATH=$PATH:/usr/local/sbin:/usr/sbin command -v criu)
cat >"$T/criu-hog" <<SH
#!/bin/sh
if [ "\$1" = dump ]; then
  setsid $(hog_cmd 0) >"$T/hog-rb.out" 2>&1 </dev/null &
  for i in \$(seq 1 1200); do grep -q "^ready" "$T/hog-rb.out" && break; sleep 0.05; done
  echo "injected dump failure (the hog holds the GPU's memory)" >&2
  exit 1
fi
exec "$REAL_CRIU" "\$@"
SH
chmod 755 "$T/criu-hog"
start rollback CUSNAP_CRIU="$T/criu-hog"
op checkpoint rollback -o "$T/rollback.ckpt"
HOG=$(sed -n 's/^ready \([0-9]*\).*/\1/p' "$T/hog-rb.out")
[ -n "$HOG" ] || fail "the dump did not start the hog"
echo "$HOG" >>"$T/job-pids"
[ "$RC" = 6 ] || fail "checkpoint exited $RC, expected 6"
said "CRIU dump phase" checkpoint
said "$SHORT" checkpoint
said "the job is left suspended" checkpoint
said "run cusnap resume rollback to bring it back" checkpoint
held rollback
op inspect rollback
said "left suspended by a failed checkpoint at 20[0-9-]*T[0-9:]*Z" inspect
said "because:   .*CRIU dump phase" inspect
said "next:      cusnap resume rollback brings it back" inspect
op ps
said "^rollback .* suspended\* " ps
said "^\* left suspended by a failed roll back (rollback): cusnap inspect JOB says why" ps
[ "$(job_field rollback left_suspended)" = True ] || fail "ps --json: rollback not left_suspended"
[ "$(job_field rollback restore_refused)" = False ] || fail "ps --json: rollback's restore said refused"
op resume rollback
[ "$RC" = 3 ] || fail "resume with the hog still there exited $RC, expected 3 (refused)"
said "$SHORT" resume
said "the job stays suspended: run cusnap resume rollback again" resume
held rollback
kill -9 "$HOG"; wait_gone "$HOG" 20
op resume rollback
[ "$RC" = 0 ] || fail "resume after the hog exited $RC"
expect_running rollback "$PID" "$OUT"
op inspect rollback --json
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit("left_suspended" in d)' "$T/op.out" ||
  fail "inspect still shows the resumed job left suspended: $(cat "$T/op.out")"
[ "$(job_field rollback left_suspended)" = False ] || fail "ps --json: the resumed job still left_suspended"
term_job
pass "roll back: the restore not tried while the memory is taken; left suspended; resumed once free"

# ---- guardian: the supervisor killed (SIGKILL) during the dump of a
# checkpoint, once the hog took the memory the driver checkpoint freed. The
# supervisor runs with the check off, the client with a margin of 8 MiB: the
# guardian's recovery checks as the operation's client asked, does not try
# the restore, and leaves the job suspended; resumed once the memory is free.
cat >"$T/criu-hog-wait" <<SH
#!/bin/sh
if [ "\$1" = dump ]; then
  setsid $(hog_cmd 0) >"$T/hog-g.out" 2>&1 </dev/null &
  for i in \$(seq 1 1200); do grep -q "^ready" "$T/hog-g.out" && break; sleep 0.05; done
  echo \$\$ >"$T/dump.pid"
  exec sleep 120
fi
exec "$REAL_CRIU" "\$@"
SH
chmod 755 "$T/criu-hog-wait"
start guardian CUSNAP_CRIU="$T/criu-hog-wait" CUSNAP_RESTORE_MEMORY_MARGIN=off
"$CUSNAP" checkpoint guardian -o "$T/guardian.ckpt" >"$T/guardian-ck.out" 2>&1 &
CK=$!
for _ in $(seq 1 1800); do [ -s "$T/dump.pid" ] && break; sleep 0.05; done
[ -s "$T/dump.pid" ] || fail "the checkpoint never reached its dump: $(cat "$T/guardian-ck.out")"
cat "$T/dump.pid" >>"$T/job-pids"
HOG=$(sed -n 's/^ready \([0-9]*\).*/\1/p' "$T/hog-g.out")
[ -n "$HOG" ] || fail "the dump did not start the hog: $(cat "$T/hog-g.out")"
echo "$HOG" >>"$T/job-pids"
kill -KILL "$SUP"
wait_exit "$SUP" 2>/dev/null
kill -KILL "$(cat "$T/dump.pid")" 2>/dev/null
wait "$CK" && fail "the checkpoint succeeded though its supervisor was killed"
wait_guardian guardian "$SUP" suspended
SUP=$GUARD
LOG=$CUSNAP_RUNTIME_BASE/guardian/output.log
grep -q "$SHORT" "$LOG" || fail "the guardian did not check the free memory: $(grep cusnap: "$LOG")"
grep -q "run cusnap resume guardian to try again" "$LOG" ||
  fail "the guardian did not say to resume the job: $(grep cusnap: "$LOG")"
expect_held guardian "$LOG"
op inspect guardian
said "left suspended by a failed recovery at " inspect
said "next:      cusnap resume guardian brings it back" inspect
kill -9 "$HOG"; wait_gone "$HOG" 20
op resume guardian
[ "$RC" = 0 ] || fail "resume after the hog exited $RC"
expect_running guardian "$PID" "$LOG"  # the job's output goes to its log now
term_job
pass "guardian: its recovery checked the memory as the client asked (not the supervisor's setting), did not try; resumed once free"

# ---- control: the check off, the driver asked
start control
op suspend control
[ "$RC" = 0 ] || fail "suspend exited $RC"
hog_start
CUSNAP_RESTORE_MEMORY_MARGIN=off op resume control
[ "$RC" = 6 ] || fail "resume with the check off exited $RC, expected 6 (the job cannot come back)"
said "CUDA_ERROR_OUT_OF_MEMORY (2)" resume
said "the driver will not restore its GPU state" resume
op ps
said "^control .* suspended! " ps
hog_end
op resume control
[ "$RC" = 1 ] || fail "the resume after the refused restore exited $RC, expected 1"
said "CUDA_ERROR_OPERATING_SYSTEM (304)" resume
kill -TERM "$SUP"; wait_exit "$SUP"; kill -9 "$PID" 2>/dev/null || true; wait_gone "$PID" 20
pass "control: without the check the driver's restore fails for memory and the job is lost"
echo PASS
