#!/usr/bin/env bash
# A process holding simulated device memory goes through a driver checkpoint
# (lock + checkpoint by a separate coordinator process), a real CRIU dump that
# kills it, a CRIU restore, then driver restore + unlock; it must find its
# device bytes intact and keep counting.
. "$(dirname "$0")/lib_fakecuda.sh"

start holder "$B/fakecuda_holder" 16 0
wait_for holder '^ready ' 10
PID=$(awk '/^ready/{print $2; exit}' "$T/holder.out")
KILL_PIDS+=("$PID")
wait_for holder '^tick 2 ok' 10

"$B/fakecuda_ckpt" suspend "$PID" 5000 || fail "driver lock + checkpoint"
[ "$("$B/fakecuda_ckpt" state "$PID" | head -1)" = "state 2" ] || fail "not CHECKPOINTED"
if grep -q 'memfd:fakecuda' "/proc/$PID/maps"; then fail "device memfds still mapped after checkpoint"; fi
before=$(count holder '^tick .* ok$')

dump holder "$PID"
restore holder
kill -0 "$PID" 2>/dev/null || fail "restored process not running"
[ "$("$B/fakecuda_ckpt" state "$PID" | head -1)" = "state 2" ] || fail "restored process not CHECKPOINTED"
sleep 0.3
[ "$(count holder '^tick .* ok$')" = "$before" ] || fail "holder ran while checkpointed"

"$B/fakecuda_ckpt" resume "$PID" || fail "driver restore + unlock"
grep -q 'memfd:fakecuda' "/proc/$PID/maps" || fail "device memory not mapped after restore"
wait_for holder "^tick $((before + 3)) ok" 10
if grep -q CORRUPT "$T/holder.out"; then fail "device bytes corrupted"; fi
echo "PASS: $before ticks before dump, $(count holder '^tick .* ok$') after restore"
