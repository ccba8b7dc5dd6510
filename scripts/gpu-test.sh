#!/usr/bin/env bash
# Checkpoint and restore against the real CUDA driver, on a machine with an
# NVIDIA GPU, as root, with CRIU >= 4.1 and an NVIDIA driver >= 570 (scripts/
# gpu-bundle.sh prepares CRIU and a release build to carry there):
#
#   PATH=$PWD/.gpu-bundle/bin:$PATH LD_LIBRARY_PATH=$PWD/.gpu-bundle/lib \
#     bash scripts/gpu-test.sh [SCENARIO...]
#
# Scenarios (all of them, in this order, when none is named; --list lists them):
#   e2e          The end-to-end checkpoint scenarios of CI (tests/e2e/
#                checkpoint_*.sh) with the real driver: checkpoint/stop/restore
#                twice, --leave-running, suspend/resume, two processes with
#                private memory, the refusals, a corrupted checkpoint, a failing
#                CRIU dump rolled back, a checkpoint cancelled (Ctrl-C) during
#                its CRIU dump; and reliability_guardian_long_argv (a
#                job with 190 KiB of arguments keeps an executed guardian
#                through a restore), and restore_taken (a thread id taken, two
#                restores at once, the old name of a job restored under
#                another, the job's working directory gone), and
#                restore_interrupted (Ctrl-C before CRIU: nothing restored),
#                and reliability_restore_killed (a restore killed while CRIU
#                runs: its watch ends the restored process), and
#                suspend_state_follows_driver (a job suspended or resumed by
#                another program through the driver's API). Parts that need
#                the simulated driver (its
#                fault injection, its allocation names) say so and are skipped.
#                On the real driver it takes about ten minutes: e2e-checkpoint
#                (checkpoint_*.sh) and e2e-recovery (the rest) run its two
#                halves, each within one 600 s call of a lent GPU machine.
#   timing       A pattern job holding 4 GiB and one holding 16 GiB are
#                checkpointed (and stopped), restored, and must continue counting
#                with every byte verified; the time of each phase is printed.
#   shared-posix cusnap-share-job: a parent exports a POSIX-fd VMM allocation to
#                its forked child. Checkpoint (stops it), restore (detached):
#                both processes must count on past their last count; then, on a
#                fresh launch, suspend (counts stand still) and resume (they go on).
#   pinned-host  cusnap-hostmem-job --kind alloc, then --kind register: a thread
#                writes pinned host memory (cuMemHostAlloc, cuMemHostRegister)
#                all the time, with no driver call, as NCCL's proxy thread does
#                with its buffers; the job checks that nothing else changed it.
#                Checkpoint/restore, then suspend/resume, as for shared-posix.
#                Then tests/gpu/torch_hostmem.py (both kinds): kernels that
#                increment pinned host memory in place, checked by the host.
#   shared-ipc   The same with cusnap-ipc-pair (legacy CUDA IPC); skipped when
#                that workload is not built.
#   torch-share-default, torch-share-expandable
#                tests/gpu/torch_share.py: PyTorch shares a CUDA tensor with a
#                spawned worker (legacy IPC with the default allocator, POSIX-fd
#                VMM with expandable_segments:True). First run without cusnap
#                (the workload's own check; skipped when torch cannot share on
#                this machine), then checkpoint/stop/restore under cusnap: main
#                and worker must both count on; then suspend and resume a fresh
#                launch.
#   torch-share-capture
#                torch_share.py --alloc expandable --capture-ms 200: the worker
#                records a CUDA graph for 200 ms after each step, so the
#                checkpoint mostly finds a capture under way; it must wait for
#                one to end (capture_retries in its report) and never invalidate
#                one (the worker checks every graph), then restore as above;
#                then suspend and resume a fresh launch, which waits the same way.
#   e2e-shared   The end-to-end scenarios of jobs that share device memory
#                (tests/e2e/shared_*.sh) with the real driver.
#   restore-memory-check
#                tests/e2e/restore_memory_check.sh with the real driver: a 4 GiB
#                job, a PyTorch hog leaving 1 GiB free; resume, restore and a
#                roll back are not tried while the memory is taken (exit 3, 3
#                and 6; a resume of the rolled-back job, 3), the job kept, and
#                come back once the hog is gone; the control with the check
#                off loses the job (OUT_OF_MEMORY, exit 6, then 304); a job that ran with 16 MiB free (a filler started
#                after it) resumes and restores beside the filler. Device-map
#                cases with two GPUs.
#   torch-share-noshim
#                Negative control: torch_share.py (default allocator) under
#                `cusnap launch --no-shim`, so only the bare driver sees the
#                sharing; its checkpoint or restore is expected to fail (the
#                driver cannot restore an importer, GPU.md). Reported as PASS when
#                it fails as expected, NOTE when it unexpectedly restores.
#   nccl-torchrun
#                Two GPUs: `cusnap launch -- env USE_LIBUV=0 python -m
#                torch.distributed.run --standalone --rdzv-conf use_libuv=0
#                --nproc-per-node 2 tests/gpu/torch_allreduce.py` (PyTorch's
#                libuv store holds an io_uring instance CRIU cannot dump), an
#                NCCL all-reduce loop that checks every result, no sleep between
#                steps. CUSNAP_GPU_TEST_NCCL_CYCLES (default 10) consecutive
#                cycles of checkpoint to disk (stops the job), restore --detach;
#                each rank must go on at exactly its next step, every result
#                right. Prints each cycle's times, phases and sizes.
#   nccl-torchrun-devmap
#                The same (CUSNAP_GPU_TEST_NCCL_CYCLES cycles), each restore
#                with --device-map 0=1,1=0: every rank must come back on the
#                other GPU (nvidia-smi).
#   nccl-torchrun-expandable
#                The same (CUSNAP_GPU_TEST_NCCL_CYCLES cycles), with
#                PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.
#                SKIP for all three with fewer than two GPUs. Extra environment
#                for the job: CUSNAP_GPU_TEST_NCCL_ENV ("VAR=VALUE ...").
#   nccl-torchrun-1rank
#                The nccl-torchrun job with one rank (one GPU): torchrun's agent
#                and store, NCCL's threads and sockets (RAS listener, proxy),
#                CUSNAP_GPU_TEST_NCCL_CYCLES cycles.
#   nccl-1proc-2gpu
#                Two GPUs driven by one process (single-process multi-GPU NCCL):
#                one torchrun rank with torch_allreduce.py --local-gpus 2, which
#                all-reduces a tensor on each GPU every step through
#                torch.cuda.nccl (one collective kernel per GPU), every result
#                checked; CUSNAP_GPU_TEST_NCCL_CYCLES cycles. The cut must line
#                the process's two GPUs up (docs/design.md: counts per GPU): each
#                checkpoint must make one, at about the step reached (counted
#                per process it would be twice that). The two kernels of a step
#                are launched microseconds apart, so a cut between them is rare
#                either way: e2e.nccl_cut_multi makes it certain.
#                SKIP with fewer than two GPUs.
#   nccl-torchrun-1rank-rollback
#                The one-rank job with torch_allreduce.py --store-every 1 (a
#                round trip to torchrun's store over TCP every step). Its CRIU
#                (CUSNAP_CRIU, a wrapper) is held at post-dump past the
#                checkpoint's --timeout 5 and killed: the checkpoint must exit 1,
#                saying the job runs on and that CRIU's network lock was lifted
#                (nftables table removed, sockets out of repair mode); the rank
#                must step on 20 more times with its store answering; then a
#                checkpoint and restore must work as usual.
#   nccl-torchrun-1rank-guardian
#                The same job; its CRIU is held at post-dump and its supervisor
#                killed (SIGKILL): the checkpoint must fail, the guardian must
#                kill CRIU (CUSNAP_GUARDIAN_CRIU_WAIT_MS=5000), restore the
#                driver state, lift CRIU's network lock and supervise the job;
#                the rank must step on 20 more times with its store answering;
#                then a checkpoint and restore through the guardian must work.
#   nccl-torchrun-1gpu
#                Two NCCL ranks on one GPU (torch_allreduce.py --share-gpu: each
#                rank presents itself as its own host, so NCCL connects them
#                through its network transport, TCP sockets and proxy threads).
#                After the driver's restore such ranks' kernels fail (restored
#                contexts are not time-sliced while a collective waits: Xid
#                109), so checkpoint and suspend must be refused (exit 3) and
#                the job run on. Then a control with
#                CUSNAP_ALLOW_RANKS_SHARING_GPU=1: checkpoint and restore,
#                expected to fail after the restore (NOTE when it runs on).
#   nccl-torchrun-graph
#                The nccl-torchrun job replaying its all-reduces from a CUDA
#                graph (torch_allreduce.py --graph 2: two collectives per
#                cuGraphLaunch, none launched directly), CUSNAP_GPU_TEST_NCCL_CYCLES
#                cycles; SKIP with fewer than two GPUs.
#   nccl-torchrun-1rank-graph
#                The same with one rank, three cycles.
#   nccl-torchrun-1gpu-graph
#                The cut for graph-launched collectives on real GPUs: two ranks
#                on one GPU (as nccl-torchrun-1gpu) replaying two all-reduces per
#                graph launch, with CUSNAP_ALLOW_RANKS_SHARING_GPU=1: checkpoint
#                to disk (stops the job; no restore, which the driver cannot do
#                for such ranks) must line both ranks up at one count that
#                grew by the graph's collectives. Control: the same with the
#                shim's counting off (CUSNAP_COLLECTIVE_KERNELS names no kernel),
#                expected to fail in the drain and roll back (NOTE when it
#                drains by luck).
#   torchrun-gloo
#                The same loop with two ranks on the gloo backend (CPU tensors,
#                no CUDA): torchrun's processes, rendezvous store and the TCP
#                connections between the ranks, five cycles.
#   killed-in-driver-phase
#                A pattern job of CUSNAP_GPU_TEST_KILL_MIB (default 16384) MiB
#                killed (SIGKILL) CUSNAP_GPU_TEST_KILL_AFTER (default 1) s into
#                a suspend, then into a checkpoint, while the driver holds it:
#                the command must exit 1 saying the job ended (never 6, never
#                "run cusnap resume"), the supervisor exit 137, and the GPU hold
#                nothing of the job.
# The shared-* and torch-* jobs' checkpoint, restore, suspend and resume get
# --timeout CUSNAP_GPU_TEST_SHARE_TIMEOUT (default 120 s a phase) and the
# client is killed after 2.5 times that (e2e-shared: each test).
# Every checkpoint/restore scenario prints the wall time of checkpoint and
# restore and their phases (from --json).
#
# Exits 77 (skipped) with the reason when there is no GPU, no real driver,
# no CRIU >= 4.1, or not root; 2 for an unknown scenario. Environment:
# CUSNAP_BINARY_DIR (default: the bundle's build, else build-gpu, else build),
# CUSNAP_GPU_TEST_DIR (where checkpoints are written; default a directory under
# /var/tmp, on disk), CUSNAP_GPU_TEST_SIZES (timing, MiB, default "4096 16384"),
# CUSNAP_GPU_TEST_SHARE_MIB (shared-*, default 64), CUSNAP_GPU_TEST_TORCH_MIB
# (torch-*, default 64), CUSNAP_GPU_TEST_KEEP=1 (keep that directory, with the
# logs, JSON reports and the checkpoint of a failed cycle), CUSNAP_GPU_TEST_IPC_ARGS (arguments of cusnap-ipc-pair,
# default "--mib 64 --interval-ms 100"), CUSNAP_PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

SCENARIOS_ALL=(e2e timing shared-posix pinned-host shared-ipc torch-share-default torch-share-expandable
  torch-share-capture
  e2e-shared torch-share-noshim nccl-torchrun nccl-torchrun-devmap nccl-torchrun-expandable
  nccl-torchrun-1rank nccl-1proc-2gpu nccl-torchrun-1rank-rollback nccl-torchrun-1rank-guardian nccl-torchrun-1gpu torchrun-gloo nccl-torchrun-graph nccl-torchrun-1rank-graph
  nccl-torchrun-1gpu-graph restore-memory-check killed-in-driver-phase)
SELECTED=()
for a in "$@"; do
  case $a in
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --list) printf '%s\n' "${SCENARIOS_ALL[@]}"; exit 0 ;;
    all) SELECTED+=("${SCENARIOS_ALL[@]}") ;;
    e2e-checkpoint | e2e-recovery) SELECTED+=("$a") ;;  # e2e's two halves
    *) if [[ " ${SCENARIOS_ALL[*]} " == *" $a "* ]]; then SELECTED+=("$a"); else
         echo "gpu-test: unknown scenario '$a'; known: ${SCENARIOS_ALL[*]}" >&2; exit 2
       fi ;;
  esac
done
[ ${#SELECTED[@]} -gt 0 ] || SELECTED=("${SCENARIOS_ALL[@]}")

skip() { echo "gpu-test: SKIP: $*"; exit 77; }
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }

# Never multicast on lent GPU machines (GPU.md, "Safety rule").
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

[ "$(id -u)" = 0 ] || skip "needs root (CRIU and the driver's checkpoint API)"
command -v nvidia-smi >/dev/null || skip "no nvidia-smi: no NVIDIA driver on this machine"
grep -q '^GPU ' <<<"$(nvidia-smi -L 2>/dev/null)" || skip "nvidia-smi lists no GPU"
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

echo "gpu-test: scenarios: ${SELECTED[*]}"

failed=()
SUMMARY=()
PHASE_TIMEOUT=${CUSNAP_GPU_TEST_SHARE_TIMEOUT:-120}
CLIENT_TIMEOUT=$((PHASE_TIMEOUT * 5 / 2))

WORK=${CUSNAP_GPU_TEST_DIR:-/var/tmp/cusnap-gpu-test}
rm -rf "$WORK"
mkdir -p "$WORK"
export CUSNAP_RUNTIME_BASE=$WORK/run TMPDIR=$WORK
SUPERVISORS=()
JOB_SIDS=()  # root pids of the jobs started here: each leads its own session

# job_rows: "NAME PID SUPERVISOR_PID" of every job under this run's runtime base.
job_rows() {
  "$BIN/cusnap" ps --json 2>/dev/null | python3 -c '
import json, sys
try:
    for j in json.load(sys.stdin): print(j["name"], j.get("pid", ""), j.get("supervisor_pid", ""))
except Exception: pass' || true
}
source "$ROOT/scripts/lib-session.sh"  # session_pids, wait_pids_gone
cleanup() {
  set +e
  local row p sid
  # Detached restores: their supervisors are not children of this script.
  while read -r row; do
    [ -n "$row" ] || continue
    p=$(echo "$row" | awk '{print $3}')
    [ -n "$p" ] && kill -TERM "$p" 2>/dev/null
  done < <(job_rows)
  for p in "${SUPERVISORS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 0.5
  for p in "${SUPERVISORS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for sid in "${JOB_SIDS[@]}"; do
    for p in $(session_pids "$sid"); do kill -9 "$p" 2>/dev/null; done
  done
  if [ "${CUSNAP_GPU_TEST_KEEP:-0}" = 1 ]; then echo "gpu-test: kept $WORK"; else rm -rf "$WORK"; fi
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

# 1. The CI scenarios against the real driver.
run_e2e() {  # GLOB-PREFIX SECONDS: tests/e2e/PREFIX*.sh, each under a timeout
  local t name start rc secs
  for t in "$ROOT"/tests/e2e/"$1"*.sh; do
    name=$(basename "$t" .sh)
    start=$(date +%s.%N)
    rc=0
    timeout "$2" bash "$t" >"/tmp/gpu-test-$name.log" 2>&1 || rc=$?
    secs=$(since "$start")
    case $rc in
      0) printf 'PASS %-32s %6.1f s\n' "$name" "$secs" ;;
      77) printf 'SKIP %-32s %s\n' "$name" "$(grep SKIP "/tmp/gpu-test-$name.log" | head -1)" ;;
      *) printf 'FAIL %-32s (exit %d)\n' "$name" "$rc"
         # Each case's verdict first (the tail is mostly the test's cleanup).
         grep -E '^(ok|FAIL):' "/tmp/gpu-test-$name.log" | sed 's/^/    /' | cut -c1-600 | tail -20
         sed 's/^/    /' "/tmp/gpu-test-$name.log" | tail -25
         failed+=("$name") ;;
    esac
    grep '^note:' "/tmp/gpu-test-$name.log" | sed 's/^/    /' || true
  done
}
scenario_e2e_checkpoint() { run_e2e checkpoint_ 600; }
scenario_e2e_recovery() {
  run_e2e reliability_guardian_long_argv 600
  run_e2e restore_taken 600
  run_e2e restore_interrupted 600
  run_e2e reliability_restore_killed 600
  run_e2e suspend_state_follows_driver 600
}
scenario_e2e() {
  scenario_e2e_checkpoint
  scenario_e2e_recovery
}
scenario_e2e_shared() { run_e2e shared_ "$CLIENT_TIMEOUT"; }
scenario_restore_memory_check() { run_e2e restore_memory_check 600; }

# 2. Timing with large device memory.
declare -A TABLE
scenario_timing() {
  local sizes mib name sup pid t0 last log ok rpid
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
}

# 3. Jobs whose processes share device memory. Each process of such a job
# prints "[LABEL ]count N ok" lines (LABEL: "importer", "worker", "main", ...);
# the checks below follow every label found in a job's output.

# counts FILE [first|last]: "LABEL N" for each process label in FILE (the words
# before "count", joined by '_'; "-" when none) with its first or last count.
counts() {
  awk -v mode="${2:-last}" '
    NF >= 3 && $NF == "ok" && $(NF-2) == "count" && $(NF-1) ~ /^[0-9]+$/ {
      l = ""; for (i = 1; i < NF - 2; i++) l = l (l == "" ? "" : "_") $i
      if (l == "") l = "-"
      if (!(l in first)) first[l] = $(NF-1)
      last[l] = $(NF-1)
    }
    END { for (l in last) print l, (mode == "first" ? first[l] : last[l]) }' "$1" 2>/dev/null | sort
  return 0
}
# count_of FILE LABEL [first|last]: that label's count (0 when it has none).
count_of() {
  local n
  n=$(counts "$1" "${3:-last}" | awk -v l="$2" '$1 == l {print $2}')
  echo "${n:-0}"
}
# seens FILE: "LABEL S" for each label's last "[LABEL ]seen S" line: the
# smallest counter of its peers that the process found in the shared bytes.
seens() {
  awk 'NF >= 2 && $(NF-1) == "seen" && $NF ~ /^[0-9]+$/ {
      l = ""; for (i = 1; i < NF - 1; i++) l = l (l == "" ? "" : "_") $i
      if (l == "") l = "-"
      last[l] = $NF
    }
    END { for (l in last) print l, last[l] }' "$1" 2>/dev/null | sort
  return 0
}
# wait_seen_past FILE SECONDS BEFORE: until every label of BEFORE ("LABEL S"
# lines) sees more than S in FILE: its peers' writes reach it again.
wait_seen_past() {
  local file=$1 secs=$2 before=$3 l s now ok
  [ -n "$before" ] || return 0
  for _ in $(seq 1 $((secs * 10))); do
    ok=1
    while read -r l s; do
      now=$(seens "$file" | awk -v l="$l" '$1 == l {print $2}')
      [ "${now:-0}" -gt "$s" ] || ok=0
    done <<<"$before"
    [ $ok = 1 ] && return 0
    sleep 0.1
  done
  WHY="peers' writes not seen any more: before $(echo "$before" | tr '\n' ' ')-> now $(seens "$file" | tr '\n' ' ')"
  return 1
}
# A wrong byte or a failing call, as the workloads report them.
ERROR_RE='MISMATCH|mismatch|, expected|failed|Traceback|[A-Za-z]Error|ERROR|ended|open gave'
# NCCL's own INFO lines (NCCL_DEBUG=INFO) speak of failed probes that are not errors.
error_lines() { grep -E "$ERROR_RE" "$1" 2>/dev/null | grep -v ' NCCL INFO ' | head -5; }

# wait_labels FILE SECONDS NPROC: until FILE shows counts of NPROC labels, each >= 2.
# wait_past FILE SECONDS "LABEL N" ...: until each LABEL's last count >= N.
# Both fail early on an error line; WHY says what went wrong.
WHY=
wait_labels() {
  local file=$1 secs=$2 nproc=$3
  for _ in $(seq 1 $((secs * 10))); do
    [ "$(counts "$file" | awk '$2 >= 2' | wc -l)" -ge "$nproc" ] && return 0
    if [ -n "$(error_lines "$file")" ]; then WHY="error: $(error_lines "$file" | head -1)"; return 1; fi
    sleep 0.1
  done
  WHY="fewer than $nproc processes counting after $secs s: $(counts "$file" | tr '\n' ' ')"
  return 1
}
wait_past() {
  local file=$1 secs=$2 spec l n done_all
  shift 2
  for _ in $(seq 1 $((secs * 10))); do
    done_all=1
    for spec in "$@"; do
      read -r l n <<<"$spec"
      [ "$(count_of "$file" "$l")" -ge "$n" ] || { done_all=0; break; }
    done
    [ $done_all = 1 ] && return 0
    if [ -n "$(error_lines "$file")" ]; then WHY="error: $(error_lines "$file" | head -1)"; return 1; fi
    sleep 0.1
  done
  WHY="not all processes reached their target in $secs s: now $(counts "$file" | tr '\n' ' ')"
  return 1
}
# wait_beyond FILE SECONDS K COUNTS: wait_past with each "LABEL N" line of
# COUNTS (as counts prints them) as the target "LABEL N+K".
wait_beyond() {
  local file=$1 secs=$2 k=$3 l n targets=()
  while read -r l n; do [ -n "$l" ] && targets+=("$l $((n + k))"); done <<<"$4"
  # No count to go beyond would pass without looking.
  if [ ${#targets[@]} = 0 ]; then WHY="no counts were seen before"; return 1; fi
  wait_past "$file" "$secs" "${targets[@]}"
}
job_field() {  # NAME FIELD (empty when the job is not listed)
  "$BIN/cusnap" ps --json 2>/dev/null | python3 -c '
import json, sys
try:
    for j in json.load(sys.stdin):
        if j["name"] == sys.argv[1]: print(j.get(sys.argv[2], ""))
except Exception: pass' "$1" "$2" || true
}
json_field() {  # FILE FIELD: a top-level field of the first JSON object in FILE
  python3 - "$1" "$2" <<'PY' || true
import json, sys
text = open(sys.argv[1]).read()
try:
    obj, _ = json.JSONDecoder().raw_decode(text[text.index("{"):])
    print(obj.get(sys.argv[2], ""))
except Exception:
    pass
PY
}
# stop_job NAME SID: TERM the job's supervisor (it forwards the signal to the
# job), then KILL whatever of the job's session is left.
stop_job() {
  local sup p
  sup=$(job_field "$1" supervisor_pid)
  [ -n "$sup" ] && kill -TERM "$sup" 2>/dev/null
  [ -n "${2:-}" ] || return 0
  # shellcheck disable=SC2046
  wait_pids_gone 15 $(session_pids "$2") && return 0
  for p in $(session_pids "$2"); do kill -9 "$p" 2>/dev/null; done
  # shellcheck disable=SC2046
  wait_pids_gone 15 $(session_pids "$2") || echo "  note: processes of job $1 are still there"
  return 0
}
# Waits up to SECONDS (60) until `cusnap ps` no longer lists job NAME.
wait_job_gone() {  # NAME [SECONDS]
  local _
  for _ in $(seq 1 $((${2:-60} * 10))); do [ -z "$(job_field "$1" pid)" ] && return 0; sleep 0.1; done
  return 1
}
# Checkpoints the running job NAME to CK (which stops it), waits until it is
# gone and restores CK detached. Sets BEFORE (the counts in OUT, of the ranks
# matching RANKS, where the job stopped; none is a failure) and LOG (the restored job's
# output.log). On failure sets WHY and returns 1; the job is stopped and CK
# removed. VAR=VALUE arguments go into cusnap checkpoint's environment.
stop_and_restore() {  # NAME CK OUT RANKS [VAR=VALUE ...]
  local name=$1 ck=$2 out=$3 ranks=$4 cj=$WORK/$1.ckpt.json rj=$WORK/$1.restore.json \
    copy=$WORK/$1.stopped.log tailpid
  shift 4
  BEFORE='' LOG='' WHY=''
  # OUT may be the job's output.log, which goes with its runtime directory
  # when the checkpoint stops the job: read it through a held descriptor.
  tail -n +1 -f "$out" >"$copy" 2>/dev/null &
  tailpid=$!
  if ! env "$@" timeout "$CLIENT_TIMEOUT" "$BIN/cusnap" checkpoint "$name" -o "$ck" --timeout "$PHASE_TIMEOUT" --json >"$cj" 2>&1; then
    kill "$tailpid" 2>/dev/null || true
    WHY="the checkpoint failed: $(json_field "$cj" error | head -2)"
    stop_job "$name" "$ROOT_PID"; rm -rf "$ck"; return 1
  fi
  wait_job_gone "$name" || true
  sleep 0.5
  kill "$tailpid" 2>/dev/null || true
  wait "$tailpid" 2>/dev/null || true
  BEFORE=$(counts "$copy" | grep -E "^($ranks) " || true)
  if [ -z "$BEFORE" ]; then
    WHY="no count of $ranks in $out before the checkpoint"; rm -rf "$ck"; return 1
  fi
  if ! timeout "$CLIENT_TIMEOUT" "$BIN/cusnap" restore "$ck" --detach --timeout "$PHASE_TIMEOUT" --json >"$rj" 2>&1; then
    WHY="the restore failed: $(json_field "$rj" error | head -2)"
    stop_job "$name" "$(job_field "$name" pid)"; rm -rf "$ck"; return 1
  fi
  LOG=$(json_field "$rj" runtime_dir)/output.log
}
result() {  # STATUS SCENARIO TEXT
  printf '%s %-28s %s\n' "$1" "$2" "$3"
  SUMMARY+=("$(printf '%-5s %-28s %s' "$1" "$2" "$3")")
  [ "$1" = FAIL ] && failed+=("$2")
  return 0
}
show_tail() { [ -f "$1" ] && tail -n "${2:-12}" "$1" | sed 's/^/    | /'; return 0; }
show_phases() {  # TITLE JSON-FILE
  local retries
  echo "  $1 phases: $(phases "$2" | awk '{printf "%s%s %s s", (NR > 1 ? ", " : ""), $1, $2}')"
  retries=$(json_field "$2" capture_retries)
  [ -z "$retries" ] || echo "  $1: waited for a stream capture to end ($retries retries)"
}

# launch_job NAME OUT [LAUNCH-OPTIONS...] -- CMD...: cusnap launch in the
# background, its output in OUT; SUP is its supervisor.
launch_job() {
  local name=$1 out=$2
  local opts=()
  shift 2
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  "$BIN/cusnap" launch "${opts[@]}" --name "$name" -- "$@" >"$out" 2>&1 &
  SUP=$!
  SUPERVISORS+=("$SUP")
}
# start_job SCENARIO NAME OUT NPROC [LAUNCH-OPTIONS...] -- CMD...: launch and
# wait until NPROC processes count; ROOT_PID is the job's first process.
# Reports FAIL for SCENARIO (and stops the job) when it does not start.
start_job() {
  local scen=$1 name=$2 out=$3 nproc=$4
  shift 4
  ROOT_PID=
  launch_job "$name" "$out" "$@"
  for _ in $(seq 1 300); do
    ROOT_PID=$(job_field "$name" pid)
    [ -n "$ROOT_PID" ] && break
    kill -0 "$SUP" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$ROOT_PID" ] && JOB_SIDS+=("$ROOT_PID")
  if [ -z "$ROOT_PID" ] || ! wait_labels "$out" 300 "$nproc"; then
    result FAIL "$scen" "the job did not start counting in $nproc processes: ${WHY:-not listed by cusnap ps}"
    show_tail "$out"
    stop_job "$name" "$ROOT_PID"
    return 1
  fi
  return 0
}

# continued_from LOG BEFORE: each process must go on from where it was: its
# first count in LOG follows its last one in BEFORE ("LABEL N" lines). Sets
# back (those that started over) and gaps (those whose count lines were lost).
continued_from() {
  local l n first
  back=() gaps=()
  while read -r l n; do
    [ -n "$l" ] || continue
    first=$(count_of "$1" "$l" first)
    if [ "$first" -le "$n" ]; then back+=("$l:$n->$first")
    elif [ "$first" -ne $((n + 1)) ]; then gaps+=("$l:$n->$first"); fi
  done <<<"$2"
}

# checkpoint_restore SCENARIO NPROC [LAUNCH-OPTIONS...] -- CMD...: the job under
# cusnap launch; once NPROC processes count, `cusnap checkpoint` (which stops
# it), then `cusnap restore --detach`: every process must count on past its last
# count before the checkpoint (3 more rounds), with no error line, and the job
# must still run. Prints the wall time and phases of both; stops the job.
# With EXPECT_FAILURE=1 (negative control) a failure anywhere is the expected
# result: PASS when it fails, NOTE when it restores and counts on.
checkpoint_restore() {
  local scen=$1 nproc=$2
  shift 2
  local name=$scen out=$WORK/$scen.out ck=$WORK/$scen.ckpt
  local cj=$WORK/$scen.ckpt.json rj=$WORK/$scen.restore.json
  local sup pids before spec t0 ck_wall rs_wall rdir log first l n back=() gaps=() \
    rpid expect=${EXPECT_FAILURE:-0} why seen_before
  start_job "$scen" "$name" "$out" "$nproc" "$@" || return 0
  sup=$SUP
  pids=$(session_pids "$ROOT_PID")
  echo "  $scen: job pid $ROOT_PID, processes $(echo "$pids" | tr '\n' ' '), counting: $(counts "$out" | tr '\n' ' ')"

  t0=$(date +%s.%N)
  if ! timeout "$CLIENT_TIMEOUT" "$BIN/cusnap" checkpoint "$name" -o "$ck" --timeout "$PHASE_TIMEOUT" --json >"$cj" 2>&1; then
    why="checkpoint failed: $(json_field "$cj" error | head -1)"
    [ "$why" = "checkpoint failed: " ] && why="checkpoint failed: $(tail -1 "$cj")"
    if [ "$expect" = 1 ]; then result PASS "$scen" "failed as expected without the shim: $why"
    else result FAIL "$scen" "$why"; show_tail "$cj"; show_tail "$out" 6; fi
    stop_job "$name" "$ROOT_PID"
    return 0
  fi
  ck_wall=$(since "$t0")
  wait "$sup" 2>/dev/null || true
  # shellcheck disable=SC2086
  if ! wait_pids_gone 60 $pids; then
    result FAIL "$scen" "processes of the job are still there after the checkpoint: $(session_pids "$ROOT_PID" | tr '\n' ' ')"
    stop_job "$name" "$ROOT_PID"
    return 0
  fi
  before=$(counts "$out")
  seen_before=$(seens "$out")
  echo "  checkpoint: ${ck_wall} s wall, $(du -sh "$ck" 2>/dev/null | awk '{print $1}'); stopped at: $(echo "$before" | tr '\n' ' ')"
  show_phases checkpoint "$cj"

  t0=$(date +%s.%N)
  if ! timeout "$CLIENT_TIMEOUT" "$BIN/cusnap" restore "$ck" --detach --timeout "$PHASE_TIMEOUT" --json >"$rj" 2>&1; then
    why="restore failed: $(json_field "$rj" error | head -1)"
    [ "$why" = "restore failed: " ] && why="restore failed: $(tail -1 "$rj")"
    if [ "$expect" = 1 ]; then result PASS "$scen" "failed as expected without the shim: $why"
    else result FAIL "$scen" "$why"; show_tail "$rj"; fi
    stop_job "$name" "$ROOT_PID"
    rm -rf "$ck"
    return 0
  fi
  rs_wall=$(since "$t0")
  rpid=$(json_field "$rj" pid)
  rdir=$(json_field "$rj" runtime_dir)
  log=${rdir:-$CUSNAP_RUNTIME_BASE/$name}/output.log
  echo "  restore: ${rs_wall} s wall (pid ${rpid:-?})"
  show_phases restore "$rj"

  if ! wait_beyond "$log" 120 3 "$before" || ! wait_seen_past "$log" 30 "$seen_before"; then
    if [ "$expect" = 1 ]; then
      result PASS "$scen" "the restored job failed as expected without the shim: $WHY"
    else
      result FAIL "$scen" "after restore: $WHY (before: $(echo "$before" | tr '\n' ' '))"
    fi
    show_tail "$log"
    stop_job "$name" "$ROOT_PID"
    rm -rf "$ck"
    return 0
  fi
  continued_from "$log" "$before"
  if [ -z "$(job_field "$name" pid)" ]; then
    why="the restored job ended"
  elif [ ${#back[@]} -gt 0 ]; then
    why="processes started over instead of continuing: ${back[*]}"
  elif [ -n "$(error_lines "$log")" ]; then
    why="error after restore: $(error_lines "$log" | head -1)"
  else
    why=
  fi
  if [ -n "$why" ]; then
    if [ "$expect" = 1 ]; then result PASS "$scen" "failed as expected without the shim: $why"
    else result FAIL "$scen" "$why"; show_tail "$log"; fi
  elif [ "$expect" = 1 ]; then
    result NOTE "$scen" "restored and counted on WITHOUT the shim (the negative control did not fail): $(counts "$log" | tr '\n' ' ')"
  else
    result PASS "$scen" "checkpoint ${ck_wall} s, restore ${rs_wall} s; counting on: $(counts "$log" | tr '\n' ' ')"
  fi
  [ ${#gaps[@]} -gt 0 ] && echo "  note: count lines lost around the checkpoint: ${gaps[*]}"
  stop_job "$name" "$ROOT_PID"
  rm -rf "$ck"
  return 0
}

# job_op suspend|resume SCENARIO OUT [MORE]: `cusnap suspend|resume` of the job
# named SCENARIO; OP_WALL is its wall time. On failure reports FAIL (with MORE),
# stops the job and returns 1.
job_op() {
  local t0 j=$WORK/$2.$1.json
  t0=$(date +%s.%N)
  if ! timeout "$CLIENT_TIMEOUT" "$BIN/cusnap" "$1" "$2" --timeout "$PHASE_TIMEOUT" --json >"$j" 2>&1; then
    result FAIL "$2" "$1 failed: $(json_field "$j" error | tr '\n' ' ')${4:+; $4}"
    show_tail "$3" 6
    stop_job "$2" "$ROOT_PID"
    return 1
  fi
  OP_WALL=$(since "$t0")
}

# suspend_resume SCENARIO NPROC [LAUNCH-OPTIONS...] -- CMD...: a fresh job;
# `cusnap suspend`: no process may count on while suspended; `cusnap resume`:
# every process counts on (3 more rounds) with no error line.
suspend_resume() {
  local scen=$1 nproc=$2
  shift 2
  local name=$scen out=$WORK/$scen.out s_wall r_wall c1 c2 l n why seen2 retries
  start_job "$scen" "$name" "$out" "$nproc" "$@" || return 0
  job_op suspend "$scen" "$out" || return 0
  s_wall=$OP_WALL
  retries=$(json_field "$WORK/$scen.suspend.json" capture_retries)
  [ -z "$retries" ] || echo "  suspend waited for a stream capture to end ($retries retries)"
  sleep 0.5
  c1=$(counts "$out")
  sleep 2
  c2=$(counts "$out")
  why=
  [ "$c1" = "$c2" ] || why="counts went on while suspended: $(echo "$c1" | tr '\n' ' ')-> $(echo "$c2" | tr '\n' ' ')"
  [ "$(job_field "$name" state)" = suspended ] || why="${why:+$why; }cusnap ps does not say suspended"
  kill -0 "$ROOT_PID" 2>/dev/null || why="${why:+$why; }the job's process is gone"
  seen2=$(seens "$out")
  job_op resume "$scen" "$out" "$why" || return 0
  r_wall=$OP_WALL
  echo "  suspend ${s_wall} s, resume ${r_wall} s (wall); suspended at: $(echo "$c2" | tr '\n' ' ')"
  if ! wait_beyond "$out" 120 3 "$c2" || ! wait_seen_past "$out" 30 "$seen2"; then
    why="${why:+$why; }after resume: $WHY"
  elif [ -n "$(error_lines "$out")" ]; then
    why="${why:+$why; }error: $(error_lines "$out" | head -1)"
  fi
  if [ -n "$why" ]; then result FAIL "$scen" "$why"; show_tail "$out"
  else result PASS "$scen" "suspend ${s_wall} s, resume ${r_wall} s; counting on: $(counts "$out" | tr '\n' ' ')"; fi
  stop_job "$name" "$ROOT_PID"
  return 0
}

SHARE_MIB=${CUSNAP_GPU_TEST_SHARE_MIB:-64}
scenario_shared_posix() {
  echo "gpu-test: shared-posix: cusnap-share-job, a POSIX-fd VMM allocation of $SHARE_MIB MiB shared by parent and child"
  checkpoint_restore shared-posix 2 -- "$BIN/cusnap-share-job" --mib "$SHARE_MIB" --interval-ms 100
  suspend_resume shared-posix-suspend 2 -- "$BIN/cusnap-share-job" --mib "$SHARE_MIB" --interval-ms 100
}

scenario_pinned_host() {
  local kind
  for kind in alloc register; do
    echo "gpu-test: pinned-host-$kind: cusnap-hostmem-job --kind $kind, a thread writing pinned host memory all the time"
    checkpoint_restore "pinned-host-$kind" 1 -- "$BIN/cusnap-hostmem-job" --kind "$kind"
    suspend_resume "pinned-host-$kind-suspend" 1 -- "$BIN/cusnap-hostmem-job" --kind "$kind"
  done
  # Kernels that read and write pinned memory in place (tests/gpu/torch_hostmem.py).
  torch_ready pinned-host-torch || return 0
  for kind in alloc register; do
    echo "gpu-test: pinned-host-torch-$kind: torch_hostmem.py --kind $kind, kernels on pinned host memory"
    checkpoint_restore "pinned-host-torch-$kind" 1 -- "$PY" "$ROOT/tests/gpu/torch_hostmem.py" --kind "$kind"
  done
}

scenario_shared_ipc() {
  local args
  if [ ! -x "$BIN/cusnap-ipc-pair" ]; then
    result SKIP shared-ipc "$BIN/cusnap-ipc-pair is not built (tests/workloads/ipc_pair.cpp)"
    return 0
  fi
  read -r -a args <<<"${CUSNAP_GPU_TEST_IPC_ARGS:---mib $SHARE_MIB --interval-ms 100}"
  echo "gpu-test: shared-ipc: cusnap-ipc-pair ${args[*]}, a cuMemAlloc block shared through legacy IPC"
  checkpoint_restore shared-ipc 2 -- "$BIN/cusnap-ipc-pair" "${args[@]}"
  suspend_resume shared-ipc-suspend 2 -- "$BIN/cusnap-ipc-pair" "${args[@]}"
}

PY=${CUSNAP_PYTHON:-python3}
TORCH_SHARE=$ROOT/tests/gpu/torch_share.py
TORCH_MIB=${CUSNAP_GPU_TEST_TORCH_MIB:-64}
# torch_ready SCENARIO: torch sees a GPU here (else SKIP).
torch_ready() {
  if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    result SKIP "$1" "$PY has no torch with CUDA"
    return 1
  fi
}
# torch_baseline SCENARIO ALLOC: torch_share.py for 15 s without cusnap (a
# default-allocator worker took about 4 s to start on the H200); SKIP
# when torch's own sharing fails on this machine (nothing of cusnap's is in it).
torch_baseline() {
  local out=$WORK/$1.bare.out rc=0
  timeout 180 "$PY" "$TORCH_SHARE" --alloc "$2" --mib "$TORCH_MIB" --seconds 15 >"$out" 2>&1 || rc=$?
  if [ $rc != 0 ] || [ "$(count_of "$out" worker)" -lt 2 ] || [ "$(count_of "$out" main)" -lt 2 ]; then
    result SKIP "$1" "torch_share.py --alloc $2 fails WITHOUT cusnap (exit $rc): $(error_lines "$out" | tail -1)"
    show_tail "$out"
    return 1
  fi
  echo "  without cusnap: exit 0, $(counts "$out" | tr '\n' ' ')($(grep -m1 '^main: share handle' "$out" || true))"
}
scenario_torch_share() {  # SCENARIO ALLOC
  echo "gpu-test: $1: torch_share.py --alloc $2, a $TORCH_MIB MiB CUDA tensor shared with a spawned worker"
  torch_ready "$1" || return 0
  torch_baseline "$1" "$2" || return 0
  checkpoint_restore "$1" 2 -- "$PY" "$TORCH_SHARE" --alloc "$2" --mib "$TORCH_MIB"
  suspend_resume "$1-suspend" 2 -- "$PY" "$TORCH_SHARE" --alloc "$2" --mib "$TORCH_MIB"
}
scenario_torch_share_default() { scenario_torch_share torch-share-default default; }
scenario_torch_share_expandable() { scenario_torch_share torch-share-expandable expandable; }
scenario_torch_share_capture() {
  echo "gpu-test: torch-share-capture: torch_share.py --alloc expandable --capture-ms 200, a worker that records a CUDA graph after every step"
  torch_ready torch-share-capture || return 0
  torch_baseline torch-share-capture expandable || return 0
  checkpoint_restore torch-share-capture 2 -- "$PY" "$TORCH_SHARE" --alloc expandable --mib "$TORCH_MIB" --capture-ms 200
  suspend_resume torch-share-capture-suspend 2 -- "$PY" "$TORCH_SHARE" --alloc expandable --mib "$TORCH_MIB" --capture-ms 200
}
# The negative control runs the same job without the shim (--no-shim): the
# driver alone checkpoints the worker, an importer, and cannot restore it
# (legacy IPC importer: CUDA_ERROR_INVALID_VALUE on restore, GPU.md).
scenario_torch_share_noshim() {
  echo "gpu-test: torch-share-noshim: negative control, torch_share.py under cusnap launch --no-shim"
  torch_ready torch-share-noshim || return 0
  EXPECT_FAILURE=1 checkpoint_restore torch-share-noshim 2 --no-shim -- \
    "$PY" "$TORCH_SHARE" --alloc default --mib "$TORCH_MIB"
}

# 4. NCCL: a torchrun all-reduce job on two GPUs, checkpointed to disk and
# restored again and again (consistent cut across the ranks: docs/design.md).
TORCH_ALLREDUCE=$ROOT/tests/gpu/torch_allreduce.py
NCCL_MIB=${CUSNAP_GPU_TEST_NCCL_MIB:-64}
gpu_count() { nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true; }
# proc_gpu PID: the UUID of the GPU the process computes on (empty when
# nvidia-smi does not list it, e.g. from another PID namespace).
proc_gpu() { proc_gpus "$1" | awk 'NR == 1'; }
# proc_gpus PID: the UUID of each GPU the process has a context on, a line each.
proc_gpus() {
  nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader 2>/dev/null |
    awk -F', *' -v p="$1" '$1 == p {print $2}'
}
rank_pid() { sed -n "s/^rank $2 ready pid \([0-9]*\).*$/\1/p" "$1" | head -1; }

# nccl_cycles SCENARIO CYCLES MAP [VAR=VALUE...]: see the scenarios above; MAP
# is the --device-map argument of every restore (empty: none). NPROC (default
# 2) ranks on BACKEND (default nccl; gloo runs on CPU tensors).
nccl_cycles() {
  local scen=$1 cycles=$2 map=$3
  shift 3
  local name=$scen out=$WORK/$scen.out ck=$WORK/$scen.ckpt cj rj log rdir before l n \
    first back gaps t0 ck_wall rs_wall i why='' pids g0 g1 r0 r1 ck_sum=0 rs_sum=0 extra=() copy tailpid \
    nproc=${NPROC:-2} backend=${BACKEND:-nccl} mib=$NCCL_MIB
  [ "$backend" = gloo ] && mib=4
  local need=$((nproc * ${LOCAL_GPUS:-1}))
  if [ "$backend" = nccl ] && [ "$(gpu_count)" -lt "$need" ]; then
    result SKIP "$scen" "needs $need GPUs, this machine has $(gpu_count)"; return 0
  fi
  torch_ready "$scen" || return 0
  read -r -a extra <<<"${CUSNAP_GPU_TEST_NCCL_ENV:-}"
  echo "gpu-test: $scen: torchrun --nproc-per-node $nproc torch_allreduce.py --backend $backend --mib $mib${TORCH_ARGS:+ $TORCH_ARGS}, $cycles cycles${map:+, restore --device-map $map}${*:+, $*}${extra[*]:+ ${extra[*]}}"
  # PyTorch's libuv TCPStore holds an io_uring instance, which CRIU cannot
  # dump: the job runs the classic store (USE_LIBUV=0 for the workers' and
  # the agent's store, use_libuv=0 for torchrun's rendezvous store).
  start_job "$scen" "$name" "$out" "$nproc" --strict -- env "$@" "${extra[@]}" NCCL_SOCKET_IFNAME=lo USE_LIBUV=0 \
    "$PY" -m torch.distributed.run --standalone --rdzv-conf use_libuv=0 --nproc-per-node "$nproc" \
    "$TORCH_ALLREDUCE" --backend "$backend" --mib "$mib" ${TORCH_ARGS:-} || return 0
  r0=$(rank_pid "$out" 0); r1=$(rank_pid "$out" 1)
  echo "  ranks: $(grep -E '^rank [01] ready' "$out" | tr '\n' ';')"
  log=$out
  for i in $(seq 1 "$cycles"); do
    cj=$WORK/$scen.$i.ckpt.json rj=$WORK/$scen.$i.restore.json
    pids=$(session_pids "$ROOT_PID")
    # A restored job's output.log goes with its runtime directory when the
    # checkpoint stops it: read it through a descriptor held open meanwhile.
    copy=$WORK/$scen.$i.log
    tail -n +1 -f "$log" >"$copy" 2>/dev/null &
    tailpid=$!
    t0=$(date +%s.%N)
    if ! timeout "$CLIENT_TIMEOUT" "$BIN/cusnap" checkpoint "$name" -o "$ck" --timeout "$PHASE_TIMEOUT" --json >"$cj" 2>&1; then
      kill "$tailpid" 2>/dev/null || true
      why="cycle $i: checkpoint failed: $(json_field "$cj" error | head -3)"; show_tail "$cj"; show_tail "$log" 6; break
    fi
    ck_wall=$(since "$t0")
    # shellcheck disable=SC2086
    if ! wait_pids_gone 60 $pids $r0 $r1; then kill "$tailpid" 2>/dev/null || true; why="cycle $i: processes still there after the checkpoint"; break; fi
    wait_job_gone "$name" || true
    sleep 0.5
    kill "$tailpid" 2>/dev/null || true
    wait "$tailpid" 2>/dev/null || true
    before=$(counts "$copy" | grep -E '^rank_[0-9]+ ' || true)
    if [ "$(wc -l <<<"$before")" -ne "$nproc" ] || [ -z "$before" ]; then
      why="cycle $i: the output before the checkpoint shows counts of $(wc -l <<<"$before") ranks, not $nproc: $(echo "$before" | tr '\n' ' ')"; break
    fi
    if [ -n "${CUT_PER_STEP:-}" ]; then
      # One collective kernel per GPU per step, counted per GPU: the cut
      # stands at about the step reached (counted per process it would be
      # twice that), and there must be one.
      local cut step
      cut=$(python3 -c 'import json,sys; c=json.load(open(sys.argv[1])).get("collective_cut") or {}; print(max(c.values()) if c else "")' "$cj" 2>/dev/null)
      step=$(awk '{print $2}' <<<"$before" | head -1)
      if [ -z "$cut" ]; then why="cycle $i: the checkpoint made no collective cut: $(head -c 300 "$cj")"; break; fi
      if [ $((2 * cut)) -ge $((3 * step + 4)) ]; then
        why="cycle $i: the cut stands at $cut collective launches at step $step: not counted per GPU"; break
      fi
    fi
    t0=$(date +%s.%N)
    if ! timeout "$CLIENT_TIMEOUT" "$BIN/cusnap" restore "$ck" --detach ${map:+--device-map "$map"} --timeout "$PHASE_TIMEOUT" --json >"$rj" 2>&1; then
      why="cycle $i: restore failed: $(json_field "$rj" error | head -3)"; show_tail "$rj"
      # Who holds what the restore could not bind (the job's own sockets are gone).
      echo "    TCP sockets left on the machine:"; ss -tanp 2>/dev/null | sed 's/^/    | /' | head -30; break
    fi
    rs_wall=$(since "$t0")
    rdir=$(json_field "$rj" runtime_dir)
    log=${rdir:-$CUSNAP_RUNTIME_BASE/$name}/output.log
    if ! wait_beyond "$log" 120 20 "$before"; then why="cycle $i: after restore: $WHY"; show_tail "$log"; break; fi
    continued_from "$log" "$before"
    if [ ${#back[@]} -gt 0 ]; then why="cycle $i: ranks started over: ${back[*]}"; break; fi
    if [ -n "$(error_lines "$log")" ]; then why="cycle $i: $(error_lines "$log" | head -1)"; break; fi
    ROOT_PID=$(job_field "$name" pid)
    ck_sum=$(awk -v a="$ck_sum" -v b="$ck_wall" 'BEGIN{print a+b}')
    rs_sum=$(awk -v a="$rs_sum" -v b="$rs_wall" 'BEGIN{print a+b}')
    g0=$(proc_gpu "$r0"); g1=$(proc_gpu "$r1")
    on="rank 0 on ${g0:-?}"
    [ "$nproc" -gt 1 ] && on+=", rank 1 on ${g1:-?}"
    # Each swapped restore moves both ranks: rank 0 (launched on GPU 0) is
    # on GPU 1 after an odd number of them, rank 1 the other way round.
    if [ -n "$map" ]; then
      local want0 want1
      want0=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i $((i % 2)))
      want1=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i $(((i + 1) % 2)))
      if ! proc_gpus "$r0" | grep -x "$want0" >/dev/null || ! proc_gpus "$r1" | grep -x "$want1" >/dev/null; then
        why="cycle $i: after --device-map $map rank 0 is on $(proc_gpus "$r0" | paste -sd' ') and rank 1 on $(proc_gpus "$r1" | paste -sd' '), not on $want0 and $want1"; break
      fi
    fi
    echo "  cycle $i: checkpoint ${ck_wall} s ($(json_field "$cj" bytes) bytes, cut $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("collective_cut", "none"))' "$cj" 2>/dev/null)), restore ${rs_wall} s; stopped at $(echo "$before" | tr '\n' ' ')-> now $(counts "$log" | tr '\n' ' ')${gaps[*]:+ (gaps: ${gaps[*]})}; $on"
    show_phases "    checkpoint" "$cj"
    show_phases "    restore" "$rj"
    rm -rf "$ck"
  done
  if [ -n "$why" ] && [ -f "$log" ]; then
    # The job's whole output goes with its runtime directory when it stops.
    cp "$log" "$WORK/$scen.failed.log" 2>/dev/null && echo "    (the job's whole output is kept in $WORK/$scen.failed.log)"
  fi
  if [ -n "$why" ]; then result FAIL "$scen" "$why"
  else result PASS "$scen" "$cycles cycles; mean checkpoint $(awk -v s="$ck_sum" -v n="$cycles" 'BEGIN{printf "%.2f", s/n}') s, restore $(awk -v s="$rs_sum" -v n="$cycles" 'BEGIN{printf "%.2f", s/n}') s; now $(counts "$log" | tr '\n' ' ')"; fi
  stop_job "$name" "$(job_field "$name" pid)"
  rm -rf "$ck"
  return 0
}
scenario_nccl_torchrun() { nccl_cycles nccl-torchrun "${CUSNAP_GPU_TEST_NCCL_CYCLES:-10}" ""; }
scenario_nccl_torchrun_devmap() {
  nccl_cycles nccl-torchrun-devmap "${CUSNAP_GPU_TEST_NCCL_CYCLES:-10}" "0=1,1=0"
}
scenario_nccl_torchrun_expandable() {
  nccl_cycles nccl-torchrun-expandable "${CUSNAP_GPU_TEST_NCCL_CYCLES:-10}" "" \
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
}
scenario_nccl_1proc_2gpu() {
  NPROC=1 LOCAL_GPUS=2 CUT_PER_STEP=1 TORCH_ARGS="--local-gpus 2" nccl_cycles nccl-1proc-2gpu \
    "${CUSNAP_GPU_TEST_NCCL_CYCLES:-10}" ""
}
scenario_nccl_torchrun_1rank() { NPROC=1 nccl_cycles nccl-torchrun-1rank "${CUSNAP_GPU_TEST_NCCL_CYCLES:-10}" ""; }
# lifted_and_on SAID LOG WHO AFTER: SAID (what WHO, the checkpoint or the
# guardian, printed) says CRIU's nftables lock was removed and the job's
# sockets left repair mode, and rank 0 then counts 20 more in LOG with no
# error. Sets BEFORE (its count when looked at) and, on failure, WHY.
lifted_and_on() {
  BEFORE='' WHY=''
  if ! grep -q "nftables table inet CRIU-[0-9a-f-]*) removed" "$1" 2>/dev/null; then WHY="$3 does not say CRIU's nftables lock was removed"
  elif ! grep -q "TCP socket(s) of the job taken out of repair mode" "$1"; then WHY="$3 does not say the sockets left repair mode"
  else
    BEFORE=$(counts "$2" | grep -E '^rank_0 ' || true)
    if ! wait_beyond "$2" 60 20 "$BEFORE"; then WHY="after $4: $WHY"
    elif [ -n "$(error_lines "$2")" ]; then WHY="$(error_lines "$2" | head -1)"; fi
  fi
  [ -z "$WHY" ]
}
# then_restored SCEN CK OUT AFTER TEXT: the end of a scenario whose job runs
# on after a fault (AFTER): checkpoint it (which stops it), restore it, rank 0
# must count 20 more; PASS with TEXT and the counts, or FAIL. The job is then
# stopped and CK removed.
then_restored() {
  local scen=$1 ck=$2 why=''
  if ! stop_and_restore "$scen" "$ck" "$3" 'rank_0'; then result FAIL "$scen" "after $4, $WHY"; return 0; fi
  if ! wait_beyond "$LOG" 120 20 "$BEFORE"; then why="after the restore: $WHY"
  elif [ -n "$(error_lines "$LOG")" ]; then why="after the restore: $(error_lines "$LOG" | head -1)"; fi
  if [ -n "$why" ]; then result FAIL "$scen" "$why"; show_tail "$LOG"
  else result PASS "$scen" "$5; then checkpoint and restore: $(echo "$BEFORE" | tr '\n' ' ')-> $(counts "$LOG" | tr '\n' ' ')"; fi
  stop_job "$scen" "$(job_field "$scen" pid)"
  rm -rf "$ck"
}
# criu_hold_wrapper SCEN: $WORK/SCEN.criu, a CRIU (for CUSNAP_CRIU) whose
# dump waits at post-dump while $WORK/SCEN.hold exists, having created
# $WORK/SCEN.held: CRIU has then saved the job and locked its connections.
criu_hold_wrapper() {
  local scen=$1 real
  real=$(PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin command -v criu)
  cat >"$WORK/$scen.hook" <<SH
#!/bin/sh
[ "\$CRTOOLS_SCRIPT_ACTION" = post-dump ] && [ -e "$WORK/$scen.hold" ] || exit 0
: >"$WORK/$scen.held"
while [ -e "$WORK/$scen.hold" ]; do sleep 0.1; done
SH
  cat >"$WORK/$scen.criu" <<SH
#!/bin/sh
[ "\$1" = dump ] && exec "$real" "\$@" --action-script "$WORK/$scen.hook"
exec "$real" "\$@"
SH
  chmod 755 "$WORK/$scen.hook" "$WORK/$scen.criu"
}
# nccl-torchrun-1rank-rollback: see the scenarios above.
scenario_nccl_torchrun_1rank_rollback() {
  local scen=nccl-torchrun-1rank-rollback out=$WORK/nccl-torchrun-1rank-rollback.out \
    ck=$WORK/nccl-torchrun-1rank-rollback.ckpt cj rc why='' before
  if [ "$(gpu_count)" -lt 1 ]; then result SKIP "$scen" "needs a GPU"; return 0; fi
  torch_ready "$scen" || return 0
  criu_hold_wrapper "$scen"
  echo "gpu-test: $scen: torchrun --nproc-per-node 1 torch_allreduce.py --store-every 1; CRIU held at post-dump past --timeout 5, killed; the job must run on"
  CUSNAP_CRIU=$WORK/$scen.criu start_job "$scen" "$scen" "$out" 1 --strict -- env NCCL_SOCKET_IFNAME=lo USE_LIBUV=0 \
    "$PY" -m torch.distributed.run --standalone --rdzv-conf use_libuv=0 --nproc-per-node 1 \
    "$TORCH_ALLREDUCE" --mib "$NCCL_MIB" --store-every 1 || return 0
  cj=$WORK/$scen.held.json
  : >"$WORK/$scen.hold"
  rc=0
  timeout "$CLIENT_TIMEOUT" "$BIN/cusnap" checkpoint "$scen" -o "$ck" --timeout 5 --json >"$cj" 2>&1 || rc=$?
  rm -f "$WORK/$scen.hold"
  echo "  checkpoint held past its timeout: exit $rc: $(json_field "$cj" error | head -1 | cut -c1-200)"
  json_field "$cj" error | grep -E "network lock|repair mode|warning|runs on" | sed 's/^/    /' || true
  if [ ! -e "$WORK/$scen.held" ]; then why="CRIU's dump did not reach post-dump (exit $rc)"
  elif [ "$rc" != 1 ]; then why="the checkpoint exited $rc, expected 1"
  elif ! grep -q "the job runs on unchanged" "$cj"; then why="the checkpoint does not say the job runs on"
  elif ! lifted_and_on "$cj" "$out" "the checkpoint" "the roll back"; then why=$WHY
  fi
  before=$BEFORE
  if [ -n "$why" ]; then
    result FAIL "$scen" "$why"; show_tail "$cj"; show_tail "$out" 8
    stop_job "$scen" "$ROOT_PID"; rm -rf "$ck"; return 0
  fi
  echo "  rolled back: $(echo "$before" | tr '\n' ' ')-> $(counts "$out" | tr '\n' ' ')"
  # And as usual afterwards: checkpoint (stops), restore, the rank steps on.
  then_restored "$scen" "$ck" "$out" "the roll back" \
    "CRIU killed mid-dump: lock lifted, the rank stepped on with its store"
}
# nccl-torchrun-1rank-guardian: see the scenarios above.
scenario_nccl_torchrun_1rank_guardian() {
  local scen=nccl-torchrun-1rank-guardian out=$WORK/nccl-torchrun-1rank-guardian.out \
    ck=$WORK/nccl-torchrun-1rank-guardian.ckpt log=$CUSNAP_RUNTIME_BASE/nccl-torchrun-1rank-guardian/output.log \
    cj sup ckpid rc=0 why='' before
  if [ "$(gpu_count)" -lt 1 ]; then result SKIP "$scen" "needs a GPU"; return 0; fi
  torch_ready "$scen" || return 0
  criu_hold_wrapper "$scen"
  echo "gpu-test: $scen: torchrun --nproc-per-node 1 torch_allreduce.py --store-every 1; CRIU held at post-dump, the supervisor killed: its guardian must bring the rank back"
  CUSNAP_GUARDIAN_CRIU_WAIT_MS=5000 CUSNAP_CRIU=$WORK/$scen.criu start_job "$scen" "$scen" "$out" 1 --strict -- \
    env NCCL_SOCKET_IFNAME=lo USE_LIBUV=0 "$PY" -m torch.distributed.run --standalone --rdzv-conf use_libuv=0 \
    --nproc-per-node 1 "$TORCH_ALLREDUCE" --mib "$NCCL_MIB" --store-every 1 || return 0
  sup=$SUP cj=$WORK/$scen.ckpt.json
  : >"$WORK/$scen.hold"
  timeout "$CLIENT_TIMEOUT" "$BIN/cusnap" checkpoint "$scen" -o "$ck" --timeout "$PHASE_TIMEOUT" --json >"$cj" 2>&1 &
  ckpid=$!
  for _ in $(seq 1 1200); do [ -e "$WORK/$scen.held" ] && break; sleep 0.1; done
  if [ ! -e "$WORK/$scen.held" ]; then
    rm -f "$WORK/$scen.hold"; wait "$ckpid" || true
    result FAIL "$scen" "CRIU's dump did not reach post-dump: $(json_field "$cj" error | head -2)"
    stop_job "$scen" "$ROOT_PID"; rm -rf "$ck"; return 0
  fi
  kill -KILL "$sup"
  wait "$sup" 2>/dev/null || true
  wait "$ckpid" || rc=$?
  for _ in $(seq 1 1200); do grep -q "guardian: the job runs on" "$log" 2>/dev/null && break; sleep 0.1; done
  rm -f "$WORK/$scen.hold"
  echo "  checkpoint with its supervisor killed: exit $rc: $(json_field "$cj" error | head -1 | cut -c1-160)"
  grep -E "cusnap: guardian|network lock|repair mode" "$log" 2>/dev/null | sed 's/^/    /' | cut -c1-240 || true
  if [ "$rc" = 0 ]; then why="the checkpoint reported success after its supervisor was killed"
  elif ! grep -q "guardian: the job runs on, supervised by process" "$log" 2>/dev/null; then why="the guardian did not bring the job back"
  elif ! lifted_and_on "$log" "$log" "the guardian" "the guardian's recovery"; then why=$WHY
  fi
  before=$BEFORE
  if [ -n "$why" ]; then
    result FAIL "$scen" "$why"; show_tail "$log" 10
    stop_job "$scen" "$ROOT_PID"; rm -rf "$ck"; return 0
  fi
  echo "  recovered by the guardian: $(echo "$before" | tr '\n' ' ')-> $(counts "$log" | tr '\n' ' ')"
  # Supervised by the guardian now: checkpoint (stops), restore, steps on.
  rm -rf "$ck"
  then_restored "$scen" "$ck" "$log" "the guardian's recovery" \
    "supervisor killed mid-dump: the guardian restored the driver state, lifted CRIU's lock, the rank stepped on with its store"
}
# nccl-torchrun-1gpu: see the scenarios above.
scenario_nccl_torchrun_1gpu() {
  local scen=nccl-torchrun-1gpu out=$WORK/nccl-torchrun-1gpu.out ck=$WORK/nccl-torchrun-1gpu.ckpt \
    op rc why='' before log
  if [ "$(gpu_count)" -lt 1 ]; then result SKIP "$scen" "needs a GPU"; return 0; fi
  torch_ready "$scen" || return 0
  local job=(--strict -- env NCCL_SOCKET_IFNAME=lo USE_LIBUV=0 "$PY" -m torch.distributed.run
    --standalone --rdzv-conf use_libuv=0 --nproc-per-node 2 "$TORCH_ALLREDUCE" --mib "$NCCL_MIB"
    --share-gpu)
  echo "gpu-test: $scen: torchrun --nproc-per-node 2 torch_allreduce.py --share-gpu, both ranks on GPU 0: checkpoint and suspend refused, the job runs on"
  start_job "$scen" "$scen" "$out" 2 "${job[@]}" || return 0
  for op in checkpoint suspend; do
    rc=0
    if [ "$op" = checkpoint ]; then
      timeout "$CLIENT_TIMEOUT" "$BIN/cusnap" checkpoint "$scen" -o "$ck" --timeout "$PHASE_TIMEOUT" --json >"$WORK/$scen.$op.json" 2>&1 || rc=$?
    else
      timeout "$CLIENT_TIMEOUT" "$BIN/cusnap" suspend "$scen" --timeout "$PHASE_TIMEOUT" --json >"$WORK/$scen.$op.json" 2>&1 || rc=$?
    fi
    echo "  $op: exit $rc: $(json_field "$WORK/$scen.$op.json" error | head -1)"
    if [ "$rc" != 3 ] || ! grep -q "both run collective kernels" "$WORK/$scen.$op.json"; then
      why="$op was not refused as ranks sharing a GPU (exit $rc)"; break
    fi
  done
  before=$(counts "$out" | grep -E '^rank_[01] ' || true)
  if [ -z "$why" ] && ! wait_beyond "$out" 3 1 "$before"; then
    why="the ranks did not count on after the refusals: $WHY"
  fi
  [ -z "$(error_lines "$out")" ] || why="${why:-$(error_lines "$out" | head -1)}"
  stop_job "$scen" "$(job_field "$scen" pid)"
  if [ -n "$why" ]; then result FAIL "$scen" "$why"; return 0; fi
  # Control: what the refusal prevents. With the check off the same job is
  # checkpointed and restored; the driver is expected to fail its kernels.
  # The job is launched without the override: cusnap checkpoint sends its own.
  echo "  control: CUSNAP_ALLOW_RANKS_SHARING_GPU=1 in cusnap checkpoint's environment, checkpoint and restore"
  start_job "$scen" "$scen" "$out" 2 "${job[@]}" || return 0
  if ! stop_and_restore "$scen" "$ck" "$out" 'rank_[01]' CUSNAP_ALLOW_RANKS_SHARING_GPU=1; then
    result NOTE "$scen" "refused as it should; control: $WHY"; return 0
  fi
  before=$BEFORE log=$LOG
  if wait_beyond "$log" 60 20 "$before"; then
    result NOTE "$scen" "refused as it should, but the control restored and ran on ($(echo "$before" | tr '\n' ' ')-> $(counts "$log" | tr '\n' ' ')): the driver may time-slice restored contexts now"
  else
    result PASS "$scen" "checkpoint and suspend refused, the job ran on; the control (check off) failed after its restore as the driver does: $WHY"
    dmesg 2>/dev/null | grep -i 'xid' | tail -2 | sed 's/^/    | /'
  fi
  stop_job "$scen" "$(job_field "$scen" pid)"
  rm -rf "$ck"
}
scenario_torchrun_gloo() { BACKEND=gloo nccl_cycles torchrun-gloo 5 ""; }
scenario_nccl_torchrun_graph() {
  TORCH_ARGS="--graph 2" nccl_cycles nccl-torchrun-graph "${CUSNAP_GPU_TEST_NCCL_CYCLES:-10}" ""
}
scenario_nccl_torchrun_1rank_graph() { NPROC=1 TORCH_ARGS="--graph 2" nccl_cycles nccl-torchrun-1rank-graph 3 ""; }
# cut_json_counts FILE: "PID=COUNT ..." of a checkpoint report's collective_cut.
cut_json_counts() {
  python3 - "$1" <<'PY' 2>/dev/null || true
import json, sys
text = open(sys.argv[1]).read()
obj, _ = json.JSONDecoder().raw_decode(text[text.index("{"):])
print(" ".join(f"{k}={v}" for k, v in sorted(obj.get("collective_cut", {}).items())))
PY
}
scenario_nccl_torchrun_1gpu_graph() {
  local scen=nccl-torchrun-1gpu-graph out=$WORK/nccl-torchrun-1gpu-graph.out ck=$WORK/nccl-torchrun-1gpu-graph.ckpt \
    cj cut vals rc t0 wall ctl
  if [ "$(gpu_count)" -lt 1 ]; then result SKIP "$scen" "needs a GPU"; return 0; fi
  torch_ready "$scen" || return 0
  local job=(--strict -- env NCCL_SOCKET_IFNAME=lo USE_LIBUV=0 "$PY" -m torch.distributed.run
    --standalone --rdzv-conf use_libuv=0 --nproc-per-node 2 "$TORCH_ALLREDUCE" --mib "$NCCL_MIB"
    --share-gpu --graph 2)
  echo "gpu-test: $scen: torchrun --nproc-per-node 2 torch_allreduce.py --share-gpu --graph 2 on GPU 0: the cut lines up graph-launched collectives"
  # Control first: without counting, the gates close wherever the ranks are.
  CUSNAP_COLLECTIVE_KERNELS=no-such-kernel CUSNAP_ALLOW_RANKS_SHARING_GPU=1 \
    start_job "$scen" "$scen" "$out" 2 "${job[@]}" || return 0
  wait_beyond "$out" 30 5 "$(counts "$out" | grep -E '^rank_[01] ' || true)" || true
  rc=0
  timeout "$CLIENT_TIMEOUT" "$BIN/cusnap" checkpoint "$scen" -o "$ck.ctl" --timeout 10 --json >"$WORK/$scen.ctl.json" 2>&1 || rc=$?
  if [ "$rc" = 0 ]; then
    ctl="control (counting off): the checkpoint drained by luck"
    rm -rf "$ck.ctl"
  else
    ctl="control (counting off): exit $rc: $(json_field "$WORK/$scen.ctl.json" error | head -1 | cut -c1-160)"
  fi
  echo "  $ctl"
  stop_job "$scen" "$ROOT_PID"
  CUSNAP_ALLOW_RANKS_SHARING_GPU=1 start_job "$scen" "$scen" "$out" 2 "${job[@]}" || return 0
  wait_beyond "$out" 30 5 "$(counts "$out" | grep -E '^rank_[01] ' || true)" || true
  cj=$WORK/$scen.ckpt.json
  t0=$(date +%s.%N)
  rc=0
  timeout "$CLIENT_TIMEOUT" "$BIN/cusnap" checkpoint "$scen" -o "$ck" --timeout "$PHASE_TIMEOUT" --json >"$cj" 2>&1 || rc=$?
  wall=$(since "$t0")
  cut=$(cut_json_counts "$cj")
  vals=$(tr ' ' '\n' <<<"$cut" | cut -d= -f2 | sort -u)
  if [ "$rc" != 0 ]; then
    result FAIL "$scen" "checkpoint with the cut failed (exit $rc): $(json_field "$cj" error | head -2)"
    show_tail "$out" 6
    stop_job "$scen" "$ROOT_PID"
  elif [ "$(wc -w <<<"$cut")" != 2 ] || [ "$(wc -l <<<"$vals")" != 1 ] || [ "${vals:-0}" -lt 4 ]; then
    result FAIL "$scen" "the ranks were not lined up at one count of collectives: '$cut'"
  else
    show_phases checkpoint "$cj"
    result PASS "$scen" "checkpoint in $wall s ($(json_field "$cj" bytes) bytes) with both ranks at collective $vals ($cut); $ctl"
  fi
  wait_job_gone "$scen" 30
  rm -rf "$ck" "$ck.ctl"
}

# The job killed (SIGKILL) while the driver holds it in a suspend's or a
# checkpoint's driver phase (a pattern job of CUSNAP_GPU_TEST_KILL_MIB,
# default 16384 MiB, killed CUSNAP_GPU_TEST_KILL_AFTER seconds in, default
# 1): the command must fail with exit 1 saying the job ended, never exit 6
# or send the user to resume a job that is gone; the supervisor ends with
# the job's status and the GPU holds nothing of it.
scenario_killed_in_driver_phase() {
  local op name sup pid out rc secs mib after ck
  mib=${CUSNAP_GPU_TEST_KILL_MIB:-16384}
  after=${CUSNAP_GPU_TEST_KILL_AFTER:-1}
  for op in suspend checkpoint; do
    name=kill-$op
    out=$WORK/$name.out
    "$BIN/cusnap" launch --name "$name" -- "$BIN/cusnap-pattern-job" --mib "$mib" --interval-ms 100 \
      >"$out" 2>&1 &
    sup=$!
    SUPERVISORS+=("$sup")
    if ! wait_count "$out" 2 300; then
      echo "FAIL killed-in-driver-phase ($op): the job did not start counting"; tail -5 "$out"
      failed+=("killed-in-driver-phase-$op"); kill -9 "$sup" 2>/dev/null || true; continue
    fi
    pid=$(grep -m1 '^ready pid' "$out" | awk '{print $3}')
    ck=()
    [ "$op" = checkpoint ] && ck=(-o "$WORK/$name.ckpt")
    t0=$(date +%s.%N)
    rc=0
    "$BIN/cusnap" "$op" "$name" "${ck[@]}" --timeout 120 >"$WORK/$name.op" 2>&1 &
    local client=$!
    sleep "$after"
    kill -9 "$pid"
    wait "$client" || rc=$?
    secs=$(since "$t0")
    echo "  $op of a $mib MiB job killed ${after} s in: exit $rc after $secs s"
    sed 's/^/    /' "$WORK/$name.op" | cut -c1-400 | head -6
    rc_sup=0
    timeout 60 tail --pid="$sup" -f /dev/null || true
    wait "$sup" 2>/dev/null || rc_sup=$?
    left=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | grep -cx "$pid" || true)
    if [ "$rc" = 1 ] && grep -q "the job ended" "$WORK/$name.op" && ! grep -q "cusnap resume" "$WORK/$name.op" &&
      [ "$rc_sup" = 137 ] && [ "$left" = 0 ]; then
      echo "PASS killed-in-driver-phase ($op): exit 1, the job said to have ended, supervisor 137, GPU free"
    else
      echo "FAIL killed-in-driver-phase ($op): exit $rc, supervisor $rc_sup, $left GPU process(es) of $pid left"
      failed+=("killed-in-driver-phase-$op")
    fi
    rm -rf "$WORK/$name.ckpt"
  done
}

for s in "${SELECTED[@]}"; do
  start=$(date +%s.%N)
  "scenario_${s//-/_}" || true
  echo "gpu-test: $s took $(since "$start") s"
done

if [ ${#SUMMARY[@]} -gt 0 ]; then
  echo "gpu-test: shared-memory scenarios:"
  printf '  %s\n' "${SUMMARY[@]}"
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu-test: FAILED: ${failed[*]}"
  exit 1
fi
echo "gpu-test: PASS"
