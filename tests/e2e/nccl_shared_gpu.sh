#!/usr/bin/env bash
# Two collective ranks on one GPU (docs/design.md "Ranks that share a GPU"):
# after the driver's restore their contexts are not time-sliced while a
# collective waits, so the real driver's kernels fail (Xid 109). On the
# simulated driver with one device, cusnap-collective-pair puts both ranks on
# device 0: the checkpoint and the suspend are refused (exit 3, also as
# JSON) before anything changes, naming both processes and the GPU; the job
# counts on. An invalid CUSNAP_ALLOW_RANKS_SHARING_GPU is refused by launch
# (the supervisor would read it) and by checkpoint and suspend before they
# send it (exit 2 from each), whose own value counts before the supervisor's;
# with CUSNAP_ALLOW_RANKS_SHARING_GPU=1 in the environment of cusnap
# checkpoint (the job launched without it) the checkpoint goes ahead
# (--leave-running) and the ranks' next collective fails after the driver's
# restore in place, as the simulated driver mirrors the real one
# (tests/fakecuda/kernels.cpp).
source "$(dirname "$0")/lib_shared.sh"
collective_pair_setup 1 || exit 77

LAUNCH_OUT=$T/pair.out
start_job pair "$LAUNCH_OUT" "$PAIR" --print-every 1
R0=$(sed -n 's/^rank 0 ready pid \([0-9]*\) device 0$/\1/p' "$LAUNCH_OUT")
R1=$(sed -n 's/^rank 1 ready pid \([0-9]*\) device 0$/\1/p' "$LAUNCH_OUT")
[ -n "$R0" ] && [ -n "$R1" ] || fail "the ranks are not both on device 0: $(grep ready "$LAUNCH_OUT")"
GPU='GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}'
WHY="processes ($R0 and $R1|$R1 and $R0) both run collective kernels \(NCCL ranks\) on GPU $GPU; after the driver's restore"

expect_refused 3 "$WHY.*checkpoint is refused and the job runs on unchanged. Run one rank per GPU" \
  "$CUSNAP" checkpoint pair -o "$T/ck"
[ ! -e "$T/ck" ] || fail "the refused checkpoint left $T/ck"
rc=0
"$CUSNAP" checkpoint pair -o "$T/ck" --json >"$T/ck.json" 2>/dev/null || rc=$?
[ "$rc" = 3 ] || fail "checkpoint --json exited $rc, expected 3"
python3 - "$T/ck.json" <<'PY' || fail "checkpoint --json: $(cat "$T/ck.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["ok"] is False and r["exit_code"] == 3 and "both run collective kernels" in r["error"], r
PY
expect_refused 3 "$WHY.*suspend is refused" "$CUSNAP" suspend pair
counts_advance "$LAUNCH_OUT"
no_errors "$LAUNCH_OUT"
"$CUSNAP" inspect pair --json >"$T/inspect.json" 2>&1 || fail "inspect failed: $(cat "$T/inspect.json")"
if grep -q '"locked"\|"checkpointed"' "$T/inspect.json"; then fail "GPU state left locked: $(cat "$T/inspect.json")"; fi
pass "checkpoint and suspend refused (exit 3), naming both ranks and the GPU; the job counts on"
stop_job "$LAUNCH_OUT"

# The override is read from the supervisor's environment, whose value launch
# checks, and from the command's, which counts first.
expect_refused 2 'CUSNAP_ALLOW_RANKS_SHARING_GPU="yes" is neither 1 nor 0' \
  timeout 30 env CUSNAP_ALLOW_RANKS_SHARING_GPU=yes "$CUSNAP" launch --name bad -- "$PAIR"
[ -z "$(job_pids_all)" ] || fail "launch started a job with CUSNAP_ALLOW_RANKS_SHARING_GPU=yes"
LAUNCH_OUT=$T/bad.out
CUSNAP_ALLOW_RANKS_SHARING_GPU=1 start_job bad "$LAUNCH_OUT" "$PAIR" --print-every 1
CUSNAP_ALLOW_RANKS_SHARING_GPU=yes expect_refused 2 'CUSNAP_ALLOW_RANKS_SHARING_GPU="yes" is neither 1 nor 0' \
  "$CUSNAP" checkpoint bad -o "$T/ck"
CUSNAP_ALLOW_RANKS_SHARING_GPU=yes expect_refused 2 'CUSNAP_ALLOW_RANKS_SHARING_GPU="yes" is neither 1 nor 0' \
  "$CUSNAP" suspend bad
CUSNAP_ALLOW_RANKS_SHARING_GPU=0 expect_refused 3 "both run collective kernels.*checkpoint is refused" \
  "$CUSNAP" checkpoint bad -o "$T/ck"
CUSNAP_ALLOW_RANKS_SHARING_GPU=on expect_refused 2 'CUSNAP_ALLOW_RANKS_SHARING_GPU="on" is neither' \
  "$CUSNAP" suspend bad
[ ! -e "$T/ck" ] || fail "a refused checkpoint left $T/ck"
counts_advance "$LAUNCH_OUT"
pass "an invalid CUSNAP_ALLOW_RANKS_SHARING_GPU is refused by launch and by the commands; the command's value counts before the supervisor's"
stop_job "$LAUNCH_OUT"

# With the check off the checkpoint goes ahead, and what it protects from
# happens: after the driver's restore (here in place, --leave-running) the
# ranks' next collective fails, as on the real driver (Xid 109).
LAUNCH_OUT=$T/allow.out
start_job allow "$LAUNCH_OUT" "$PAIR" --print-every 1
CUSNAP_ALLOW_RANKS_SHARING_GPU=1 "$CUSNAP" checkpoint allow -o "$T/ck-allow" --leave-running --json \
  >"$T/allow.json" 2>"$T/allow.err" ||
  fail "with CUSNAP_ALLOW_RANKS_SHARING_GPU=1 the checkpoint failed: $(cat "$T/allow.err" "$T/allow.json")"
python3 - "$T/allow.json" <<'PY' || fail "the checkpoint did not cut the ranks: $(cat "$T/allow.json")"
import json, sys
cut = json.load(open(sys.argv[1]))["collective_cut"]
assert len(cut) == 2 and len(set(cut.values())) == 1, cut
PY
for _ in $(seq 1 100); do grep -q "CUDA_ERROR_LAUNCH_FAILED" "$LAUNCH_OUT" && break; sleep 0.1; done
grep -q "cuStreamSynchronize(stream) failed: CUDA_ERROR_LAUNCH_FAILED" "$LAUNCH_OUT" ||
  fail "the ranks ran on after the driver's restore: $(tail -3 "$LAUNCH_OUT")"
wait_exit "$SUP"
pass "CUSNAP_ALLOW_RANKS_SHARING_GPU=1 in cusnap checkpoint's environment: the checkpoint cuts both ranks and goes ahead; after the driver's restore their collective fails (CUDA_ERROR_LAUNCH_FAILED), as on the real driver"
echo "PASS"
