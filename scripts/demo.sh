#!/usr/bin/env bash
# The cusnap demo: launches a job that keeps a pattern in GPU memory and
# counts, checkpoints it to disk, kills it, restores it from the checkpoint,
# and shows that it continued counting with its GPU memory intact; then the
# same for two processes sharing device memory.
# Uses the real GPU when a CUDA driver is present, the simulated one otherwise.
# Installs and builds what it needs (root: CRIU needs it).
#   sudo bash scripts/demo.sh
#   CUSNAP_DEMO_SKIP_BUILD=1   neither install (scripts/install-deps.sh) nor
#                              build: use the build already in build/ (or in
#                              CUSNAP_BINARY_DIR, as the tests give it)
#   CUSNAP_CUDA_INCLUDE=DIR    the CUDA headers' directory, for install-deps.sh
#                              and the build (default /usr/local/cuda/include)
#   TMPDIR=DIR                 where the demo's checkpoints go (default /tmp)
set -euo pipefail
if [ "$(id -u)" != 0 ]; then
  echo "demo: must run as root (CRIU needs it, and it installs what it needs); try: sudo bash $0" >&2
  exit 1
fi
cd "$(dirname "$0")/.."
root=$PWD
build=$root/build

if [ "${CUSNAP_DEMO_SKIP_BUILD:-0}" = 1 ]; then
  build=${CUSNAP_BINARY_DIR:-$build}
  [ -x "$build/bin/cusnap" ] || { echo "demo: CUSNAP_DEMO_SKIP_BUILD=1 but $build/bin/cusnap is not built" >&2; exit 1; }
  echo "== using the existing build ($build)"
else
  bash scripts/install-deps.sh
  echo "== building cusnap (build/)"
  cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    ${CUSNAP_CUDA_INCLUDE:+"-DCUSNAP_CUDA_INCLUDE=$CUSNAP_CUDA_INCLUDE"} >/dev/null
  cmake --build build -j"$(nproc)" >/dev/null
fi

bin=$build/bin
work=$(mktemp -d "${TMPDIR:-/tmp}/cusnap-demo.XXXXXX")
export CUSNAP_RUNTIME_BASE=$work/run
# The job processes started here, each with the executable it runs: cleanup
# kills those still running that executable (one a checkpoint left alive),
# never a process that took a freed pid.
declare -A job_exe=()
exe_of() { local e; e=$(readlink "/proc/$1/exe" 2>/dev/null) || return 1; echo "${e% (deleted)}"; }
note_job() { local e; e=$(exe_of "$1") && job_exe[$1]=$e || true; }
cleanup() {
  local p
  [ -n "${sup_pid:-}" ] && kill "$sup_pid" 2>/dev/null || true
  [ -n "${res_pid:-}" ] && kill "$res_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  for p in "${!job_exe[@]}"; do
    [ "$(exe_of "$p" || true)" = "${job_exe[$p]}" ] && kill -9 "$p" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

if grep -q 'libcuda.so.1' <<<"$(ldconfig -p 2>/dev/null)" && nvidia-smi -L >/dev/null 2>&1; then
  echo "== using the real GPU: $(nvidia-smi -L | head -n1)"
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
else
  echo "== no GPU here: using the simulated CUDA driver ($build/fakecuda)"
  export LD_LIBRARY_PATH=$build/fakecuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

wait_for() {  # wait_for FILE REGEX SECONDS
  local i
  for ((i = 0; i < $3 * 10; i++)); do grep -qE "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "demo: timed out waiting for /$2/ in $1" >&2; cat "$1" >&2; return 1
}

# gone PID SECONDS: waits until process PID has ended.
gone() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  return 1
}

# last_seen FILE PREFIX: the last S of "PREFIXseen S" in FILE (0 if none). A
# process of cusnap-share-job prints "seen S" ("importer seen S"), S being the
# smallest counter value of its peer that it found in the shared bytes.
last_seen() {
  local n
  n=$(grep -E "^${2}seen [0-9]+$" "$1" 2>/dev/null | tail -n1 | awk '{print $NF}')
  echo "${n:-0}"
}

# wait_seen_past FILE PREFIX S SECONDS: waits until PREFIX's "seen" in FILE
# goes past S (its peer's writes after S reach the bytes it maps: the memory
# is still shared); fails with a message when it does not in time.
wait_seen_past() {
  local i
  for ((i = 0; i < $4 * 10; i++)); do
    [ "$(last_seen "$1" "$2")" -gt "$3" ] && return 0
    sleep 0.1
  done
  echo "== demo FAILED: the ${2:-creator }process no longer sees its peer's writes: its 'seen' is $(last_seen "$1" "$2") after $4 s, not past $3 (its value at the checkpoint; in $1)" >&2
  return 1
}

echo "== cusnap launch --name demo -- cusnap-pattern-job --mib 256"
"$bin/cusnap" launch --name demo -- "$bin/cusnap-pattern-job" --mib 256 --interval-ms 100 >"$work/before.out" 2>&1 &
sup_pid=$!
wait_for "$work/before.out" 'count 20 ok' 30
"$bin/cusnap" ps
job_pid=$("$bin/cusnap" ps --json | python3 -c 'import json,sys; print([j for j in json.load(sys.stdin) if j["name"]=="demo"][0]["pid"])')
note_job "$job_pid"

echo "== cusnap checkpoint demo -o $work/ckpt"
"$bin/cusnap" checkpoint demo -o "$work/ckpt"
wait "$sup_pid" || true; sup_pid=
last=$(grep -oE 'count [0-9]+ ok' "$work/before.out" | tail -n1 | awk '{print $2}')
echo "   the job was stopped after count $last; its GPU memory is in $work/ckpt:"
du -sh "$work/ckpt"
gone "$job_pid" 10 || { echo "demo: job process $job_pid still runs after the checkpoint" >&2; exit 1; }
echo "   its process $job_pid is gone"

echo "== cusnap restore $work/ckpt"
"$bin/cusnap" restore "$work/ckpt" >"$work/after.out" 2>&1 &
res_pid=$!
wait_for "$work/after.out" "count $((last + 10)) ok" 60
first=$(grep -oE 'count [0-9]+ ok' "$work/after.out" | head -n1 | awk '{print $2}')
echo "   restored: the job went on from count $first (stopped at $last), verifying all 256 MiB each step"
grep -E 'count' "$work/after.out" | head -n3 | sed 's/^/   job: /'
"$bin/cusnap" ps
kill -TERM "$res_pid"; wait "$res_pid" || true; res_pid=
if [ "$first" -ne $((last + 1)) ]; then
  echo "== demo FAILED: expected count $((last + 1)) after restore, got $first" >&2; exit 1
fi
echo "   the job continued exactly where it was checkpointed"

# Part 2: what the driver alone cannot do: two processes sharing device memory.
echo "== cusnap launch --name shared -- cusnap-share-job --mib 64 (a creator and an importer sharing 64 MiB)"
"$bin/cusnap" launch --name shared -- "$bin/cusnap-share-job" --mib 64 --interval-ms 100 >"$work/share-before.out" 2>&1 &
sup_pid=$!
wait_for "$work/share-before.out" '^importer count 10 ok' 30
share_pids=$(sed -n 's/^\(importer \)\{0,1\}ready pid \([0-9]*\)$/\2/p' "$work/share-before.out")
for p in $share_pids; do note_job "$p"; done
[ "$(echo "$share_pids" | wc -w)" = 2 ] ||
  { echo "demo: expected 2 processes of the sharing job ready, got: $share_pids" >&2; exit 1; }
echo "== cusnap checkpoint shared -o $work/ckpt-shared"
"$bin/cusnap" checkpoint shared -o "$work/ckpt-shared"
wait "$sup_pid" || true; sup_pid=
for p in $share_pids; do
  gone "$p" 10 || { echo "demo: job process $p still runs after the checkpoint" >&2; exit 1; }
done
c_last=$(grep -oE '^count [0-9]+ ok' "$work/share-before.out" | tail -n1 | awk '{print $2}')
i_last=$(grep -oE '^importer count [0-9]+ ok' "$work/share-before.out" | tail -n1 | awk '{print $3}')
c_seen=$(last_seen "$work/share-before.out" "")
i_seen=$(last_seen "$work/share-before.out" "importer ")
echo "   stopped at creator count $c_last (seen $c_seen), importer count $i_last (seen $i_seen); the shared bytes were saved once:"
ls -l "$work/ckpt-shared/shared" | tail -n +2 | sed 's/^/   /'
echo "== cusnap restore $work/ckpt-shared"
"$bin/cusnap" restore "$work/ckpt-shared" >"$work/share-after.out" 2>&1 &
res_pid=$!
wait_for "$work/share-after.out" "^importer count $((i_last + 5)) ok" 60
wait_for "$work/share-after.out" "^count $((c_last + 5)) ok" 60
# Sharing is proven only by each process's 'seen' growing past its value at
# the checkpoint: the peer's new writes land in the bytes it maps.
wait_seen_past "$work/share-after.out" "" "$c_seen" 30 || exit 1
wait_seen_past "$work/share-after.out" "importer " "$i_seen" 30 || exit 1
c_first=$(grep -oE '^count [0-9]+ ok' "$work/share-after.out" | head -n1 | awk '{print $2}')
i_first=$(grep -oE '^importer count [0-9]+ ok' "$work/share-after.out" | head -n1 | awk '{print $3}')
grep -E 'count|seen' "$work/share-after.out" | head -n4 | sed 's/^/   job: /'
c_seen_now=$(last_seen "$work/share-after.out" "")
i_seen_now=$(last_seen "$work/share-after.out" "importer ")
kill -TERM "$res_pid"; wait "$res_pid" || true; res_pid=
if [ "$c_first" -ne $((c_last + 1)) ] || [ "$i_first" -ne $((i_last + 1)) ]; then
  echo "== demo FAILED: the sharing job went on at $c_first/$i_first, not $((c_last + 1))/$((i_last + 1))" >&2
  exit 1
fi
echo "   both processes went on where they stopped, each still seeing the other's writes"
echo "   ('seen': creator $c_seen at the checkpoint, $c_seen_now now; importer $i_seen, now $i_seen_now)"
echo "== demo passed: both jobs continued exactly where they were checkpointed"
