# Helpers for the shared_*.sh end-to-end tests: jobs whose processes share
# device memory (POSIX-fd VMM allocations, legacy IPC) and a job with a forked
# CUDA child. Sourced after nothing else; it sources lib_checkpoint.sh.
#
# A test sets PREFIXES to the line prefixes of the job's processes (e.g.
# ("" "importer ")); every process prints "PREFIXready pid P",
# "PREFIXcount N ok" and, when it shares memory, "PREFIXseen S" (the smallest
# counter value of its peers that it found in the shared bytes).
source "$(dirname "${BASH_SOURCE[0]}")/lib_checkpoint.sh"

SHARE_RING=$BIN/cusnap-share-ring
IPC_PAIR=$BIN/cusnap-ipc-pair
FORK_CHILD=$BIN/cusnap-fork-child
for f in "$SHARE_RING" "$IPC_PAIR" "$FORK_CHILD"; do
  [ -x "$f" ] || fail "$f is not built"
done
PREFIXES=("")
# LAST[i], SEEN[i]: of the process with prefix PREFIXES[i].
LAST=()
SEEN=()

# last_seen FILE [PREFIX]: the last S of "PREFIXseen S" in FILE (0 if none).
last_seen() {
  local n
  n=$(grep -E "^${2:-}seen [0-9]+$" "$1" 2>/dev/null | tail -1 | awk '{print $NF}')
  echo "${n:-0}"
}

# wait_seen FILE PREFIX S: waits until PREFIX's "seen" goes past S (its
# peers' writes reach the bytes it reads).
wait_seen() {
  local i
  for i in $(seq 1 400); do
    [ "$(last_seen "$1" "$2")" -gt "$3" ] && return 0
    sleep 0.05
  done
  fail "'$2' saw its peers' counter stay at $(last_seen "$1" "$2") (before: $3)"
}

# ready_pids FILE: the pids of the processes that printed "ready pid P".
ready_pids() { sed -n 's/^.*ready pid \([0-9]*\).*$/\1/p' "$1"; }

# no_errors FILE: no process found a wrong byte, had a driver call fail or
# saw another process end.
no_errors() {
  if grep -E "pattern mismatch|failed:|ended|open gave" "$1"; then
    fail "a process of the job failed (in $1)"
  fi
  return 0
}

# start_job NAME OUT CMD...: cusnap launch; waits until every prefix counted
# to 5. Sets SUP (the supervisor) and PID (the job's root).
start_job() {
  local name=$1 out=$2 p
  shift 2
  launch "$name" "$out" "$@"
  SUP=$LAST_SUPERVISOR
  for p in "${PREFIXES[@]}"; do wait_count "$out" 5 "$p" 30; done
  PID=$(wait_job "$name")
  [ "$(ready_pids "$out" | wc -l)" = "${#PREFIXES[@]}" ] ||
    fail "expected ${#PREFIXES[@]} processes ready, got: $(ready_pids "$out" | tr '\n' ' ')"
  ready_pids "$out" >>"$T/job-pids"
}

# slow_driver_checkpoint_job NAME OUT: start_job of the sharing job under a
# supervisor whose driver checkpoint takes 3 s (the job's own driver calls
# are not slowed), so that a test can kill the supervisor after the release.
# The supervisor alone traces its driver calls into OUT (FAKECUDA_LOG), for
# wait_driver_checkpoint.
slow_driver_checkpoint_job() {
  FAKECUDA_LOG=1 FAKECUDA_DELAY=cuCheckpointProcessCheckpoint:3000 start_job "$1" "$2" \
    env -u FAKECUDA_DELAY -u FAKECUDA_LOG "$SHARE_JOB" --mib 4 --interval-ms 20
}

# wait_driver_checkpoint OUT OP: waits (30 s at most) until the supervisor of
# a slow_driver_checkpoint_job, its output in OUT, begins its driver
# checkpoint: FAKECUDA_LOG traces the call as it enters, before its 3 s
# delay, so the shim's save and release are done then and the driver
# checkpoint is under way. Fails if OP (the operation's pid) ends first. A
# fixed wait after the first saved file was too short on a loaded machine.
wait_driver_checkpoint() {
  wait_driver_call "$1" cuCheckpointProcessCheckpoint 0 "$2" ||
    fail "the supervisor did not begin its driver checkpoint (in $1)"
}

# note_last OUT: LAST[prefix] and SEEN[prefix] from OUT (a stopped job's output).
note_last() {
  local i
  for i in "${!PREFIXES[@]}"; do
    LAST[i]=$(last_count "$1" "${PREFIXES[i]}")
    SEEN[i]=$(last_seen "$1" "${PREFIXES[i]}")
  done
}

# checkpoint_stop NAME DIR OUT: checkpoints the job (which stops it); the
# supervisor exits 0 and every process of the job (the pids in LAUNCH_OUT) is
# gone. Notes the last counts of OUT, the job's current output.
checkpoint_stop() {
  local name=$1 dir=$2 out=$3 pids p
  pids=$(ready_pids "$LAUNCH_OUT")
  "$CUSNAP" checkpoint "$name" -o "$dir" >"$T/ckpt.out" 2>&1 ||
    fail "checkpoint of $name failed (exit $?): $(cat "$T/ckpt.out")"
  [ -f "$dir/manifest.json" ] || fail "no manifest in $dir"
  wait_exit "$SUP"
  [ "$EXIT_RC" = 0 ] || fail "the supervisor of the checkpointed job exited $EXIT_RC, expected 0"
  for p in $pids; do wait_gone "$p" 20; done
  no_errors "$out"
  note_last "$out"
}

# expect_continued OUT EXACT: the restored job's processes (the same pids as
# in the launch output LAUNCH_OUT) all run; each prefix counts on from after
# its last count before the checkpoint (at exactly LAST+1 when EXACT is 1)
# and sees its peers' counters grow past what it saw before (the shared bytes
# are shared again); no byte is wrong.
expect_continued() {
  local out=$1 exact=$2 p first k
  for k in "${!PREFIXES[@]}"; do
    p=${PREFIXES[k]}
    wait_count "$out" $((LAST[k] + 3)) "$p" 30
    first=$(first_count "$out" "$p")
    if [ "$exact" = 1 ]; then
      [ "$first" = $((LAST[k] + 1)) ] || fail "'$p' continued at $first, expected $((LAST[k] + 1))"
    else
      [ "$first" -gt "${LAST[k]}" ] || fail "'$p' began at $first, not after ${LAST[k]}"
    fi
    grep -qE "^${p}seen " "$LAUNCH_OUT" && wait_seen "$out" "$p" "${SEEN[k]}"
    echo "   '$p': count ${LAST[k]} before, $first after, now $(last_count "$out" "$p"); seen ${SEEN[k]} -> $(last_seen "$out" "$p")"
  done
  for p in $(ready_pids "$LAUNCH_OUT"); do
    kill -0 "$p" 2>/dev/null || fail "process $p of the job was not restored or died"
  done
  kill -0 "$SUP" 2>/dev/null || fail "the supervisor of the restored job ended"
  no_errors "$out"
}

# stop_job OUT: stops the job through its supervisor; waits until every
# process is gone (their pids must be free for another restore).
stop_job() {
  local p
  kill -TERM "$SUP"
  wait_exit "$SUP"
  for p in $(ready_pids "$1"); do wait_gone "$p" 20; done
}

# checkpoint_restore_cycle NAME [EXACT] [OUT] [TAG]: the job NAME, launched
# with its output in LAUNCH_OUT and now writing to OUT (default LAUNCH_OUT),
# is checkpointed to $T/ckpt-TAG (TAG defaults to NAME) and stops, then
# restored with its output in $T/restore-TAG.out; every process counts on
# (expect_continued; EXACT defaults to 1).
checkpoint_restore_cycle() {
  local name=$1 exact=${2:-1} cur=${3:-$LAUNCH_OUT} tag=${4:-$1}
  checkpoint_stop "$name" "$T/ckpt-$tag" "$cur"
  pass "$tag: checkpointed; the job stopped"
  restore_bg "$T/ckpt-$tag" "$T/restore-$tag.out"
  SUP=$LAST_SUPERVISOR
  expect_continued "$T/restore-$tag.out" "$exact"
  pass "$tag: restored; every process counts on and sees its peers' writes"
}

# expect_memory_on OUT SWAP: each process of the job (ready_pids OUT) holds
# its own device memory on one device, the one in MEMORY_DEV[pid] (SWAP 0) or
# the other of devices 0 and 1 (SWAP 1: restored with --device-map 0=1,1=0).
declare -A MEMORY_DEV
expect_memory_on() {
  local p now want
  for p in $(ready_pids "$1"); do
    now=$(memory_devices "$p")
    want=${MEMORY_DEV[$p]}
    [ "$2" = 1 ] && want=$([ "$want" = "dev0 " ] && echo "dev1 " || echo "dev0 ")
    [ "$now" = "$want" ] ||
      fail "process $p holds its device memory on '${now% }', expected '${want% }' (before: '${MEMORY_DEV[$p]% }')"
  done
}

# fast_cycles_then_moved N ARGS...: launches the pair with ARGS as job "fast"
# (no sleep between steps), runs N checkpoint/kill/restore cycles, each
# continuing at exactly the next step with each rank's device memory on the
# device it was on, then restores the last checkpoint onto the other
# machine's GPUs (FAKECUDA_UUID_SEED=5) with --device-map 0=1,1=0, where it
# must continue too, each rank's memory now on the other device.
fast_cycles_then_moved() {
  local n=$1 i cur p
  shift
  LAUNCH_OUT=$T/fast.out
  start_job fast "$LAUNCH_OUT" "$PAIR" "$@"
  for p in $(ready_pids "$LAUNCH_OUT"); do
    MEMORY_DEV[$p]=$(memory_devices "$p")
    case ${MEMORY_DEV[$p]} in
      "dev0 " | "dev1 ") ;;
      *) fail "process $p holds its device memory on '${MEMORY_DEV[$p]}', expected one of dev0, dev1" ;;
    esac
  done
  [ "$(printf '%s\n' "${MEMORY_DEV[@]}" | sort -u | wc -l)" = 2 ] ||
    fail "the ranks' memory is not on two devices: ${MEMORY_DEV[*]}"
  cur=$LAUNCH_OUT
  for i in $(seq 1 "$n"); do
    checkpoint_restore_cycle fast 1 "$cur" "fast$i"
    expect_memory_on "$LAUNCH_OUT" 0
    cur=$T/restore-fast$i.out
  done
  checkpoint_stop fast "$T/ck-moved" "$cur"
  FAKECUDA_UUID_SEED=5 "$CUSNAP" restore "$T/ck-moved" --device-map 0=1,1=0 >"$T/moved.out" 2>&1 &
  SUPERVISORS+=($!)
  SUP=$!
  expect_continued "$T/moved.out" 1
  expect_memory_on "$LAUNCH_OUT" 1
  pass "restored onto the other machine's GPUs with --device-map 0=1,1=0; each rank's memory moved to the other device"
  stop_job "$T/moved.out"
}

# collective_pair_setup DEVICES: for the tests of cusnap-collective-pair (two
# ranks meeting in the simulated driver's handshake kernel): that many
# simulated devices, PAIR (the workload) and PREFIXES (its ranks). Returns
# false on the real driver, which has no handshake kernel.
collective_pair_setup() {
  fake_only "the handshake kernel exists in the simulated driver only" || return 1
  export FAKECUDA_DEVICES=$1
  PAIR=$BIN/cusnap-collective-pair
  [ -x "$PAIR" ] || fail "$PAIR is not built"
  PREFIXES=("rank 0 " "rank 1 ")
}

# drain_rolls_back NAME: a --leave-running checkpoint of job NAME, whose
# collective counting is off, cannot drain (a rank waits in a collective for a
# rank the gates hold) and rolls back: failed in the quiesce phase, said the
# job runs on, left no manifest. Up to three tries, as one may land when no
# rank waits. The last report is in $T/neg-ckpt.out.
drain_rolls_back() {
  local try rc=0
  for try in 1 2 3; do
    rc=0
    "$CUSNAP" checkpoint "$1" -o "$T/ck-neg$try" --leave-running --timeout 3 >"$T/neg-ckpt.out" 2>&1 || rc=$?
    [ "$rc" != 0 ] && break
    echo "   try $try: the checkpoint drained by luck"
  done
  [ "$rc" != 0 ] || fail "without the cut, three checkpoints of ranks in a collective all succeeded"
  grep -q "quiesce phase" "$T/neg-ckpt.out" || fail "unexpected failure: $(cat "$T/neg-ckpt.out")"
  grep -q "runs on unchanged" "$T/neg-ckpt.out" || fail "no rollback reported: $(cat "$T/neg-ckpt.out")"
  [ ! -e "$T/ck-neg$try/manifest.json" ] || fail "a failed checkpoint left a manifest"
}

# fresh_step OUT SECONDS: waits until rank 0 of a collective pair reports a
# step after the one it last reported.
fresh_step() { wait_count "$1" $(($(last_count "$1" "rank 0 ") + 1)) "rank 0 " "$2"; }

# cut_even JSON: a checkpoint's or suspend's --json report has both ranks at
# one count above 0 (collective_cut); prints its capture_retries (0 when
# absent). Fails (status 1, the reason on stderr) otherwise.
cut_even() {
  python3 - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
cut = d["collective_cut"]
assert len(cut) == 2 and len(set(cut.values())) == 1 and min(cut.values()) > 0, cut
print(d.get("capture_retries", 0))
PY
}

# counts_held OUT SECONDS: a suspended job stands still: once lines already
# on their way are out (no count moved over 0.3 s; at most about 5 s), no
# prefix's count moves for SECONDS. Sets LAST and SEEN (note_last).
counts_held() {
  local k n before
  note_last "$1"
  for _ in $(seq 1 16); do
    before="${LAST[*]}"
    sleep 0.3
    note_last "$1"
    [ "${LAST[*]}" = "$before" ] && break
  done
  sleep "$2"
  for k in "${!PREFIXES[@]}"; do
    n=$(last_count "$1" "${PREFIXES[k]}")
    [ "$n" = "${LAST[k]}" ] || fail "'${PREFIXES[k]}' went on counting while suspended (${LAST[k]} -> $n)"
  done
}

# counts_advance OUT: every prefix counts on (3 more).
counts_advance() {
  local p n
  for p in "${PREFIXES[@]}"; do
    n=$(last_count "$1" "$p")
    wait_count "$1" $((n + 3)) "$p" 30
  done
}
