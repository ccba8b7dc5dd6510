#!/usr/bin/env bash
# The cusnap demo: launches a job that keeps a pattern in GPU memory and
# counts, checkpoints it to disk, kills it, restores it from the checkpoint,
# and shows that it continued counting with its GPU memory intact.
# Uses the real GPU when a CUDA driver is present, the simulated one otherwise.
# Installs and builds what it needs (root: CRIU needs it).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

bash scripts/install-deps.sh
echo "== building cusnap (build/)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" >/dev/null

bin=$root/build/bin
work=$(mktemp -d /tmp/cusnap-demo.XXXXXX)
export CUSNAP_RUNTIME_BASE=$work/run
cleanup() {
  [ -n "${sup_pid:-}" ] && kill "$sup_pid" 2>/dev/null || true
  [ -n "${res_pid:-}" ] && kill "$res_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

if ldconfig -p 2>/dev/null | grep -q 'libcuda.so.1' && nvidia-smi -L >/dev/null 2>&1; then
  echo "== using the real GPU: $(nvidia-smi -L | head -n1)"
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
else
  echo "== no GPU here: using the simulated CUDA driver (build/fakecuda)"
  export LD_LIBRARY_PATH=$root/build/fakecuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

wait_for() {  # wait_for FILE REGEX SECONDS
  local i
  for ((i = 0; i < $3 * 10; i++)); do grep -qE "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "demo: timed out waiting for /$2/ in $1" >&2; cat "$1" >&2; return 1
}

echo "== cusnap launch --name demo -- cusnap-pattern-job --mib 256"
"$bin/cusnap" launch --name demo -- "$bin/cusnap-pattern-job" --mib 256 --interval-ms 100 >"$work/before.out" 2>&1 &
sup_pid=$!
wait_for "$work/before.out" 'count 20 ok' 30
"$bin/cusnap" ps
job_pid=$("$bin/cusnap" ps --json | python3 -c 'import json,sys; print([j for j in json.load(sys.stdin) if j["name"]=="demo"][0]["pid"])')

echo "== cusnap checkpoint demo -o $work/ckpt"
"$bin/cusnap" checkpoint demo -o "$work/ckpt"
wait "$sup_pid" || true; sup_pid=
last=$(grep -oE 'count [0-9]+ ok' "$work/before.out" | tail -n1 | awk '{print $2}')
echo "   the job was stopped after count $last; its GPU memory is in $work/ckpt:"
du -sh "$work/ckpt"
if kill -0 "$job_pid" 2>/dev/null; then echo "demo: job process $job_pid still runs after the checkpoint" >&2; exit 1; fi
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
echo "== cusnap checkpoint shared -o $work/ckpt-shared"
"$bin/cusnap" checkpoint shared -o "$work/ckpt-shared"
wait "$sup_pid" || true; sup_pid=
c_last=$(grep -oE '^count [0-9]+ ok' "$work/share-before.out" | tail -n1 | awk '{print $2}')
i_last=$(grep -oE '^importer count [0-9]+ ok' "$work/share-before.out" | tail -n1 | awk '{print $3}')
echo "   stopped at creator count $c_last, importer count $i_last; the shared bytes were saved once:"
ls -l "$work/ckpt-shared/shared" | tail -n +2 | sed 's/^/   /'
echo "== cusnap restore $work/ckpt-shared"
"$bin/cusnap" restore "$work/ckpt-shared" >"$work/share-after.out" 2>&1 &
res_pid=$!
wait_for "$work/share-after.out" "^importer count $((i_last + 5)) ok" 60
wait_for "$work/share-after.out" "^count $((c_last + 5)) ok" 60
c_first=$(grep -oE '^count [0-9]+ ok' "$work/share-after.out" | head -n1 | awk '{print $2}')
i_first=$(grep -oE '^importer count [0-9]+ ok' "$work/share-after.out" | head -n1 | awk '{print $3}')
grep -E 'count|seen' "$work/share-after.out" | head -n4 | sed 's/^/   job: /'
kill -TERM "$res_pid"; wait "$res_pid" || true; res_pid=
if [ "$c_first" -ne $((c_last + 1)) ] || [ "$i_first" -ne $((i_last + 1)) ]; then
  echo "== demo FAILED: the sharing job went on at $c_first/$i_first, not $((c_last + 1))/$((i_last + 1))" >&2
  exit 1
fi
echo "   both processes went on where they stopped, each still seeing the other's writes ('seen')"
echo "== demo passed: both jobs continued exactly where they were checkpointed"
