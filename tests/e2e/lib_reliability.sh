# Helpers for the reliability_*.sh end-to-end tests (sourced, after
# lib_checkpoint.sh).
#
# launch_env NAME OUTFILE ENV... -- JOB-ARGS...: cusnap launch of a pattern
#   job whose supervisor gets ENV (FAKECUDA_FAIL, FAKECUDA_DELAY, ...) while
#   the job itself does not (FAKECUDA_* would otherwise reach it too).
#   Sets LAST_SUPERVISOR.
# driver_calls PID FILE: the driver calls process PID made, in order, from
#   the FAKECUDA_LOG=1 lines in FILE.
# nth_of NAME INDEX LIST...: how many times NAME occurs in LIST up to INDEX.
# expect_guardian_brought_back NAME PID: after the supervisor of job NAME
#   (process PID) died mid-operation, its guardian says in the job's log that
#   it brought the job back and supervises it, the driver state is running
#   (asked of the simulated driver; on the real one the counting shows it) and
#   the job counts on in the log with every byte right. Sets LOG and N (the
#   count when the guardian had reported).

launch_env() {
  local name=$1 out=$2
  shift 2
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" "$CUSNAP" launch --name "$name" -- \
    env -u FAKECUDA_FAIL -u FAKECUDA_DELAY -u FAKECUDA_LOG "$PATTERN_JOB" "$@" >"$out" 2>&1 &
  SUPERVISORS+=($!)
  LAST_SUPERVISOR=$!
}

driver_calls() {
  sed -n "s/^fakecuda\[$1\]: \([A-Za-z0-9_]*\).*/\1/p" "$2"
}

nth_of() {
  local name=$1 idx=$2 n=0 i=0
  shift 2
  for c in "$@"; do
    [ "$c" = "$name" ] && n=$((n + 1))
    [ $i = "$idx" ] && break
    i=$((i + 1))
  done
  echo "$n"
}

# rss_kb PID / fd_count PID: resident set (kB) and open descriptors.
rss_kb() { sed -n 's/^VmRSS:\s*\([0-9]*\) kB/\1/p' "/proc/$1/status"; }
fd_count() { ls "/proc/$1/fd" | wc -l; }
# fd_count_settled PID MAX: fd_count once it is MAX or fewer, waiting 5 s at
# most (the supervisor's connection thread closes its socket just after its
# reply, so a count right after a request can be high by it); else the last.
fd_count_settled() {
  local n
  for _ in $(seq 1 100); do
    n=$(fd_count "$1")
    [ "$n" -le "$2" ] && break
    sleep 0.05
  done
  echo "$n"
}

expect_guardian_brought_back() {
  local name=$1 pid=$2 state
  LOG=$CUSNAP_RUNTIME_BASE/$name/output.log
  for _ in $(seq 1 200); do grep -q "guardian: the job runs on" "$LOG" 2>/dev/null && break; sleep 0.05; done
  grep -q "guardian: the job runs on, supervised by process" "$LOG" ||
    fail "the guardian did not report bringing the job back: $(grep cusnap: "$LOG" 2>/dev/null)"
  # (On the real driver the job counting on below shows its GPU state back.)
  if [ "$REAL_DRIVER" != 1 ]; then
    state=$("$CUSNAP_FAKECUDA_DIR/fakecuda_ckpt" state "$pid" 2>&1 || true)
    case $state in *"state 0"*) ;; *) fail "after the guardian's recovery the driver state is '$state'" ;; esac
  fi
  N=$(last_count "$LOG")
  wait_count "$LOG" $((N + 5)) "" 20
  grep -q "pattern mismatch" "$LOG" && fail "the recovered job found a wrong byte"
  return 0
}
