#!/usr/bin/env bash
# Checkpoint and restore against the real CUDA driver, on a machine with an
# NVIDIA GPU, as root, with CRIU >= 4.1 (see ../shared/GPU.md; scripts/
# gpu-bundle.sh prepares CRIU and a release build to carry there):
#
#   PATH=$PWD/.gpu-bundle/bin:$PATH LD_LIBRARY_PATH=$PWD/.gpu-bundle/lib \
#     bash scripts/gpu-test.sh
#
# 1. The end-to-end checkpoint scenarios of CI (tests/e2e/checkpoint_*.sh)
#    with the real driver: checkpoint/stop/restore twice, --leave-running,
#    suspend/resume, two processes with private memory, the refusals, a
#    corrupted checkpoint, a failing CRIU dump rolled back. Parts that need
#    the simulated driver (its fault injection, its allocation names) say so
#    and are skipped.
# 2. Timing: a pattern job holding 4 GiB and one holding 16 GiB are
#    checkpointed (and stopped), restored, and must continue counting with
#    every byte verified; the time of each phase is printed in a table.
#
# Exits 77 (skipped) with the reason when there is no GPU, no real driver,
# no CRIU >= 4.1, or not root. Environment: CUSNAP_BINARY_DIR (default: the
# bundle's build, else build-gpu, else build), CUSNAP_GPU_TEST_DIR (where
# checkpoints are written; default a directory under /var/tmp, on disk),
# CUSNAP_GPU_TEST_SIZES (MiB, default "4096 16384").
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

skip() { echo "gpu-test: SKIP: $*"; exit 77; }
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }

# Never multicast on lent GPU machines (GPU.md, "Safety rule").
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

[ "$(id -u)" = 0 ] || skip "needs root (CRIU and the driver's checkpoint API)"
command -v nvidia-smi >/dev/null || skip "no nvidia-smi: no NVIDIA driver on this machine"
nvidia-smi -L 2>/dev/null | grep -q '^GPU ' || skip "nvidia-smi lists no GPU"
# The simulated driver must not be on the loader path.
if [ -n "${LD_LIBRARY_PATH:-}" ]; then
  LD_LIBRARY_PATH=$(echo "$LD_LIBRARY_PATH" | tr ':' '\n' | grep -v fakecuda | paste -sd: -)
  export LD_LIBRARY_PATH
fi
unset CUSNAP_LIBCUDA CUSNAP_FAKECUDA_DIR
REAL_LIBCUDA=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}')
for d in ${LD_LIBRARY_PATH//:/ } /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu; do
  [ -z "$REAL_LIBCUDA" ] && [ -e "$d/libcuda.so.1" ] && REAL_LIBCUDA=$d/libcuda.so.1
done
[ -n "$REAL_LIBCUDA" ] || skip "no libcuda.so.1 of the real driver on the loader path"
CRIU=${CUSNAP_CRIU:-$(PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin command -v criu || true)}
[ -n "$CRIU" ] || skip "CRIU is not installed (scripts/gpu-bundle.sh carries it)"
CRIU_VERSION=$("$CRIU" --version 2>/dev/null | awk '/^Version:/{print $2}')
case "$CRIU_VERSION" in
  [4-9].[1-9]* | [4-9].[1-9][0-9]* | [5-9].*) ;;
  *) skip "CRIU at $CRIU is version '${CRIU_VERSION:-unknown}'; 4.1 or newer is needed" ;;
esac

if [ -z "${CUSNAP_BINARY_DIR:-}" ]; then
  for b in "$ROOT/.gpu-bundle/build" "$ROOT/build-gpu" "$ROOT/build"; do
    [ -x "$b/bin/cusnap" ] && { CUSNAP_BINARY_DIR=$b; break; }
  done
fi
[ -n "${CUSNAP_BINARY_DIR:-}" ] && [ -x "$CUSNAP_BINARY_DIR/bin/cusnap" ] ||
  { echo "gpu-test: no build with bin/cusnap: set CUSNAP_BINARY_DIR or run scripts/gpu-bundle.sh"; exit 1; }
export CUSNAP_BINARY_DIR CUSNAP_REAL_DRIVER=1 CUSNAP_SOURCE_DIR=$ROOT
BIN=$CUSNAP_BINARY_DIR/bin

echo "gpu-test: driver $REAL_LIBCUDA, CRIU $CRIU_VERSION ($CRIU), build $CUSNAP_BINARY_DIR"
nvidia-smi --query-gpu=index,name,uuid,memory.total,driver_version --format=csv,noheader

# 1. The CI scenarios against the real driver.
failed=()
for t in "$ROOT"/tests/e2e/checkpoint_*.sh; do
  name=$(basename "$t" .sh)
  start=$(date +%s.%N)
  rc=0
  timeout 600 bash "$t" >"/tmp/gpu-test-$name.log" 2>&1 || rc=$?
  secs=$(since "$start")
  case $rc in
    0) printf 'PASS %-32s %6.1f s\n' "$name" "$secs" ;;
    77) printf 'SKIP %-32s %s\n' "$name" "$(grep SKIP "/tmp/gpu-test-$name.log" | head -1)" ;;
    *) printf 'FAIL %-32s (exit %d)\n' "$name" "$rc"; sed 's/^/    /' "/tmp/gpu-test-$name.log" | tail -25
       failed+=("$name") ;;
  esac
  grep '^note:' "/tmp/gpu-test-$name.log" | sed 's/^/    /' || true
done

# 2. Timing with large device memory.
WORK=${CUSNAP_GPU_TEST_DIR:-/var/tmp/cusnap-gpu-test}
rm -rf "$WORK"
mkdir -p "$WORK"
export CUSNAP_RUNTIME_BASE=$WORK/run TMPDIR=$WORK
SUPERVISORS=()
cleanup() {
  for p in "${SUPERVISORS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 0.5
  for p in "${SUPERVISORS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

last_count() { grep -E '^count [0-9]+ ok$' "$1" 2>/dev/null | tail -1 | awk '{print $2}'; }
wait_count() {  # FILE N SECONDS
  for _ in $(seq 1 $(($3 * 10))); do
    [ "$(last_count "$1")" -ge "$2" ] 2>/dev/null && return 0
    grep -q 'pattern mismatch\|failed:' "$1" && return 1
    sleep 0.1
  done
  return 1
}
phases() {  # JSON-FILE: "name seconds" lines from any "phases" array in it
  python3 - "$1" <<'PY'
import json, sys
def walk(x):
    if isinstance(x, dict):
        for k, v in x.items():
            if k == "phases" and isinstance(v, list):
                for p in v: print(p["name"], "%.2f" % p["seconds"])
            else: walk(v)
    elif isinstance(x, list):
        for v in x: walk(v)
try: walk(json.load(open(sys.argv[1])))
except Exception as e: print("unparsed", 0)
PY
}

declare -A TABLE
sizes=${CUSNAP_GPU_TEST_SIZES:-4096 16384}
for mib in $sizes; do
  name=t$mib
  echo "gpu-test: timing a job holding $mib MiB"
  "$BIN/cusnap" launch --name "$name" -- "$BIN/cusnap-pattern-job" --mib "$mib" --interval-ms 100 \
    >"$WORK/$name.out" 2>&1 &
  SUPERVISORS+=($!)
  sup=$!
  if ! wait_count "$WORK/$name.out" 2 300; then
    echo "FAIL timing $mib MiB: the job did not start counting"; tail -5 "$WORK/$name.out"
    failed+=("timing-$mib"); kill -9 "$sup" 2>/dev/null || true; continue
  fi
  pid=$(grep -m1 '^ready pid' "$WORK/$name.out" | awk '{print $3}')
  t0=$(date +%s.%N)
  if ! "$BIN/cusnap" checkpoint "$name" -o "$WORK/$name.ckpt" --timeout 600 --json >"$WORK/$name.ckpt.json" 2>&1; then
    echo "FAIL timing $mib MiB: checkpoint failed"; cat "$WORK/$name.ckpt.json"
    failed+=("timing-$mib"); kill -9 "$sup" 2>/dev/null || true; continue
  fi
  TABLE[$mib,checkpoint_wall]=$(since "$t0")
  wait "$sup" || true
  for _ in $(seq 1 200); do [ -e "/proc/$pid" ] || break; sleep 0.05; done
  last=$(last_count "$WORK/$name.out")
  TABLE[$mib,size]=$(du -sb "$WORK/$name.ckpt" | awk '{print $1}')
  t0=$(date +%s.%N)
  if ! "$BIN/cusnap" restore "$WORK/$name.ckpt" --detach --timeout 600 --json >"$WORK/$name.restore.json" 2>&1; then
    echo "FAIL timing $mib MiB: restore failed"; cat "$WORK/$name.restore.json"
    failed+=("timing-$mib"); continue
  fi
  TABLE[$mib,restore_wall]=$(since "$t0")
  # Detached: the job's output goes to its log in the runtime directory.
  log=$(ls "$CUSNAP_RUNTIME_BASE/$name"/*.log 2>/dev/null | head -1 || true)
  ok=0
  if [ -n "$log" ] && wait_count "$log" $((last + 2)) 300; then ok=1; fi
  if [ $ok = 1 ]; then
    echo "  restored; counting on from $last with all $mib MiB verified each round"
  else
    echo "FAIL timing $mib MiB: the restored job did not count on past $last"
    [ -n "$log" ] && tail -5 "$log"
    failed+=("timing-$mib")
  fi
  echo "  checkpoint phases:"; phases "$WORK/$name.ckpt.json" | sed 's/^/    /'
  echo "  restore phases:"; phases "$WORK/$name.restore.json" | sed 's/^/    /'
  printf '  checkpoint %.1f s, restore %.1f s (wall, including the client), checkpoint size %.2f GiB\n' \
    "${TABLE[$mib,checkpoint_wall]}" "${TABLE[$mib,restore_wall]}" \
    "$(awk -v b="${TABLE[$mib,size]}" 'BEGIN { print b / 1073741824 }')"
  rpid=$(CUSNAP_RUNTIME_BASE=$CUSNAP_RUNTIME_BASE "$BIN/cusnap" ps --json | python3 -c '
import json, sys
for j in json.load(sys.stdin):
    if j["name"] == sys.argv[1]: print(j.get("supervisor_pid", ""))' "$name" || true)
  [ -n "$rpid" ] && kill -TERM "$rpid" 2>/dev/null || true
  for _ in $(seq 1 200); do [ -e "/proc/$pid" ] || break; sleep 0.05; done
  rm -rf "$WORK/$name.ckpt"
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu-test: FAILED: ${failed[*]}"
  exit 1
fi
echo "gpu-test: PASS"
