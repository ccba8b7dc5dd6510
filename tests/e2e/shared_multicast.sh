#!/usr/bin/env bash
# A multicast group of three members across two processes
# (cusnap-multicast-job, the simulated driver with three devices and
# multicast on): the member on device 2 is created by the child and imported
# by the parent, which creates the group, binds all three (13.0 and 13.1 bind
# ABIs) and maps it. The checkpoint tears the group down and releases the
# shared member; the restore rebuilds both, at the same addresses, under the
# handle the application holds: both processes continue where they stopped,
# every member's bytes intact, and writes through the multicast mapping work.
# --leave-running rebuilds it in place the same way.
source "$(dirname "$0")/lib_shared.sh"
fake_only "multicast (never on a real GPU)" || exit 77
export FAKECUDA_DEVICES=3 FAKECUDA_MULTICAST=1

PREFIXES=("group " "member ")
LAUNCH_OUT=$T/launch.out
start_job mc "$LAUNCH_OUT" "$BIN/cusnap-multicast-job" --interval-ms 20
"$CUSNAP" checkpoint mc -o "$T/ckpt-lr" --leave-running >"$T/lr.out" 2>&1 ||
  fail "checkpoint --leave-running failed: $(cat "$T/lr.out")"
for p in "${PREFIXES[@]}"; do
  n=$(last_count "$LAUNCH_OUT" "$p")
  wait_count "$LAUNCH_OUT" $((n + 3)) "$p" 30
done
no_errors "$LAUNCH_OUT"
pass "checkpoint --leave-running: the group was rebuilt in place and both processes count on"
checkpoint_restore_cycle mc
python3 - "$T/ckpt-mc" <<'PY' || fail "the checkpoint does not hold the group's records"
import glob, sys
recs = glob.glob(sys.argv[1] + "/shim/*.records")
assert len(recs) == 2, recs
assert glob.glob(sys.argv[1] + "/shared/*.bin"), "no saved member bytes"
PY
echo "PASS"
