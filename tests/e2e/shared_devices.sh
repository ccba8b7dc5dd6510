#!/usr/bin/env bash
# A job sharing device memory restored onto other GPUs: two processes on a
# machine with two devices share an allocation (cusnap-share-job); the
# checkpoint is restored on "another machine" (other UUIDs, through the
# simulated driver's FAKECUDA_UUID_SEED) with --device-map 0=1,1=0. The
# driver's restore remaps each process's devices; the shims then create the
# shared allocation again on the device the process now has, import and map
# it: both processes continue, see each other's writes, bytes intact. Then
# the restored job is checkpointed and restored back without a map.
source "$(dirname "$0")/lib_shared.sh"
fake_only "other GPUs are simulated through the simulated driver" || exit 77
export FAKECUDA_DEVICES=2

PREFIXES=("" "importer ")
LAUNCH_OUT=$T/launch.out
start_job moved "$LAUNCH_OUT" "$SHARE_JOB" --mib 4 --interval-ms 20
# The device memory each process created (the importer's import is its
# creator's), on device 0; after the restore with 0=1,1=0, on device 1.
for p in $(ready_pids "$LAUNCH_OUT"); do MEMORY_DEV[$p]=$(memory_devices "$p"); done
[ "$(printf '%s' "${MEMORY_DEV[@]}" | tr ' ' '\n' | sort -u | tr '\n' ' ' | sed 's/^ //')" = "dev0 " ] ||
  fail "before the checkpoint, the job's device memory is on '${MEMORY_DEV[*]}', expected dev0 alone"
checkpoint_stop moved "$T/ck" "$LAUNCH_OUT"
python3 - "$T/ck/manifest.json" <<'PY' || fail "the manifest does not list two GPUs and two shim processes"
import json, sys
m = json.load(open(sys.argv[1]))
assert len(m["gpus"]) == 2, m["gpus"]
assert len(m["shim_processes"]) == 2, m["shim_processes"]
PY
FAKECUDA_UUID_SEED=5 "$CUSNAP" restore "$T/ck" --device-map 0=1,1=0 >"$T/restore.out" 2>&1 &
SUPERVISORS+=($!)
SUP=$!
expect_continued "$T/restore.out" 1
for p in $(ready_pids "$LAUNCH_OUT"); do
  [ -z "${MEMORY_DEV[$p]}" ] && continue
  [ "$(memory_devices "$p")" = "dev1 " ] ||
    fail "process $p holds its device memory on '$(memory_devices "$p")' after --device-map 0=1,1=0, expected dev1"
done
pass "restored onto the other machine's GPUs with --device-map 0=1,1=0; sharing rebuilt on device 1"

# And back: the restored job (on the other machine's GPUs) is checkpointed
# and restored here, onto GPUs of the same model (chosen by model, no map).
checkpoint_stop moved "$T/ck2" "$T/restore.out"
restore_bg "$T/ck2" "$T/restore2.out"
SUP=$LAST_SUPERVISOR
expect_continued "$T/restore2.out" 1
pass "checkpointed there and restored back here"
stop_job "$T/restore2.out"
echo "PASS"
