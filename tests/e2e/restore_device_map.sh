#!/usr/bin/env bash
# What `cusnap restore --device-map` tells a user whose map or machine does
# not fit the checkpoint, before anything runs (exit 3), on the simulated
# driver with two devices ("another machine": FAKECUDA_UUID_SEED=5):
#   - a NEW that is not a GPU here: the message lists this machine's GPUs
#     (index, UUID, model), which NEW names, not the checkpoint's;
#   - a wrong map is refused before the checkpoint's files are hashed: a
#     damaged copy with that map says what is wrong with the map (a valid
#     map on the damaged copy is still refused as damaged, exit 5);
#   - a machine with fewer GPUs of the model than the job used: the message
#     says so with the counts, and does not send the user to --device-map,
#     which cannot put two GPUs onto one (restore and inspect);
#   - a partial map on another machine (0=1 only): GPU 0 goes where the map
#     says, GPU 1 onto the GPU left; the job continues with its memory on
#     device 1;
#   - processes that each see one GPU (CUDA_VISIBLE_DEVICES, as a launcher
#     gives each rank its own): each is given the pairs of its own GPU, as
#     the driver refuses a pair of a GPU the process does not have; the two
#     swap GPUs and count on.
source "$(dirname "$0")/lib_checkpoint.sh"
fake_only "other GPUs are simulated through the simulated driver" || exit 77
export FAKECUDA_DEVICES=2

checkpointed_job map "$T/launch.out" "$T/ckpt"

# A NEW that is not here: this machine's GPUs are listed.
FAKECUDA_UUID_SEED=5 expect_refused 3 \
  "'1=7'\\), which is not a GPU here: this machine has GPU 0 \\(GPU-[0-9a-f-]+, NVIDIA H200 \\(simulated\\)\\), 1 \\(GPU-" \
  "$CUSNAP" restore "$T/ckpt" --device-map 0=1,1=7
for u in $(python3 -c 'import json,sys; print(" ".join(g["uuid"] for g in json.load(open(sys.argv[1]))["gpus"]))' "$T/ckpt/manifest.json"); do
  grep -q "$u" <<<"$(sed -n 's/.*this machine has //p' "$T/cmd.out")" && fail "the refusal lists the checkpoint's GPU $u as one here: $(cat "$T/cmd.out")"
done
# The other machine's GPUs, 0 and 1, as the refusal listed them.
NEW0=$(sed -n 's/.*this machine has GPU 0 (\(GPU-[0-9a-f-]*\),.*/\1/p' "$T/cmd.out")
NEW1=$(sed -n 's/.*this machine has GPU 0 .*), 1 (\(GPU-[0-9a-f-]*\),.*/\1/p' "$T/cmd.out")
[ -n "$NEW0" ] && [ -n "$NEW1" ] || fail "the refusal does not list GPUs 0 and 1: $(cat "$T/cmd.out")"
pass "a NEW that is not a GPU here: refused, listing this machine's GPUs"

# A wrong map is refused before the files are hashed.
cp -a "$T/ckpt" "$T/damaged"
PAGES=$(cd "$T/damaged" && ls criu/pages-*.img | head -1)
printf '\x5a' | dd of="$T/damaged/$PAGES" bs=1 seek=4096 conv=notrunc status=none
expect_refused 3 "not a GPU here" "$CUSNAP" restore "$T/damaged" --device-map 0=1,1=9
expect_refused 3 "which the checkpoint does not name" "$CUSNAP" restore "$T/damaged" --device-map 0=1,1=0,4=4
expect_refused 5 "SHA-256" "$CUSNAP" restore "$T/damaged" --device-map 0=1,1=0
pass "a wrong map is refused before the checkpoint's files are hashed; a valid one still finds the damage"

# Fewer GPUs of the model here than the job used: no map can help.
for map in "" "--device-map 0=0"; do
  # shellcheck disable=SC2086 # the map is one option and its value, or nothing
  FAKECUDA_DEVICES=1 FAKECUDA_UUID_SEED=5 expect_refused 3 \
    "used 2 NVIDIA H200 \\(simulated\\) GPUs, this machine has 1.*at least 2" \
    "$CUSNAP" restore "$T/ckpt" $map
  grep -q -- "--device-map OLD=NEW\|map it with" "$T/cmd.out" &&
    fail "the refusal sends the user to a device map, which cannot help: $(cat "$T/cmd.out")"
done
rc=0
FAKECUDA_DEVICES=1 FAKECUDA_UUID_SEED=5 "$CUSNAP" inspect "$T/ckpt" >"$T/inspect.out" 2>&1 || rc=$?
[ "$rc" = 3 ] || fail "inspect on a machine with one GPU exited $rc, expected 3: $(cat "$T/inspect.out")"
grep -q "files intact (every file's size and SHA-256 checked), NOT restorable here: .*at least 2" \
  "$T/inspect.out" || fail "inspect: $(cat "$T/inspect.out")"
grep -q -- "--device-map OLD=NEW" "$T/inspect.out" && fail "inspect suggests a device map: $(cat "$T/inspect.out")"
[ -z "$(job_pids_all)" ] || fail "a job was started by a refused restore"
pass "fewer GPUs here than the job used: refused with the counts, no device map suggested"

# A partial map on another machine: 0 -> 1 as asked, 1 -> the GPU left (0).
FAKECUDA_UUID_SEED=5 "$CUSNAP" restore "$T/ckpt" --device-map 0=1 >"$T/restore.out" 2>&1 &
SUPERVISORS+=($!)
wait_count "$T/restore.out" $((LAST + 3))
[ "$(first_count "$T/restore.out")" = $((LAST + 1)) ] || fail "the restore did not continue at $((LAST + 1))"
on=$(memory_devices "$PID")
[ "$on" = "dev1 " ] || fail "the job's device memory is on '$on', expected dev1 (GPU 0 mapped onto 1)"
# Another machine: every GPU is another, and the restore says where each
# went: GPU 0 onto 1 as asked, GPU 1 onto the one left, 0.
read -r OLD0 OLD1 < <(python3 -c 'import json,sys; print(" ".join(g["uuid"] for g in json.load(open(sys.argv[1]))["gpus"]))' "$T/ckpt/manifest.json")
grep -qx "cusnap: the job's GPU $OLD0 is now GPU $NEW1" "$T/restore.out" &&
  grep -qx "cusnap: the job's GPU $OLD1 is now GPU $NEW0" "$T/restore.out" ||
  fail "the restore did not say GPU 0 ($OLD0) went to 1 ($NEW1) and GPU 1 ($OLD1) to 0 ($NEW0): $(grep cusnap: "$T/restore.out")"
pass "a partial map on another machine: GPU 0 onto 1 as asked, 1 onto 0, the job continues with its memory on 1"
kill -TERM "${SUPERVISORS[-1]}"
wait_exit "${SUPERVISORS[-1]}"
wait_gone "$PID"

# The restoring command sees this machine's GPUs in another order
# (CUDA_VISIBLE_DEVICES=1,0): a GPU is the one its UUID names, whatever its
# place in that list; the job's memory is back on GPU 0 (the simulated
# driver took the place for the machine's index).
CUDA_VISIBLE_DEVICES=1,0 restore_bg "$T/ckpt" "$T/order.out"
wait_count "$T/order.out" $((LAST + 3))
[ "$(memory_devices "$PID")" = "dev0 " ] ||
  fail "restored by a command that sees the GPUs as 1,0, the job's memory is on '$(memory_devices "$PID")', expected dev0"
grep -q "is now GPU" "$T/order.out" && fail "a restore onto the same GPUs said one moved: $(grep cusnap: "$T/order.out")"
kill -TERM "$LAST_SUPERVISOR"
wait_exit "$LAST_SUPERVISOR"
wait_gone "$PID"
pass "a restore by a command that sees the GPUs in another order: the job's memory on its own GPU"

# In that order, '0=0' sends GPU 0 onto the machine's GPU 1, which the job
# also used: refused, saying how this command numbers the GPUs.
CUDA_VISIBLE_DEVICES=1,0 expect_refused 3 \
  "which the checkpoint also used and the map does not move.*a NEW index counts the GPUs this command's CUDA_VISIBLE_DEVICES='1,0' names, in its order" \
  "$CUSNAP" restore "$T/ckpt" --device-map 0=0
pass "a map refused under CUDA_VISIBLE_DEVICES says how NEW indexes are counted"

# Processes that each see one GPU: the parent GPU 0, its child GPU 1.
launch vis "$T/vis.out" "$PATTERN_JOB" --mib 4 --children 1 --interval-ms 20 --visible 0/1
wait_count "$T/vis.out" 3
wait_count "$T/vis.out" 3 "child 1 "
VPID=$(wait_job vis)
CPID=$(sed -n 's/^child 1 ready pid \([0-9]*\).*/\1/p' "$T/vis.out")
[ "$(memory_devices "$VPID")" = "dev0 " ] && [ "$(memory_devices "$CPID")" = "dev1 " ] ||
  fail "the job does not run on one GPU per process: parent on '$(memory_devices "$VPID")', child on '$(memory_devices "$CPID")'"
"$CUSNAP" checkpoint vis -o "$T/vis-ckpt" >"$T/vis.ckpt.out" 2>&1 || fail "checkpoint of vis failed: $(cat "$T/vis.ckpt.out")"
wait_exit "$LAST_SUPERVISOR"
wait_gone "$VPID"
P_LAST=$(last_count "$T/vis.out")
C_LAST=$(last_count "$T/vis.out" "child 1 ")
restore_bg "$T/vis-ckpt" "$T/vis.restore.out" --device-map 0=1,1=0
for _ in $(seq 600); do
  [ "$(last_count "$T/vis.restore.out")" -ge $((P_LAST + 3)) ] && break
  kill -0 "$LAST_SUPERVISOR" 2>/dev/null || fail "the restore onto swapped GPUs ended: $(cat "$T/vis.restore.out")"
  sleep 0.05
done
wait_count "$T/vis.restore.out" $((P_LAST + 3))
wait_count "$T/vis.restore.out" $((C_LAST + 3)) "child 1 "
[ "$(first_count "$T/vis.restore.out")" = $((P_LAST + 1)) ] || fail "the parent did not continue at $((P_LAST + 1))"
[ "$(first_count "$T/vis.restore.out" "child 1 ")" = $((C_LAST + 1)) ] ||
  fail "the child did not continue at $((C_LAST + 1))"
[ "$(memory_devices "$VPID")" = "dev1 " ] && [ "$(memory_devices "$CPID")" = "dev0 " ] ||
  fail "the GPUs were not swapped: parent on '$(memory_devices "$VPID")', child on '$(memory_devices "$CPID")'"
grep -q "pattern mismatch\|ended" "$T/vis.restore.out" && fail "a process of the restored job failed: $(cat "$T/vis.restore.out")"
pass "processes that each see one GPU: each given its own GPU's pair, the two swapped and counting on"
echo "PASS"
