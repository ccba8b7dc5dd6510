#!/usr/bin/env bash
# A ring of two processes in a tight loop (cusnap-share-ring --tight:
# cuMemsetD32, cuMemcpyDtoD and cuMemcpyDtoH on the shared memory without a
# pause) is checkpointed mid-flight and stopped, then restored: both keep
# counting past where they stopped, with every byte read correct, and see each
# other's writes again.
source "$(dirname "$0")/lib_shared.sh"

PREFIXES=("ring 0 " "ring 1 ")
LAUNCH_OUT=$T/launch.out
start_job tight "$LAUNCH_OUT" "$SHARE_RING" --procs 2 --mib 2 --tight
# Lines come every 1000 iterations or 100 ms: not every count is printed.
checkpoint_restore_cycle tight 0
# And it runs on at full speed: a further 2000 iterations each, every byte
# checked, with the peer's writes still arriving.
OUT=$T/restore-tight.out
for k in "${!PREFIXES[@]}"; do
  p=${PREFIXES[k]}
  now=$(last_count "$OUT" "$p")
  seen=$(last_seen "$OUT" "$p")
  wait_count "$OUT" $((now + 2000)) "$p" 40
  wait_seen "$OUT" "$p" $((seen + 1000))
done
no_errors "$OUT"
for p in $(ready_pids "$LAUNCH_OUT"); do kill -0 "$p" || fail "process $p ended"; done
pass "a further 2000 iterations each after the restore"
echo "PASS"
