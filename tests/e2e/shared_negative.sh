#!/usr/bin/env bash
# The negative control of the shared_*.sh tests.
# 1. Two processes sharing a POSIX-fd allocation with the shim's tracking
#    turned off (CUSNAP_SHIM_TRACK=0): cusnap cannot restore their sharing, so
#    checkpoint refuses the job (exit 3, saying that it shares device memory)
#    and the job runs on untouched, both processes counting with correct bytes.
# 2. Why: with the simulated driver alone (as tests/e2e/fakecuda_criu_import.sh),
#    an importer of that workload checkpointed by the driver without releasing
#    its import first cannot be restored: restore fails
#    CUDA_ERROR_NOT_SUPPORTED (801) and leaves it CHECKPOINTED (unlock: 401).
source "$(dirname "$0")/lib_shared.sh"

PREFIXES=("" "importer ")
LAUNCH_OUT=$T/launch.out
# Untracked sharing is seen through the simulated driver's allocation names;
# the real driver shows none (README: not yet detected there).
if fake_only "the refusal of untracked sharing"; then
start_job untracked "$LAUNCH_OUT" env CUSNAP_SHIM_TRACK=0 "$SHARE_JOB" --mib 4 --interval-ms 20
expect_refused 3 "shares device memory" "$CUSNAP" checkpoint untracked -o "$T/ckpt"
[ ! -e "$T/ckpt/manifest.json" ] || fail "a refused checkpoint wrote a manifest"
for p in "${PREFIXES[@]}"; do expect_running untracked "$PID" "$LAUNCH_OUT" "$p"; done
for p in $(ready_pids "$LAUNCH_OUT"); do kill -0 "$p" || fail "process $p ended"; done
no_errors "$LAUNCH_OUT"
pass "untracked sharing: refused, both processes run on"
stop_job "$LAUNCH_OUT"
fi

if fake_only "the simulated driver's checkpoint of an unreleased importer"; then
  CKPT=$CUSNAP_FAKECUDA_DIR/fakecuda_ckpt
  [ -x "$CKPT" ] || fail "$CKPT is not built"
  setsid "$SHARE_JOB" --mib 4 --interval-ms 20 </dev/null >"$T/direct.out" 2>&1 &
  DIRECT=$!
  echo "$DIRECT" >>"$T/job-pids"
  wait_count "$T/direct.out" 3 "importer " 20
  IPID=$(sed -n 's/^importer ready pid \([0-9]*\)$/\1/p' "$T/direct.out")
  [ -n "$IPID" ] || fail "no importer pid"
  echo "$IPID" >>"$T/job-pids"
  "$CKPT" suspend "$IPID" 5000 >"$T/fc.out" 2>&1 || fail "driver checkpoint of the importer: $(cat "$T/fc.out")"
  out=$("$CKPT" restore "$IPID" || true)
  grep -q '(801)' <<<"$out" || fail "restore of the unreleased importer: want 801, got: $out"
  [ "$("$CKPT" state "$IPID" | head -1)" = "state 2" ] || fail "the importer was not left CHECKPOINTED"
  out=$("$CKPT" unlock "$IPID" || true)
  grep -q '(401)' <<<"$out" || fail "unlock of the stuck importer: want 401, got: $out"
  pass "driver alone: the unreleased importer cannot be restored (801, then 401)"
  kill -9 "$IPID" "$DIRECT" 2>/dev/null || true
  wait "$DIRECT" 2>/dev/null || true
fi
echo "PASS"
