#!/usr/bin/env bash
# A process running under the shim goes through driver checkpoint, a real CRIU
# dump and restore, driver restore + unlock, and continues with its device
# bytes intact.
. "$(dirname "$0")/lib_fakecuda.sh"
SHIM=${CUSNAP_BINARY_DIR:?}/lib/libcusnap_shim.so
[ -f "$SHIM" ] || { echo "skip: $SHIM not built"; exit 77; }
PRELOAD=$SHIM
ASAN=$(ldd "$SHIM" | awk '/libasan\.so/ {print $3; exit}')
if [ -n "$ASAN" ]; then echo "skip: CRIU of a sanitizer build"; exit 77; fi

start holder env LD_PRELOAD="$PRELOAD" "$B/fakecuda_holder" 16 0
wait_for holder '^ready ' 10
PID=$(awk '/^ready/{print $2; exit}' "$T/holder.out")
KILL_PIDS+=("$PID")
wait_for holder '^tick 2 ok' 10
grep -q libcusnap_shim "/proc/$PID/maps" || fail "the shim is not mapped in the holder"

"$B/fakecuda_ckpt" suspend "$PID" 5000 || fail "driver lock + checkpoint"
before=$(count holder '^tick .* ok$')
dump holder "$PID"
restore holder
kill -0 "$PID" 2>/dev/null || fail "restored process not running"
"$B/fakecuda_ckpt" resume "$PID" || fail "driver restore + unlock"
grep -q libcusnap_shim "/proc/$PID/maps" || fail "the shim is not mapped after restore"
wait_for holder "^tick $((before + 3)) ok" 10
if grep -q CORRUPT "$T/holder.out"; then fail "device bytes corrupted"; fi
echo "PASS: under the shim, $before ticks before dump, $(count holder '^tick .* ok$') after restore"
