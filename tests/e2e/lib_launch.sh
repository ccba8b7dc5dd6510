# Helpers for the launch_*.sh end-to-end tests of the supervisor. Sourced.
# Each test gets a private CUSNAP_RUNTIME_BASE and a scratch directory, both
# removed (with any job still running) when the test ends.
set -euo pipefail

: "${CUSNAP_BINARY_DIR:?set by CTest}"
CUSNAP="$CUSNAP_BINARY_DIR/bin/cusnap"
[ -x "$CUSNAP" ] || { echo "FAIL: $CUSNAP is not built"; exit 1; }

export CUSNAP_RUNTIME_BASE="$(mktemp -d /tmp/cusnap-e2e-base.XXXXXX)"
SCRATCH="$(mktemp -d /tmp/cusnap-e2e.XXXXXX)"
BG_PIDS=()

cleanup() {
  local p j i
  # SIGTERM reaches each job through its supervisor; what is left is killed.
  for p in "${BG_PIDS[@]:-}"; do
    [ -n "$p" ] && kill -TERM "$p" 2>/dev/null || true
  done
  for i in $(seq 50); do
    j=0
    for p in "${BG_PIDS[@]:-}"; do [ -n "$p" ] && kill -0 "$p" 2>/dev/null && j=1; done
    [ "$j" = 0 ] && break
    sleep 0.1
  done
  for j in "$CUSNAP_RUNTIME_BASE"/*/job.json; do
    [ -f "$j" ] || continue
    p=$(sed -n 's/.*"root_pid": *\([0-9]*\).*/\1/p' "$j")
    [ -n "$p" ] && kill -KILL -- "-$p" "$p" 2>/dev/null || true
  done
  for p in "${BG_PIDS[@]:-}"; do
    [ -n "$p" ] && kill -KILL "$p" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  rm -rf "$CUSNAP_RUNTIME_BASE" "$SCRATCH"
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
pass() { echo "ok: $*"; }

# expect_eq WHAT EXPECTED ACTUAL
expect_eq() { [ "$2" = "$3" ] || fail "$1: expected '$2', got '$3'"; pass "$1"; }

# run_status CMD...: the exit status of CMD, without tripping set -e.
run_status() { local rc=0; "$@" || rc=$?; echo "$rc"; }

# wait_for SECONDS CMD...: retries CMD until it succeeds or time runs out.
wait_for() {
  local deadline=$(( $(date +%s) + $1 )); shift
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 0.1
  done
}

# launch_bg NAME CMD...: starts `cusnap launch --name NAME -- CMD...` in the
# background with output in $SCRATCH/NAME.out/.err; waits for its socket.
# Sets LAUNCH_PID.
launch_bg() {
  local name="$1"; shift
  "$CUSNAP" launch --name "$name" -- "$@" >"$SCRATCH/$name.out" 2>"$SCRATCH/$name.err" &
  LAUNCH_PID=$!
  BG_PIDS+=("$LAUNCH_PID")
  wait_for 10 test -S "$CUSNAP_RUNTIME_BASE/$name/control.sock" || fail "job $name did not start"
  wait_for 10 test -s "$CUSNAP_RUNTIME_BASE/$name/job.json" || fail "job $name wrote no job.json"
}

# wait_job PID: waits for a background job; its exit status lands in $RC.
# (Not usable inside $(...): a subshell cannot wait for our children.)
wait_job() { RC=0; wait "$1" || RC=$?; }
