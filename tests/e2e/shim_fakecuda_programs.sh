#!/usr/bin/env bash
# The simulated driver's own programs work unchanged under the shim: the same
# output with and without LD_PRELOAD of libcusnap_shim.so (pids aside), and the
# driver checkpoint API driven from outside still locks, checkpoints, restores
# and unlocks a process whose driver calls all pass the shim's gate.
set -euo pipefail
B=${CUSNAP_FAKECUDA_DIR:?CUSNAP_FAKECUDA_DIR must name the simulated driver build}
SHIM=${CUSNAP_BINARY_DIR:?}/lib/libcusnap_shim.so
[ -f "$SHIM" ] || { echo "FAIL: $SHIM is not built"; exit 1; }
[ -x "$B/fakecuda_holder" ] || { echo "FAIL: $B/fakecuda_holder is not built"; exit 1; }
export LD_LIBRARY_PATH="$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
PRELOAD=$SHIM
ASAN=$(ldd "$SHIM" | awk '/libasan\.so/ {print $3; exit}')
if [ -n "$ASAN" ]; then PRELOAD="$ASAN:$SHIM"; export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}; fi
T=$(mktemp -d /tmp/shim-e2e.XXXXXX)
HOLDER=
cleanup() { [ -n "$HOLDER" ] && kill -9 "$HOLDER" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$T"/*.out; do echo "--- $f"; tail -20 "$f"; done; exit 1; }

# 1. Same output with and without the shim.
"$B/fakecuda_holder" 8 5 | sed 's/^ready [0-9]*/ready PID/' >"$T/plain.out" || fail "holder without the shim"
LD_PRELOAD=$PRELOAD CUSNAP_SHIM_DEBUG=1 "$B/fakecuda_holder" 8 5 2>"$T/shim.err" |
  sed 's/^ready [0-9]*/ready PID/' >"$T/shim.out" || fail "holder under the shim"
cmp -s "$T/plain.out" "$T/shim.out" || { diff "$T/plain.out" "$T/shim.out"; fail "output differs under the shim"; }
if grep -q 'failing closed\|NOT_SUPPORTED' "$T/shim.err"; then cat "$T/shim.err"; fail "the shim failed a call closed"; fi

# 2. Driver checkpoint of a process under the shim, from outside.
(LD_PRELOAD=$PRELOAD exec "$B/fakecuda_holder" 8 0 >"$T/holder.out" 2>&1) &
HOLDER=$!
for _ in $(seq 100); do grep -q '^tick 2 ok' "$T/holder.out" 2>/dev/null && break; sleep 0.1; done
grep -q '^tick 2 ok' "$T/holder.out" || fail "holder under the shim did not start"
grep -q "libcusnap_shim" "/proc/$HOLDER/maps" || fail "the shim is not mapped in the holder"
"$B/fakecuda_ckpt" suspend "$HOLDER" 5000 >"$T/ckpt.out" || fail "lock + checkpoint"
before=$(grep -c '^tick .* ok$' "$T/holder.out" || true)
sleep 0.3
[ "$(grep -c '^tick .* ok$' "$T/holder.out" || true)" = "$before" ] || fail "holder ran while checkpointed"
"$B/fakecuda_ckpt" resume "$HOLDER" >>"$T/ckpt.out" || fail "restore + unlock"
for _ in $(seq 100); do
  [ "$(grep -c '^tick .* ok$' "$T/holder.out" || true)" -ge $((before + 3)) ] && break
  sleep 0.1
done
[ "$(grep -c '^tick .* ok$' "$T/holder.out" || true)" -ge $((before + 3)) ] || fail "holder did not resume"
if grep -q CORRUPT "$T/holder.out"; then fail "device bytes corrupted"; fi
kill -9 "$HOLDER" 2>/dev/null; wait "$HOLDER" 2>/dev/null || true; HOLDER=

# 3. Through cusnap launch, which preloads the shim from <bin>/../lib. Not
# under ASan: cusnap preloads the shim alone, without the ASan runtime it
# needs first; the PASS line then says the section was not run.
CUSNAP=$CUSNAP_BINARY_DIR/bin/cusnap
[ -x "$CUSNAP" ] || fail "$CUSNAP is not built"
NOT_RUN=
if [ -n "$ASAN" ]; then
  NOT_RUN=" (section 3, cusnap launch, NOT run: the shim is built with ASan)"
else
  "$CUSNAP" launch -- sh -c 'grep -c libcusnap_shim /proc/self/maps' >"$T/launch_maps.out" 2>&1 || fail "cusnap launch"
  [ "$(tail -1 "$T/launch_maps.out")" -ge 1 ] || fail "cusnap launch did not preload the shim"
  "$CUSNAP" launch -- "$B/fakecuda_holder" 8 5 2>/dev/null | sed 's/^ready [0-9]*/ready PID/' >"$T/launch.out" ||
    fail "holder under cusnap launch"
  cmp -s "$T/plain.out" "$T/launch.out" || { diff "$T/plain.out" "$T/launch.out"; fail "output differs under cusnap launch"; }
  echo "cusnap launch: shim preloaded, identical output"
fi
echo "PASS: identical output under the shim; checkpoint cycle after $before ticks$NOT_RUN"
