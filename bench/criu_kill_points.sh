#!/usr/bin/env bash
# Where a `criu dump` may be killed without harm to the process it dumps
# (src/coord/criu_interrupt.h, which a cancel of `cusnap checkpoint` obeys):
#
#   sudo bash bench/criu_kill_points.sh [TRIALS]   (default 120; root, CRIU >= 4.1)
#
# Each trial starts a small Python process that counts into a file every
# 10 ms, runs `criu dump --leave-running -v4` on it and kills CRIU (SIGKILL)
# at a random point of its run (from 60% to 100% of the time a whole dump of
# the same process took, measured first: CRIU's own start is most of the
# rest), then looks whether the process still counts half a second on. The trials are
# grouped by the last of CRIU's log marks (criu_interrupt.h) before the kill:
# killed inside an infection ("Parasite syscall_ip at") or a cure
# ("Waiting for PID to trap"), the process is expected to die; anywhere
# else, to run on. It also counts the kills after which a helper process
# CRIU forked (while it probes the kernel at its start) is left behind,
# stopped, and ends those. CRIU runs with CRIU_FAULT=130 (no hardware breakpoints),
# as cusnap runs it where those are not delivered; CUSNAP_CRIU names another
# CRIU.
set -uo pipefail
trials=${1:-120}
criu=${CUSNAP_CRIU:-$(command -v criu || echo /usr/local/sbin/criu)}
work=$(mktemp -d /tmp/cusnap-criu-kill.XXXXXX)
trap 'rm -rf "$work"' EXIT
cat >"$work/counter.py" <<'PY'
import os, sys, time
path, i = sys.argv[1], 0
while True:
    i += 1
    with open(path + ".t", "w") as f:
        f.write(str(i))
    os.replace(path + ".t", path)
    time.sleep(0.01)
PY
count() { cat "$1" 2>/dev/null || echo 0; }
marks='Parasite syscall_ip at|has been switched to daemon mode| to trap|Dumping mm \(pid:|Dumping finished successfully'
# trial MS: one trial, CRIU killed MS ms after its start (none: left to
# finish, the time it took printed); appends "MARK|FATE" to results.
trial() {
  local p c a b mark fate t0
  setsid python3 "$work/counter.py" "$work/count" </dev/null >/dev/null 2>&1 &
  p=$!
  for _ in $(seq 1 200); do [ -s "$work/count" ] && break; sleep 0.01; done
  rm -rf "$work/d" && mkdir "$work/d"
  t0=$(date +%s%N)
  CRIU_FAULT=130 "$criu" dump -t "$p" -D "$work/d" -o dump.log -v4 --leave-running --shell-job \
    >/dev/null 2>&1 &
  c=$!
  if [ -n "${1:-}" ]; then
    sleep "$(awk -v d="$1" 'BEGIN {print d / 1000}')"
    kill -9 "$c" 2>/dev/null
  fi
  wait "$c" 2>/dev/null
  [ -z "${1:-}" ] && echo $(( ($(date +%s%N) - t0) / 1000000 ))
  mark=$(grep -oE "$marks" "$work/d/dump.log" 2>/dev/null | tail -1)
  a=$(count "$work/count")
  sleep 0.5
  b=$(count "$work/count")
  fate=dies
  kill -0 "$p" 2>/dev/null && [ "$b" -gt "$a" ] && fate="runs on"
  echo "${mark:-(no mark yet)}|$fate" >>"$work/results"
  # A CRIU killed while it starts may leave a helper it forked (stopped):
  # counted, and ended.
  if pkill -9 -f -- "dump -t $p -D $work/d " 2>/dev/null; then echo "$mark" >>"$work/helpers"; fi
  kill -9 "$p" 2>/dev/null
  wait "$p" 2>/dev/null
  rm -f "$work/count"
}
whole=$(trial 2>/dev/null)
: >"$work/results"
: >"$work/helpers"
for _ in $(seq 1 "$trials"); do
  trial $((whole * 6 / 10 + RANDOM % (whole * 4 / 10 + 1))) 2>/dev/null
done
echo "criu_kill_points: $trials trials of $criu, a whole dump taking $whole ms, each killed 60-100% into it; by CRIU's last log mark:"
sort "$work/results" | uniq -c | awk -F'|' '{printf "  %-45s %s\n", $1, $2}'
echo "  CRIU's own helper processes left behind by the kill (ended here): after $(wc -l <"$work/helpers") of $trials kills"
