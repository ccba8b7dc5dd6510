#!/usr/bin/env bash
# The cut across collective ranks with a rank that has launched no collective
# yet (docs/design.md "Cut across collective ranks": a process at count 0
# that holds at its first collective launch during the cut takes part with
# the target), on the simulated driver with two devices.
#
# cusnap-collective-pair --late-ms: rank 1 sleeps before its first step, so
# a checkpoint started as soon as both ranks are ready finds rank 0 in its
# first collective launch and rank 1 with none. Every cuLaunchKernel takes
# DELAY_MS in the simulated driver (FAKECUDA_DELAY), so the arm finds rank 0
# inside its launch (count 1 reserved, none returned yet): the cut, target 1,
# waits for it, and meanwhile rank 1 wakes (LATE_MS) and holds at its first
# collective launch. It must be given the target and launch: both ranks'
# first collectives are then issued and the drain finishes. Left out (at
# count 0), rank 1 would stay held, rank 0's collective could not complete
# and the drain would time out: the checkpoint would roll back.
#  - The checkpoint succeeds with both ranks at count 1 (collective_cut).
#  - The cut waited for rank 1's whole first launch: the shared-save phase
#    (the cut, the quiesce and the save) lasted more than DELAY_MS. A
#    shorter one means the arm came after rank 1 had begun its launch (a
#    loaded machine), a report without a cut that it came before rank 0's
#    first launch: the case was not made, and is tried again with a new job
#    (3 times in all).
#  - Restored, both ranks go on at exactly the next step and check their
#    peer's data for two more steps.
source "$(dirname "$0")/lib_shared.sh"
collective_pair_setup 2 || exit 77

DELAY_MS=4000 # every cuLaunchKernel of the job, in the simulated driver
LATE_MS=2000  # rank 1's sleep before its first step

# shared_save_ms JSON: how long a checkpoint's shared-save phase took, in ms.
shared_save_ms() {
  python3 - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(int(sum(p["seconds"] for p in d["phases"] if p["name"] == "shared-save") * 1000))
PY
}

# cut_at_one JSON: both ranks stand at count 1 in the report's collective_cut.
cut_at_one() {
  python3 - "$1" <<'PY'
import json, sys
cut = json.load(open(sys.argv[1])).get("collective_cut", {})
assert len(cut) == 2 and set(cut.values()) == {1}, cut
PY
}

made=0
for attempt in 1 2 3; do
  name=late$attempt
  LAUNCH_OUT=$T/$name.out
  FAKECUDA_DELAY=cuLaunchKernel:$DELAY_MS launch "$name" "$LAUNCH_OUT" "$PAIR" --print-every 1 --late-ms "$LATE_MS"
  SUP=$LAST_SUPERVISOR
  for _ in $(seq 1 600); do
    [ "$(ready_pids "$LAUNCH_OUT" | wc -l)" = 2 ] && break
    sleep 0.05
  done
  [ "$(ready_pids "$LAUNCH_OUT" | wc -l)" = 2 ] || fail "the ranks did not both get ready: $(cat "$LAUNCH_OUT")"
  ready_pids "$LAUNCH_OUT" >>"$T/job-pids"
  pids=$(ready_pids "$LAUNCH_OUT")
  rc=0
  "$CUSNAP" checkpoint "$name" -o "$T/ck-$name" --timeout 30 --json >"$T/$name.json" 2>"$T/$name.err" || rc=$?
  [ "$rc" = 0 ] || fail "the checkpoint of a job with a rank at its first collective failed (exit $rc): $(cat "$T/$name.err" "$T/$name.json")"
  [ -f "$T/ck-$name/manifest.json" ] || fail "no manifest in $T/ck-$name"
  wait_exit "$SUP"
  [ "$EXIT_RC" = 0 ] || fail "the supervisor of the checkpointed job exited $EXIT_RC, expected 0"
  for p in $pids; do wait_gone "$p" 20; done
  no_errors "$LAUNCH_OUT"
  if ! grep -q collective_cut "$T/$name.json"; then
    echo "   attempt $attempt: no collective cut: the arm came before rank 0's first launch; again"
    continue
  fi
  cut_at_one "$T/$name.json" || fail "the cut did not stand both ranks at count 1: $(cat "$T/$name.json")"
  took=$(shared_save_ms "$T/$name.json")
  if [ "$took" -gt "$DELAY_MS" ]; then
    made=1
    break
  fi
  echo "   attempt $attempt: the cut took $took ms, not more than $DELAY_MS: the arm came after rank 1 began its first launch; again"
done
[ "$made" = 1 ] || fail "three checkpoints armed the cut only after rank 1 began its first collective launch"
pass "a rank held at its first collective during the cut was included: checkpointed with both ranks at count 1 (the cut, quiesce and save took $took ms)"

# Restored, each rank goes on at exactly the step after its last one and
# checks two more (a wrong byte ends the workload: no_errors).
note_last "$LAUNCH_OUT"
restore_bg "$T/ck-$name" "$T/restore.out"
SUP=$LAST_SUPERVISOR
for k in "${!PREFIXES[@]}"; do
  p=${PREFIXES[k]}
  wait_count "$T/restore.out" $((LAST[k] + 2)) "$p" 60
  first=$(first_count "$T/restore.out" "$p")
  [ "$first" = $((LAST[k] + 1)) ] || fail "'$p' continued at $first, expected $((LAST[k] + 1))"
  echo "   '$p': count ${LAST[k]} before, $first after, now $(last_count "$T/restore.out" "$p")"
done
no_errors "$T/restore.out"
for p in $pids; do kill -0 "$p" 2>/dev/null || fail "process $p of the job was not restored or died"; done
pass "restored: both ranks go on from the cut, their peer's data correct"
stop_job "$T/restore.out"
echo "PASS"
