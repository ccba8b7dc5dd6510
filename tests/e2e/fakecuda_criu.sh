#!/usr/bin/env bash
# A process holding simulated device memory goes through a driver checkpoint
# (lock + checkpoint by a separate coordinator process), a real CRIU dump that
# kills it, a CRIU restore, then driver restore + unlock; it must find its
# device bytes intact and keep counting.
set -euo pipefail

B=${CUSNAP_FAKECUDA_DIR:?CUSNAP_FAKECUDA_DIR must name the simulated driver build}
if [ "$(id -u)" != 0 ]; then echo "skip: CRIU needs root"; exit 77; fi
CRIU=$(command -v criu || true)
[ -n "$CRIU" ] || CRIU=/usr/local/sbin/criu
if [ ! -x "$CRIU" ]; then echo "skip: criu not installed"; exit 77; fi

T=$(mktemp -d /tmp/fakecuda-criu.XXXXXX)
PID=
cleanup() {
  if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then kill -9 "$PID" 2>/dev/null || true; fi
  if [ "${KEEP_TMP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  echo "--- holder output"; cat "$T/out" 2>/dev/null || true
  for f in "$T"/img/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done
  exit 1
}
# wait_for PATTERN SECONDS: waits until the holder's output has PATTERN.
wait_for() {
  for _ in $(seq 1 $(($2 * 10))); do
    grep -q "$1" "$T/out" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "timed out waiting for '$1'"
}
ticks() { grep -c '^tick .* ok$' "$T/out" || true; }

export LD_LIBRARY_PATH="$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cd "$T"
setsid "$B/fakecuda_holder" 16 0 </dev/null >"$T/out" 2>"$T/err" &
CHILD=$!
wait_for '^ready ' 10
PID=$(awk '/^ready/{print $2; exit}' "$T/out")
wait_for '^tick 2 ok' 10

"$B/fakecuda_ckpt" suspend "$PID" 5000 || fail "driver lock + checkpoint"
[ "$("$B/fakecuda_ckpt" state "$PID" | head -1)" = "state 2" ] || fail "not CHECKPOINTED"
grep -q 'memfd:fakecuda' "/proc/$PID/maps" && fail "device memfds still mapped after checkpoint"
before=$(ticks)

mkdir "$T/img"
exec 3>&2 2>/dev/null  # bash reports the dumped (killed) child on stderr
"$CRIU" dump -t "$PID" -D "$T/img" -o dump.log || { exec 2>&3; fail "criu dump"; }
wait "$CHILD" || true  # reap: restore fails while the pid is a zombie
exec 2>&3 3>&-
kill -0 "$PID" 2>/dev/null && fail "process still alive after dump"

"$CRIU" restore -d -D "$T/img" -o restore.log || fail "criu restore"
kill -0 "$PID" 2>/dev/null || fail "restored process not running"
[ "$("$B/fakecuda_ckpt" state "$PID" | head -1)" = "state 2" ] || fail "restored process not CHECKPOINTED"
sleep 0.3
[ "$(ticks)" = "$before" ] || fail "holder ran while checkpointed"

"$B/fakecuda_ckpt" resume "$PID" || fail "driver restore + unlock"
grep -q 'memfd:fakecuda' "/proc/$PID/maps" || fail "device memory not mapped after restore"
want=$((before + 3))
wait_for "^tick $want ok" 10
grep -q CORRUPT "$T/out" && fail "device bytes corrupted"
echo "PASS: $before ticks before dump, $(ticks) after restore"
