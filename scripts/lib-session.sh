# shellcheck shell=bash
# Helpers for scripts that start jobs under cusnap and must find and end
# every process of them (sourced by scripts/gpu-test.sh and
# bench/shared_checkpoint.sh).

# session_pids SID: the processes of session SID (a job leads its own session;
# CRIU restores it), from /proc, by id.
session_pids() {
  local f line sid
  for f in /proc/[0-9]*/stat; do
    { read -r line <"$f"; } 2>/dev/null || continue
    read -r _ _ _ sid _ <<<"${line##*) }"
    [ "$sid" = "$1" ] && { f=${f#/proc/}; echo "${f%/stat}"; }
  done
  return 0
}

# wait_pids_gone SECONDS PID...: 0 when all are gone within SECONDS.
wait_pids_gone() {
  local secs=$1 p left
  shift
  for _ in $(seq 1 $((secs * 20))); do
    left=0
    for p in "$@"; do [ -e "/proc/$p" ] && left=1; done
    [ $left = 0 ] && return 0
    sleep 0.05
  done
  return 1
}
