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
