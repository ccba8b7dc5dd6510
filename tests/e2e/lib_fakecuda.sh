# Helpers for the simulated driver's end-to-end tests (sourced, not a test).
# Needs CUSNAP_FAKECUDA_DIR; skips (77) without root or CRIU. Provides:
#   $B (driver dir, on LD_LIBRARY_PATH), $CRIU, $T (temp dir, removed on exit),
#   start NAME CMD...  run CMD in its own session, output to $T/NAME.out; sets
#                      CHILD_<NAME> to its pid (for reaping) and kills it on exit
#   wait_for NAME PATTERN SECONDS, fail MESSAGE, count NAME PATTERN
#   dump NAME PID      criu dump (kills PID) into $T/img-NAME and reap it
#   restore NAME       criu restore -d from $T/img-NAME
#   kill_reap PID      SIGKILL a started process and reap it
set -euo pipefail

B=${CUSNAP_FAKECUDA_DIR:?CUSNAP_FAKECUDA_DIR must name the simulated driver build}
if [ "$(id -u)" != 0 ]; then echo "skip: CRIU needs root"; exit 77; fi
CRIU=$(command -v criu || true)
[ -n "$CRIU" ] || CRIU=/usr/local/sbin/criu
if [ ! -x "$CRIU" ]; then echo "skip: criu not installed"; exit 77; fi
# CRIU stops each process it infected at a hardware breakpoint, which some
# virtual machines never deliver (the dump then hangs). These tests run CRIU
# themselves, so they use its fallback, system-call stops, which works on every
# machine (cusnap probes and chooses: CUSNAP_CRIU_BREAKPOINTS, man cusnap).
export CRIU_FAULT=${CRIU_FAULT:-130}
export LD_LIBRARY_PATH="$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# The processes dumped here must hold no descriptor of ours: a file the test
# runner left open (its log, which keeps growing) would not restore.
for fd in $(ls /proc/$$/fd); do
  [ "$fd" -gt 2 ] && [ "$fd" -lt 255 ] && eval "exec $fd>&-" 2>/dev/null || true
done

T=$(mktemp -d /tmp/fakecuda-e2e.XXXXXX)
KILL_PIDS=()
cleanup() {
  exec 2>/dev/null  # no job reports for the processes killed here
  for p in "${KILL_PIDS[@]}"; do
    if kill -0 "$p" 2>/dev/null; then kill -9 "$p" 2>/dev/null || true; fi
  done
  if [ "${KEEP_TMP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  for f in "$T"/*.out; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done
  for f in "$T"/img-*/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done
  exit 1
}

start() {
  local name=$1
  shift
  (cd "$T" && exec setsid "$@" </dev/null >"$T/$name.out" 2>"$T/$name.err") &
  eval "CHILD_$name=$!"
  KILL_PIDS+=("$!")
}

wait_for() {
  local i
  for i in $(seq 1 $(($3 * 10))); do
    grep -q "$2" "$T/$1.out" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "timed out waiting for '$2' from $1"
}

count() { grep -c "$2" "$T/$1.out" || true; }

dump() {
  local name=$1 pid=$2 child
  child=$(eval echo "\$CHILD_$name")
  mkdir -p "$T/img-$name"
  exec 3>&2 2>/dev/null  # bash reports the dumped (killed) child on stderr
  "$CRIU" dump -t "$pid" -D "$T/img-$name" -o dump.log || { exec 2>&3; fail "criu dump of $name"; }
  wait "$child" || true  # reap: restore fails while the pid is a zombie
  exec 2>&3 3>&-
  if kill -0 "$pid" 2>/dev/null; then fail "$name still alive after dump"; fi
}

restore() {
  (cd "$T" && "$CRIU" restore -d -D "$T/img-$1" -o restore.log) || fail "criu restore of $1"
}

kill_reap() {
  exec 3>&2 2>/dev/null
  kill -9 "$1" || true
  wait "$1" || true
  exec 2>&3 3>&-
}
