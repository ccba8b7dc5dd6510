#!/usr/bin/env bash
# Checkpoint and restore of a job whose processes share device memory, against
# the machine's copy ceiling and against a one-process job of the same size,
# all in one run:
#
#   bash bench/shared_checkpoint.sh [--mib N] [--dir D]
#
#   1. cusnap-copy-bandwidth --mib N --file-dir D: pinned device-to-host and
#      host-to-device GB/s through the driver API (4 streams, 64 MiB chunks,
#      best of 5); then the host's ceilings for the same N MiB in D's file
#      system, where the checkpoints go: T threads (the online CPUs, at most
#      16), each writing its own fresh file with 32 MiB pwrite calls from
#      anonymous memory, reading it back with pread (page cache), and memcpy
#      between anonymous buffers (best of 5 each).
#   2. cusnap-pattern-job --mib N (one process) under `cusnap launch`;
#      `cusnap checkpoint JOB -o D/one --json` (stops it), timed; then
#      `cusnap restore D/one --json` in the background, timed until the
#      restored job prints its next "count" line.
#   3. The same with cusnap-share-job --mib N (a parent and its forked child
#      sharing one N MiB cuMemCreate allocation), twice: into D/direct with
#      CUSNAP_SHIM_DIRECT_IO=on in the job (the shim maps the part files and
#      DMAs straight between device and page cache) and into D/staging with
#      CUSNAP_SHIM_DIRECT_IO=off (pinned staging buffers, write/read). The
#      checkpoint's "shared-save" phase writes the shared bytes to
#      D/KEY/shared/*.bin, the restore's "shared-rebuild" phase loads them
#      back; the shim appends one line per copy to $CUSNAP_SHIM_COPY_LOG (the
#      path it took, its own seconds).
#
# Prints a report as Markdown lines, for docs/benchmarks.md: the command line,
# date and machine, the pinned D2H/H2D GB/s, the host's file write, file
# read and memcpy GB/s, per copy path (direct, staging)
# the path the shim actually took (direct, staging, or mixed when it fell
# back part way, with its reason), the shared save GB/s (N MiB / shared-save
# seconds) and its ratios to D2H and to the file write ceiling, the load GB/s
# (N MiB / shared-rebuild seconds) and its ratios to H2D and to the file read
# ceiling, the same for the shim's copies alone (from
# its copy log: without the gate, drain and release around them), and per
# job the checkpoint's
# wall time and phases, the restore's phases, the time from starting the
# restore to the next count line of every process of the job, and checkpoint +
# restore end to end, with the ratio two-process (staging) / one-process.
# Where the direct path is refused (CUSNAP_SHIM_DIRECT_IO=on makes that an
# error), its checkpoint fails: the report says so and goes on with staging. Both jobs count
# every 20 ms and verify all of their N MiB in every process each round, the
# first round after the restore included.
#
# Options: --mib N (default 1024), --dir D (default a new /dev/shm/
# cusnap-bench.XXXX, or /var/tmp/cusnap-bench.XXXX when /dev/shm has less
# than 2N + 512 MiB free (each checkpoint is removed after its measure); removed at the end; a given D is kept, checkpoints
# included). Environment: CUSNAP_BINARY_DIR (the build: bin/cusnap,
# bin/cusnap-*, lib/; default this checkout's build, or with the real driver
# the first of .gpu-bundle/build, build-gpu, build), CUSNAP_FAKECUDA_DIR
# (default $CUSNAP_BINARY_DIR/fakecuda, put on LD_LIBRARY_PATH) unless
# CUSNAP_REAL_DRIVER=1, which uses the system's driver instead.
#
# Exit status: 0 after the report, 1 when a step fails (its output is shown),
# 2 on a bad option, 77 (skipped) without root or CRIU.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
ARGS=("$@")

MIB=1024
DIR=
while [ $# -gt 0 ]; do
  case $1 in
    --mib) [ $# -ge 2 ] && [[ $2 =~ ^[1-9][0-9]*$ ]] || { echo "shared_checkpoint: --mib needs a positive number" >&2; exit 2; }
      MIB=$2; shift 2 ;;
    --dir) [ $# -ge 2 ] || { echo "shared_checkpoint: --dir needs a directory" >&2; exit 2; }
      DIR=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "shared_checkpoint: unknown option $1 (usage: shared_checkpoint.sh [--mib N] [--dir D])" >&2; exit 2 ;;
  esac
done

# Never multicast on lent GPU machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

skip() { echo "shared_checkpoint: SKIP: $*"; exit 77; }
die() { echo "shared_checkpoint: FAIL: $*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }

REAL_DRIVER=${CUSNAP_REAL_DRIVER:-0}
if [ -z "${CUSNAP_BINARY_DIR:-}" ]; then
  if [ "$REAL_DRIVER" = 1 ]; then
    for b in "$ROOT/.gpu-bundle/build" "$ROOT/build-gpu" "$ROOT/build"; do
      [ -x "$b/bin/cusnap" ] && { CUSNAP_BINARY_DIR=$b; break; }
    done
  fi
  CUSNAP_BINARY_DIR=${CUSNAP_BINARY_DIR:-$ROOT/build}
fi
BIN=$CUSNAP_BINARY_DIR/bin
CUSNAP=$BIN/cusnap
for f in "$CUSNAP" "$BIN/cusnap-copy-bandwidth" "$BIN/cusnap-pattern-job" "$BIN/cusnap-share-job"; do
  [ -x "$f" ] || die "$f is not built (CUSNAP_BINARY_DIR=$CUSNAP_BINARY_DIR)"
done
if [ "$REAL_DRIVER" = 1 ]; then
  # The simulated driver must not be on the loader path.
  if [ -n "${LD_LIBRARY_PATH:-}" ]; then
    LD_LIBRARY_PATH=$(echo "$LD_LIBRARY_PATH" | tr ':' '\n' | grep -v fakecuda | paste -sd: -)
    export LD_LIBRARY_PATH
  fi
  unset CUSNAP_FAKECUDA_DIR CUSNAP_LIBCUDA
else
  FAKE=${CUSNAP_FAKECUDA_DIR:-$CUSNAP_BINARY_DIR/fakecuda}
  [ -e "$FAKE/libcuda.so.1" ] || die "no simulated driver at $FAKE/libcuda.so.1"
  export LD_LIBRARY_PATH="$FAKE${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
[ "$(id -u)" = 0 ] || skip "checkpoint and restore need root (CRIU, the driver's checkpoint API)"
CRIU=${CUSNAP_CRIU:-$(PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin command -v criu || true)}
[ -n "$CRIU" ] || skip "CRIU is not installed"

KEEP=0
if [ -n "$DIR" ]; then
  mkdir -p "$DIR"
  DIR=$(cd "$DIR" && pwd)
  KEEP=1
else
  # /dev/shm unless it lacks room for a checkpoint (containers often give it
  # 64 MiB); then /var/tmp, on disk.
  BASE=/dev/shm
  avail=$( (df -Pk /dev/shm 2>/dev/null || true) | awk 'NR == 2 {print int($4 / 1024)}')
  if [ "${avail:-0}" -lt $((2 * MIB + 512)) ]; then
    echo "shared_checkpoint: /dev/shm has ${avail:-no} MiB free, fewer than $((2 * MIB + 512)): using /var/tmp" >&2
    BASE=/var/tmp
  fi
  DIR=$(mktemp -d "$BASE/cusnap-bench.XXXX")
fi
chmod 755 "$DIR"
export CUSNAP_RUNTIME_BASE=$DIR/run
# Temporary files of cusnap itself (kept CRIU logs of a failed dump) land here too.
export TMPDIR=$DIR
LOGS=$DIR/logs
mkdir -p "$LOGS"
PHASE_TIMEOUT=$((60 + MIB / 128))
WAIT_S=$((120 + MIB / 64))
SUPERVISORS=()
JOB_SIDS=()

source "$ROOT/scripts/lib-session.sh"  # session_pids, wait_pids_gone
cleanup() {
  local rc=$? p sid
  set +e
  for p in "${SUPERVISORS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for sid in "${JOB_SIDS[@]}"; do
    # shellcheck disable=SC2046
    wait_pids_gone 5 $(session_pids "$sid") >/dev/null
    for p in $(session_pids "$sid"); do kill -9 "$p" 2>/dev/null; done
  done
  for p in "${SUPERVISORS[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  if [ $KEEP = 1 ]; then rm -rf "$DIR/run"; else rm -rf "$DIR"; fi
  exit $rc
}
trap cleanup EXIT
trap "exit 143" TERM INT
trap 'echo "shared_checkpoint: FAIL: a command failed at line $LINENO" >&2' ERR

# counts FILE: "LABEL N" per process label ("-" for none, else the words before
# "count") with its last count.
counts() {
  awk 'NF >= 3 && $NF == "ok" && $(NF-2) == "count" && $(NF-1) ~ /^[0-9]+$/ {
      l = ""; for (i = 1; i < NF - 2; i++) l = l (l == "" ? "" : "_") $i
      if (l == "") l = "-"
      if (!(l in first)) first[l] = $(NF-1)
      last[l] = $(NF-1)
    }
    END { for (l in last) print l, first[l], last[l] }' "$1" 2>/dev/null | sort
  return 0
}
ERROR_RE='mismatch|failed|ended|error'
error_lines() { grep -Ei "$ERROR_RE" "$1" 2>/dev/null | head -3; }
json_get() {  # FILE EXPR: EXPR (python, on the first JSON object in FILE as j) or empty
  python3 - "$1" "$2" <<'PY' || true
import json, sys
text = open(sys.argv[1]).read()
try:
    j, _ = json.JSONDecoder().raw_decode(text[text.index("{"):])
    v = eval(sys.argv[2], {"j": j})
    print(v if v is not None else "")
except Exception:
    pass
PY
}
phase() {  # FILE NAME: seconds of that phase (empty when absent)
  json_get "$1" "next((p['seconds'] for p in j.get('phases', []) if p['name'] == '$2'), None)"
}
phase_list() {  # FILE: "name 0.12 s, ..." of every phase
  json_get "$1" "', '.join('%s %.3f' % (p['name'], p['seconds']) for p in j.get('phases', []))"
}
fmt3() { awk -v s="$1" 'BEGIN { printf "%.3f", s }'; }
gbps() { awk -v m="$1" -v s="$2" 'BEGIN { if (s > 0) printf "%.2f", m * 1048576 / s / 1e9; else print "n/a" }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a != "n/a" && b > 0) printf "%.2f", a / b; else print "n/a" }'; }
show() { echo "--- $1"; tail -n "${2:-15}" "$1" 2>/dev/null | sed 's/^/    /'; }

# measure KEY NPROC CMD...: launch CMD as job bench-KEY, let NPROC processes
# count, checkpoint it into $DIR/KEY, restore it in the background and time
# until every process counts again; then stop it. Sets R[KEY,...]. The job's
# environment gets $JOB_ENV (NAME=VALUE words) and CUSNAP_SHIM_COPY_LOG=
# $LOGS/KEY.copy.log. With SOFT=1 a failed checkpoint stops the job and
# returns 1 (R[KEY,failed] says why) instead of ending the run.
declare -A R
JOB_ENV=
SOFT=0
measure() {
  local key=$1 nproc=$2
  shift 2
  local -a jenv=()
  read -r -a jenv <<<"$JOB_ENV"
  local name=bench-$key out=$LOGS/$key.out ck=$DIR/$key cj=$LOGS/$key.ckpt.json
  local rs=$LOGS/$key.restore.out root="" sup t0 before l first n ok rsup
  echo "shared_checkpoint: $key: $*" >&2
  env "${jenv[@]}" CUSNAP_SHIM_COPY_LOG="$LOGS/$key.copy.log" \
    "$CUSNAP" launch --name "$name" -- "$@" >"$out" 2>&1 &
  sup=$!
  SUPERVISORS+=("$sup")
  for _ in $(seq 1 $((WAIT_S * 10))); do
    root=$("$CUSNAP" ps --json 2>/dev/null | python3 -c '
import json, sys
try:
    for j in json.load(sys.stdin):
        if j["name"] == sys.argv[1]: print(j["pid"])
except Exception: pass' "$name" || true)
    [ -n "$root" ] && break
    kill -0 "$sup" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$root" ] || { show "$out"; die "$key: the job did not start under cusnap launch"; }
  JOB_SIDS+=("$root")
  ok=0
  for _ in $(seq 1 $((WAIT_S * 10))); do
    [ "$(counts "$out" | awk '$3 >= 3' | wc -l)" -ge "$nproc" ] && { ok=1; break; }
    [ -n "$(error_lines "$out")" ] && break
    sleep 0.1
  done
  [ $ok = 1 ] || { show "$out"; die "$key: $nproc processes did not start counting"; }
  local pids
  pids=$(session_pids "$root")

  t0=$(now)
  if ! "$CUSNAP" checkpoint "$name" -o "$ck" --timeout "$PHASE_TIMEOUT" --json >"$cj" 2>&1; then
    show "$cj" 30; show "$out"
    [ "$SOFT" = 1 ] || die "$key: cusnap checkpoint failed"
    R[$key,failed]="cusnap checkpoint failed: $( (grep -hv '^ *$' "$LOGS/$key.copy.log" 2>/dev/null || true) | tail -1)"
    echo "shared_checkpoint: $key: ${R[$key,failed]} (going on)" >&2
    kill -TERM "$sup" 2>/dev/null || true
    # shellcheck disable=SC2086
    wait_pids_gone 30 $pids || for p in $pids; do kill -9 "$p" 2>/dev/null; done
    wait "$sup" 2>/dev/null || true
    rm -rf "$ck"
    return 1
  fi
  R[$key,ck_wall]=$(since "$t0")
  wait "$sup" 2>/dev/null || true
  # shellcheck disable=SC2086
  wait_pids_gone 60 $pids || die "$key: processes of the job are still there after the checkpoint"
  before=$(counts "$out")
  R[$key,size]=$(du -sb "$ck" | awk '{print $1}')
  R[$key,shared_size]=$( (du -scb "$ck"/shared/*.bin 2>/dev/null || true) | awk 'END {print $1 + 0}')

  t0=$(now)
  "$CUSNAP" restore "$ck" --timeout "$PHASE_TIMEOUT" --json >"$rs" 2>"$LOGS/$key.restore.err" &
  rsup=$!
  SUPERVISORS+=("$rsup")
  R[$key,restored]=
  ok=0
  for _ in $(seq 1 $((WAIT_S * 100))); do
    # The restore's JSON (pretty-printed) ends with a lone "}" line.
    [ -z "${R[$key,restored]}" ] && grep -qx '}' "$rs" && R[$key,restored]=$(since "$t0")
    [ "$(counts "$rs" | wc -l)" -ge "$nproc" ] && { ok=1; break; }
    [ -n "$(error_lines "$rs")" ] && break
    kill -0 "$rsup" 2>/dev/null || break
    sleep 0.01
  done
  R[$key,rs_count]=$(since "$t0")
  if [ $ok != 1 ]; then
    show "$rs" 30; show "$LOGS/$key.restore.err"
    die "$key: the restored job did not count again (before the checkpoint: $(echo "$before" | awk '{printf "%s %s ", $1, $3}'))"
  fi
  [ -n "${R[$key,restored]}" ] || R[$key,restored]=${R[$key,rs_count]}
  # Every process goes on from where it stopped.
  while read -r l first _; do
    [ -n "$l" ] || continue
    n=$(echo "$before" | awk -v l="$l" '$1 == l {print $3}')
    [ -n "$n" ] && [ "$first" -gt "$n" ] ||
      die "$key: process '$l' counted $first after the restore, $n before: it did not go on"
  done < <(counts "$rs")

  # Stop the restored job (its supervisor forwards the signal).
  kill -TERM "$rsup" 2>/dev/null || true
  # shellcheck disable=SC2046
  wait_pids_gone 30 $(session_pids "$root") || for p in $(session_pids "$root"); do kill -9 "$p" 2>/dev/null; done
  wait "$rsup" 2>/dev/null || true
  R[$key,ck_phases]=$(phase_list "$cj")
  R[$key,rs_phases]=$(phase_list "$rs")
  R[$key,total]=$(awk -v a="${R[$key,ck_wall]}" -v b="${R[$key,rs_count]}" 'BEGIN { printf "%.3f", a + b }')
  return 0
}

# The command line, as given, with the environment that chose the build and driver.
CMDLINE=
[ "$REAL_DRIVER" = 1 ] && CMDLINE+="CUSNAP_REAL_DRIVER=1 "
CMDLINE+="CUSNAP_BINARY_DIR=$CUSNAP_BINARY_DIR bash $0"
for a in "${ARGS[@]}"; do CMDLINE+=" $(printf '%q' "$a")"; done
DATE=$(date -u '+%Y-%m-%d %H:%M UTC')
CPUS="$(nproc) CPUs ($(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo))"
if [ "$REAL_DRIVER" = 1 ]; then
  GPUS=$( (nvidia-smi -L 2>/dev/null || true) | paste -sd ';' - | sed 's/;/; /g')
  DRV=$( (nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null || true) | head -1)
  MACHINE="${GPUS:-real driver, no GPU listed by nvidia-smi}${DRV:+, driver $DRV}"
else
  MACHINE="simulated driver (tests/fakecuda)"
fi
FS=$( (df -T "$DIR" 2>/dev/null || true) | awk 'NR == 2 {print $2}')

# 1. The copy ceiling, and the host's ceilings in the checkpoints' file system
# (its files go straight into $DIR, next to the checkpoints, and are gone
# before they come).
echo "shared_checkpoint: cusnap-copy-bandwidth --mib $MIB --file-dir $DIR" >&2
"$BIN/cusnap-copy-bandwidth" --mib "$MIB" --file-dir "$DIR" >"$LOGS/bandwidth.json" 2>&1 || { show "$LOGS/bandwidth.json"; die "cusnap-copy-bandwidth failed"; }
D2H=$(json_get "$LOGS/bandwidth.json" "'%.2f' % j['d2h_gbps']")
H2D=$(json_get "$LOGS/bandwidth.json" "'%.2f' % j['h2d_gbps']")
BW_DESC=$(json_get "$LOGS/bandwidth.json" "'%s, %d stream(s), %d MiB chunks, best of %d rounds' % (j['device'], j['streams'], j['chunk_mib'], j['rounds'])")
FILE_W=$(json_get "$LOGS/bandwidth.json" "'%.2f' % j['file_write_gbps']")
FILE_R=$(json_get "$LOGS/bandwidth.json" "'%.2f' % j['file_read_gbps']")
MEMCPY=$(json_get "$LOGS/bandwidth.json" "'%.2f' % j['memcpy_gbps']")
FILE_T=$(json_get "$LOGS/bandwidth.json" "j['file_threads']")
HOST_DESC=$(json_get "$LOGS/bandwidth.json" "'%d thread(s), one fresh file each, 32 MiB pwrite / pread, best of %d rounds' % (j['file_threads'], j['rounds'])")
[ -n "$D2H" ] && [ -n "$H2D" ] && [ -n "$FILE_W" ] && [ -n "$FILE_R" ] && [ -n "$MEMCPY" ] ||
  { show "$LOGS/bandwidth.json"; die "cusnap-copy-bandwidth printed no figures"; }

# 2. and 3. The two jobs.
measure one 1 "$BIN/cusnap-pattern-job" --mib "$MIB" --interval-ms 20
[ $KEEP = 1 ] || rm -rf "$DIR/one"  # room on /dev/shm for the next one
JOB_ENV="CUSNAP_SHIM_DIRECT_IO=on" SOFT=1
measure direct 2 "$BIN/cusnap-share-job" --mib "$MIB" --interval-ms 20 || true
[ $KEEP = 1 ] || rm -rf "$DIR/direct"
JOB_ENV="CUSNAP_SHIM_DIRECT_IO=off" SOFT=0
measure staging 2 "$BIN/cusnap-share-job" --mib "$MIB" --interval-ms 20
[ $KEEP = 1 ] || rm -rf "$DIR/staging"

# copy_field KEY save|load FIELD: FIELD=value of the shim's copy log line
copy_field() {
  (grep -h "^$2 " "$LOGS/$1.copy.log" 2>/dev/null || true) | tail -1 |
    awk -v f="$3" '{ for (i = 1; i <= NF; i++) if (index($i, f "=") == 1) { print substr($i, length(f) + 2); exit } }'
}
# path_taken KEY: "save PATH, load PATH" (with why it fell back, if it did)
path_taken() {
  local s l why
  s=$(copy_field "$1" save path); l=$(copy_field "$1" load path)
  why=$( (grep -h "fell_back=" "$LOGS/$1.copy.log" 2>/dev/null || true) | head -1 | sed 's/.*fell_back=//')
  echo "save ${s:-?}, load ${l:-?}${why:+ (fell back: $why)}"
}
# path_line KEY LABEL: the report line of one copy path
path_line() {
  local key=$1 label=$2 ss ls sv ld cs cl
  if [ -n "${R[$key,failed]:-}" ]; then
    echo "- $label: **no figures**: ${R[$key,failed]}"
    return 0
  fi
  ss=$(phase "$LOGS/$key.ckpt.json" shared-save)
  ls=$(phase "$LOGS/$key.restore.out" shared-rebuild)
  sv=$(gbps "$MIB" "$ss"); ld=$(gbps "$MIB" "$ls")
  cs=$(copy_field "$key" save gbps); cl=$(copy_field "$key" load gbps)
  cs=$(awk -v g="${cs:-0}" 'BEGIN { if (g > 0) printf "%.2f", g; else print "n/a" }')
  cl=$(awk -v g="${cl:-0}" 'BEGIN { if (g > 0) printf "%.2f", g; else print "n/a" }')
  echo "- $label ($(path_taken "$key")): save **$sv GB/s** ($(fmt3 "$ss") s shared-save), $(ratio "$sv" "$D2H")x D2H pinned, $(ratio "$sv" "$FILE_W")x the page-cache write ceiling ($FILE_W GB/s, $FILE_T threads); load **$ld GB/s** ($(fmt3 "$ls") s shared-rebuild), $(ratio "$ld" "$H2D")x H2D pinned, $(ratio "$ld" "$FILE_R")x the page-cache read ceiling ($FILE_R GB/s, $FILE_T threads); the shim's copies alone: save $cs GB/s ($(ratio "$cs" "$D2H")x D2H, $(ratio "$cs" "$FILE_W")x write ceiling), load $cl GB/s ($(ratio "$cl" "$H2D")x H2D, $(ratio "$cl" "$FILE_R")x read ceiling)"
}
DCK_S=$(phase "$LOGS/one.ckpt.json" driver-checkpoint)
DRS_S=$(phase "$LOGS/one.restore.out" driver-restore)
mib() { awk -v b="$1" 'BEGIN { printf "%.0f MiB", b / 1048576 }'; }
for key in direct staging; do
  [ -n "${R[$key,failed]:-}" ] && continue
  [ -n "$(phase "$LOGS/$key.ckpt.json" shared-save)" ] ||
    die "$key: the checkpoint has no shared-save phase: $(phase_list "$LOGS/$key.ckpt.json")"
  [ -n "$(phase "$LOGS/$key.restore.out" shared-rebuild)" ] ||
    die "$key: the restore has no shared-rebuild phase: $(phase_list "$LOGS/$key.restore.out")"
done
SHARED_MIB=$(awk -v b="${R[staging,shared_size]:-0}" 'BEGIN { printf "%.0f", b / 1048576 }')
LINE_DIRECT=$(path_line direct "Direct path (\`CUSNAP_SHIM_DIRECT_IO=on\`)")
LINE_STAGING=$(path_line staging "Staging path (\`CUSNAP_SHIM_DIRECT_IO=off\`)")

cat <<EOF
### Checkpoint of a job sharing device memory (\`bench/shared_checkpoint.sh\`), $MIB MiB

- Command: \`$CMDLINE\`
- Date: $DATE; machine: $MACHINE; $CPUS; checkpoints in ${DIR%/*}/ (${FS:-?})
- Pinned copy ceiling (\`cusnap-copy-bandwidth --mib $MIB --file-dir $DIR\`: $BW_DESC): D2H **$D2H GB/s**, H2D **$H2D GB/s**
- Host ceilings in the checkpoints' file system (${FS:-?}; the same run, $HOST_DESC): write into the page cache **$FILE_W GB/s**, read back from it **$FILE_R GB/s**; memcpy anonymous to anonymous memory **$MEMCPY GB/s**
- Shared save and load of the two-process job ($MIB MiB; ${SHARED_MIB} MiB in shared/*.bin), per copy path of the shim (GB/s: $MIB MiB / the phase's seconds, which hold the gate, drain and release too; "copies alone": the shim's own timing of its copies):
$LINE_DIRECT
$LINE_STAGING
- For comparison, the driver's own checkpoint of the one-process job: driver-checkpoint $(fmt3 "${DCK_S:-0}") s ($(gbps "$MIB" "${DCK_S:-0}") GB/s), driver-restore $(fmt3 "${DRS_S:-0}") s ($(gbps "$MIB" "${DRS_S:-0}") GB/s)

| job | checkpoint wall (s) | checkpoint phases (s) | restore command done (s) | restore to next count (s) | restore phases (s) | checkpoint + restore to next count (s) | checkpoint size |
| --- | --- | --- | --- | --- | --- | --- | --- |
| one process, $MIB MiB (\`cusnap-pattern-job\`) | ${R[one,ck_wall]} | ${R[one,ck_phases]} | ${R[one,restored]} | ${R[one,rs_count]} | ${R[one,rs_phases]} | ${R[one,total]} | $(mib "${R[one,size]}") |
| two processes sharing $MIB MiB (\`cusnap-share-job\`), staging path | ${R[staging,ck_wall]} | ${R[staging,ck_phases]} | ${R[staging,restored]} | ${R[staging,rs_count]} | ${R[staging,rs_phases]} | ${R[staging,total]} | $(mib "${R[staging,size]}") |
| two processes sharing $MIB MiB (\`cusnap-share-job\`), direct path | ${R[direct,ck_wall]:-failed} | ${R[direct,ck_phases]:-} | ${R[direct,restored]:-} | ${R[direct,rs_count]:-} | ${R[direct,rs_phases]:-} | ${R[direct,total]:-} | $(mib "${R[direct,size]:-0}") |

- Columns: "restore command done" is until \`cusnap restore\` printed its result (the restored job runs); "restore to next count" until every process of the restored job printed a count line (its first round after the restore verifies all $MIB MiB in each process); both jobs count every 20 ms.
- Checkpoint + restore end to end, two-process shared / one-process: staging **$(ratio "${R[staging,total]}" "${R[one,total]}")x** (${R[staging,total]} s / ${R[one,total]} s), direct **$(ratio "${R[direct,total]:-n/a}" "${R[one,total]}")x** (${R[direct,total]:-n/a} s)
EOF
exit 0
