# Helpers for the checkpoint end-to-end tests (sourced, not a test).
#
# Environment: CUSNAP_BINARY_DIR (the build: bin/cusnap, bin/cusnap-pattern-job,
# lib/), CUSNAP_FAKECUDA_DIR (the simulated driver, put on LD_LIBRARY_PATH for
# cusnap and the jobs), or CUSNAP_REAL_DRIVER=1 to run against the system's
# driver (scripts/gpu-test.sh); parts that need the simulated driver's fault
# injection or its allocation names are then skipped through fake_only.
# Each test gets a private temporary directory $T and runtime base; every
# supervisor and job started here is killed on exit.
set -euo pipefail

: "${CUSNAP_BINARY_DIR:?CUSNAP_BINARY_DIR must name the build directory}"
REAL_DRIVER=${CUSNAP_REAL_DRIVER:-0}
if [ "$REAL_DRIVER" != 1 ]; then
  : "${CUSNAP_FAKECUDA_DIR:?CUSNAP_FAKECUDA_DIR must name the simulated driver directory}"
fi
BIN=$CUSNAP_BINARY_DIR/bin
CUSNAP=$BIN/cusnap
PATTERN_JOB=$BIN/cusnap-pattern-job
SHARE_JOB=$BIN/cusnap-share-job

skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "checkpoint and restore need root (CRIU, the driver's checkpoint API)"
if [ -z "${CUSNAP_CRIU:-}" ] && ! PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin command -v criu >/dev/null; then
  skip "CRIU is not installed"
fi
for f in "$CUSNAP" "$PATTERN_JOB" "$SHARE_JOB"; do
  [ -x "$f" ] || { echo "FAIL: $f is not built"; exit 1; }
done

if [ "$REAL_DRIVER" != 1 ]; then
  export LD_LIBRARY_PATH="$CUSNAP_FAKECUDA_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# fake_only WHAT: true on the simulated driver; on the real one says WHAT is
# not run there and returns false.
fake_only() {
  [ "$REAL_DRIVER" != 1 ] && return 0
  echo "note: not run on the real driver: $*"
  return 1
}
T=$(mktemp -d /tmp/cusnap-e2e.XXXXXX)
chmod 755 "$T"
export CUSNAP_RUNTIME_BASE=$T/run
# Temporary files of cusnap itself (kept CRIU logs of a failed dump) land here too.
export TMPDIR=$T
SUPERVISORS=()

cleanup_checkpoint_test() {
  local rc=$?
  set +e
  # Every job still known to a supervisor of this test, then the supervisors.
  # A job's root leads its own process group: the group takes its children too.
  for pid in $(job_pids_all) $(cat "$T/job-pids" 2>/dev/null); do
    kill -9 -- "-$pid" 2>/dev/null
    kill -9 "$pid" 2>/dev/null
  done
  for pid in "${SUPERVISORS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  sleep 0.3
  for pid in "${SUPERVISORS[@]}"; do kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  if [ $rc != 0 ] && [ $rc != 77 ]; then
    for f in "$T"/*.out; do [ -f "$f" ] && { echo "--- $f (last lines)"; tail -8 "$f"; }; done
  fi
  # File systems a test mounted under $T (a full or read-only tmpfs).
  awk -v t="$T/" 'index($2, t) == 1 {print $2}' /proc/mounts | while read -r m; do umount -l "$m"; done
  if [ "${KEEP_TMP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
  exit $rc
}
trap cleanup_checkpoint_test EXIT
# A test killed by its timeout still cleans up.
trap "exit 143" TERM INT

fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }

# job_pids_all: pids of every job that `cusnap ps` shows.
job_pids_all() {
  "$CUSNAP" ps --json 2>/dev/null | python3 -c '
import json, sys
try:
    for j in json.load(sys.stdin): print(j["pid"])
except Exception: pass' || true
}

# job_field NAME FIELD: a field of the job from `cusnap ps --json` (empty if none).
job_field() {
  "$CUSNAP" ps --json 2>/dev/null | python3 -c '
import json, sys
for j in json.load(sys.stdin):
    if j["name"] == sys.argv[1]: print(j.get(sys.argv[2], ""))' "$1" "$2"
}

# launch NAME OUTFILE CMD...: cusnap launch in the background; its output in OUTFILE.
launch() {
  local name=$1 out=$2
  shift 2
  "$CUSNAP" launch --name "$name" -- "$@" >"$out" 2>&1 &
  SUPERVISORS+=($!)
  LAST_SUPERVISOR=$!
}

# restore_bg DIR OUTFILE [ARGS...]: cusnap restore in the background.
restore_bg() {
  local dir=$1 out=$2
  shift 2
  "$CUSNAP" restore "$dir" "$@" >"$out" 2>&1 &
  SUPERVISORS+=($!)
  LAST_SUPERVISOR=$!
}

# checkpointed_job NAME OUTFILE DIR: launches a pattern job (4 MiB) as NAME,
# checkpoints it into DIR once it counts, and waits until it has stopped;
# sets PID (the job's, now gone) and LAST (its last count).
checkpointed_job() {
  launch "$1" "$2" "$PATTERN_JOB" --mib 4 --interval-ms 20
  wait_count "$2" 3
  PID=$(wait_job "$1")
  "$CUSNAP" checkpoint "$1" -o "$3" >"$T/$1.ckpt.out" 2>&1 || fail "checkpoint of $1 failed: $(cat "$T/$1.ckpt.out")"
  wait_exit "$LAST_SUPERVISOR"
  wait_gone "$PID"
  LAST=$(last_count "$2")
}

# memory_devices PID: the simulated devices ("dev0 dev1 ", sorted) that hold
# the device memory process PID created: the simulated driver names each
# allocation's memfd "fakecuda:CREATOR:ID:devN" (N: the machine's device
# index; tests/fakecuda/memory.cpp). Imports from other processes name their
# creator and are left out.
memory_devices() {
  local fd
  for fd in /proc/"$1"/fd/*; do readlink "$fd"; done 2>/dev/null |
    sed -n "s|^/memfd:fakecuda:$1:[0-9]*:\(dev[0-9]*\).*|\1|p" | sort -u | tr '\n' ' '
}

# restore_continues DIR OUTFILE NAME PID LAST: restores DIR in the background
# and expects job NAME back as PID, counting on from exactly LAST + 1 with
# its pattern intact; sets SUP (the restore's supervisor) and FIRST.
restore_continues() {
  local dir=$1 out=$2 name=$3 pid=$4 last=$5
  restore_bg "$dir" "$out"
  SUP=$LAST_SUPERVISOR
  wait_count "$out" $((last + 3))
  FIRST=$(first_count "$out")
  [ "$FIRST" = $((last + 1)) ] || fail "the restore of $dir began at count $FIRST, expected $((last + 1))"
  [ "$(job_field "$name" pid)" = "$pid" ] || fail "the restored job $name does not run as pid $pid"
  grep -q "pattern mismatch" "$out" && fail "the restore of $dir: pattern damaged"
  return 0
}

# last_count FILE [PREFIX]: the last N of "PREFIXcount N ok" in FILE (0 if none).
last_count() {
  local n
  n=$(grep -E "^${2:-}count [0-9]+ ok$" "$1" 2>/dev/null | tail -1 | awk '{print $(NF-1)}')
  echo "${n:-0}"
}
# first_count FILE [PREFIX]
first_count() {
  local n
  n=$(grep -E "^${2:-}count [0-9]+ ok$" "$1" 2>/dev/null | head -1 | awk '{print $(NF-1)}')
  echo "${n:-0}"
}

# settled_count FILE [PREFIX]: the last count in FILE once the lines already
# on their way through the supervisor's echo are out: the same twice 0.3 s
# apart (at most about 5 s: a job that counts on never settles, and the
# caller's next look finds it moved).
settled_count() {
  local n m
  n=$(last_count "$1" "${2:-}")
  for _ in $(seq 1 16); do
    sleep 0.3
    m=$(last_count "$1" "${2:-}")
    [ "$m" = "$n" ] && break
    n=$m
  done
  echo "$n"
}

# wait_count FILE N [PREFIX] [SECONDS]: waits until FILE counted to at least N.
wait_count() {
  local file=$1 n=$2 prefix=${3:-} secs=${4:-60}
  for _ in $(seq 1 $((secs * 20))); do
    [ "$(last_count "$file" "$prefix")" -ge "$n" ] && return 0
    sleep 0.05
  done
  fail "$file did not reach '${prefix}count $n ok' in $secs s (last: $(last_count "$file" "$prefix"))"
}

# job_said VAR FILE PREFIX: sets VAR to the rest of the first line of FILE
# that starts with PREFIX (a value the job printed, such as its port); fails
# the test when there is none.
job_said() {
  local value
  value=$(sed -n "s/^$3//p" "$2" | head -1)
  [ -n "$value" ] || fail "the job did not say '$3' in $2"
  printf -v "$1" '%s' "$value"
}

# wait_job NAME [SECONDS]: waits until cusnap ps shows the job running; echoes
# its pid and notes it in $T/job-pids, whose jobs are killed on exit even when
# their supervisor is gone.
wait_job() {
  local pid
  for _ in $(seq 1 $((${2:-60} * 10))); do
    pid=$(job_field "$1" pid)
    [ -n "$pid" ] && { echo "$pid" >>"$T/job-pids"; echo "$pid"; return 0; }
    sleep 0.1
  done
  fail "job $1 did not appear in cusnap ps"
}

# wait_gone PID [SECONDS]: waits until the process is gone and reaped (CRIU
# restores pids and cannot while the old one is still a zombie).
wait_gone() {
  for _ in $(seq 1 $((${2:-60} * 20))); do
    [ -e "/proc/$1" ] || return 0
    sleep 0.05
  done
  fail "process $1 is still there"
}

# wait_exit PID: waits for a supervisor started here (not in a subshell: only
# this shell can wait for it) and sets EXIT_RC to its exit status.
wait_exit() {
  EXIT_RC=0
  wait "$1" || EXIT_RC=$?
}

# expect_running NAME PID OUTFILE [PREFIX]: the job still runs as PID, cusnap
# inspect shows each of its CUDA processes' GPU state running (a job without
# CUDA shows none), and it keeps counting (so its pattern is intact).
# With DRIVER_STATE_UNKNOWN=1 (a supervisor whose driver has no checkpoint
# API, so inspect cannot tell) each CUDA process must show no state instead,
# and the simulated driver is asked itself (on the real one the counting
# shows it).
expect_running() {
  local name=$1 pid=$2 out=$3 prefix=${4:-}
  [ "$(job_field "$name" pid)" = "$pid" ] || fail "job $name no longer runs as pid $pid"
  kill -0 "$pid" 2>/dev/null || fail "job $name (pid $pid) is gone"
  local n states p st want=running
  n=$(last_count "$out" "$prefix")
  wait_count "$out" $((n + 2)) "$prefix"
  "$CUSNAP" inspect "$name" --json >"$T/inspect.json" 2>"$T/inspect.err" ||
    fail "cusnap inspect of the running job $name failed: $(cat "$T/inspect.err" "$T/inspect.json")"
  # "PID=STATE" of each CUDA process ("none" for an empty state).
  states=$(python3 -c '
import json, sys
procs = json.load(open(sys.argv[1]))["processes"]
print(" ".join("%d=%s" % (p["pid"], p.get("cuda_state") or "none") for p in procs if p.get("uses_cuda")))' \
    "$T/inspect.json") || fail "cusnap inspect $name --json lists no processes: $(cat "$T/inspect.json")"
  [ "${DRIVER_STATE_UNKNOWN:-0}" = 1 ] && want=none
  for p in $states; do
    [ "${p#*=}" = "$want" ] ||
      fail "job $name has GPU states '$states', expected each $want: $(cat "$T/inspect.json")"
    if [ "$want" = none ] && [ "$REAL_DRIVER" != 1 ]; then
      st=$("$CUSNAP_FAKECUDA_DIR/fakecuda_ckpt" state "${p%%=*}" 2>&1 | head -1 || true)
      [ "$st" = "state 0" ] || fail "job $name: the driver's state of process ${p%%=*} is '$st', not running (0)"
    fi
  done
  grep -q "pattern mismatch" "$out" && fail "job $name found a wrong byte"
  return 0
}

# wait_driver_state PID STATE WHILE [SECONDS]: waits until the simulated
# driver shows process PID in STATE (a CUprocessState number, as fakecuda_ckpt
# prints it) while process WHILE (the command that should bring it there)
# runs; true once seen, false when WHILE ended or SECONDS (default 12) passed.
# DRIVER_STATE holds what was read last.
wait_driver_state() {
  local pid=$1 want="state $2" while=$3 i n=$(((${4:-12}) * 50))
  DRIVER_STATE=
  for ((i = 0; i < n; i++)); do
    DRIVER_STATE=$("$CUSNAP_FAKECUDA_DIR/fakecuda_ckpt" state "$pid" 2>&1 | head -1 || true)
    [ "$DRIVER_STATE" = "$want" ] && return 0
    kill -0 "$while" 2>/dev/null || return 1
    sleep 0.02
  done
  return 1
}

# criu_iptables_rules: how many iptables and ip6tables rules of CRIU's
# network lock (mark 0xC114) there are here.
criu_iptables_rules() { (iptables -S; ip6tables -S) 2>/dev/null | grep -ic "mark 0xc114" || true; }

# nft_has_table NAME: whether an nftables table "inet NAME" exists here,
# asked of nf_tables over netlink (the nft program and libnftables may both be
# missing: the GPU machine's CRIU brings its own). Exit 0 yes, 1 no, 2 error.
nft_has_table() {
  python3 - "$1" <<'PY'
import socket, struct, sys
NFNL_SUBSYS_NFTABLES, NFT_MSG_NEWTABLE, NFT_MSG_GETTABLE = 10, 0, 1
name = sys.argv[1].encode() + b"\0"
attr = struct.pack("HH", 4 + len(name), 1) + name  # NFTA_TABLE_NAME
attr += b"\0" * (-len(attr) % 4)
body = struct.pack("BBH", 1, 0, 0) + attr  # nfgenmsg: NFPROTO_INET
hdr = struct.pack("IHHII", 16 + len(body), NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_GETTABLE,
                  1 | 4, 1, 0)  # NLM_F_REQUEST | NLM_F_ACK
s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12)  # NETLINK_NETFILTER
s.settimeout(5)
s.sendto(hdr + body, (0, 0))
found = False
while True:
    data = s.recv(65536)
    off = 0
    while off + 16 <= len(data):
        ln, typ = struct.unpack_from("IH", data, off)
        if typ == NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWTABLE:
            found = True
        elif typ == 2:  # NLMSG_ERROR: the acknowledgement (0) or the error
            err = struct.unpack_from("i", data, off + 16)[0]
            if err not in (0, -2):  # -ENOENT: no such table
                sys.exit(2)
            sys.exit(0 if found and err == 0 else 1)
        off += (ln + 3) & ~3
PY
}

# expect_refused CODE TEXT CMD...: runs CMD, which must fail with exit CODE
# and print TEXT (a grep -E pattern).
expect_refused() {
  local code=$1 text=$2 rc=0
  shift 2
  "$@" >"$T/cmd.out" 2>&1 || rc=$?
  [ "$rc" = "$code" ] || fail "'$*' exited $rc, expected $code: $(cat "$T/cmd.out")"
  grep -aEq "$text" "$T/cmd.out" || fail "'$*' did not say /$text/: $(cat "$T/cmd.out")"
  echo "   refused as expected: $(grep -aE "$text" "$T/cmd.out" | head -1)"
}

# The simulated driver's trace: with FAKECUDA_LOG=1 it writes "fakecuda[PID]:
# CALL ..." as each driver call enters, before its FAKECUDA_DELAY. A test that
# must act inside a slowed call waits for that line rather than for a fixed
# time: the operation's checks before the call (criu --version, the /proc
# scan) may take longer on a loaded machine. Tests give the trace to the
# supervisor alone (env -u FAKECUDA_LOG for the job).
# calls_begun FILE CALL [PID]: how many CALLs FILE shows begun (by PID, when
# given).
calls_begun() { grep -c "^fakecuda\[${3:-[0-9]*}\]: $2\( \|\$\)" "$1" || true; }
# usecs T: T, an $EPOCHREALTIME, in microseconds.
usecs() { local t=${1/[.,]/}; echo $((10#$t)); }
# wait_driver_call FILE CALL BEFORE CMD [PID] [SECONDS]: waits (SECONDS, 30 by
# default) while process CMD runs until FILE shows more than BEFORE CALLs
# begun (by PID, when given); returns 1 if they did not. Sets ABSENT to the
# last moment (usecs) the call had surely not begun.
wait_driver_call() {
  local file=$1 call=$2 before=$3 cmd=$4 pid=${5:-} secs=${6:-30} now
  ABSENT=$(usecs "$EPOCHREALTIME")
  for _ in $(seq 1 $((secs * 50))); do
    now=$EPOCHREALTIME
    [ "$(calls_begun "$file" "$call" "$pid")" -gt "$before" ] && return 0
    ABSENT=$(usecs "$now")
    kill -0 "$cmd" 2>/dev/null || break
    sleep 0.02
  done
  [ "$(calls_begun "$file" "$call" "$pid")" -gt "$before" ]
}

# rolls_back_when JOB OP TRIGGER TEXT WAITCMD...: runs `cusnap OP JOB`
# (a checkpoint into $T/ckpt-OP), creates the file TRIGGER once OP has taken
# its first look at the job, runs WAITCMD (which waits for what the trigger
# starts), then expects OP to have rolled back (exit 1) saying TEXT (grep)
# and that the job runs on, leaving no checkpoint. OP's output is in $T/OP.out.
# On the simulated driver the job's supervisor runs with FAKECUDA_LOG=1 (the
# job without) and a slowed lock (FAKECUDA_DELAY), its output in SUP_OUT: the
# trigger comes as the supervisor begins OP's first driver lock (traced as
# the call enters, before its delay), after the look and before the check
# once every process is locked; a fixed wait could come before the look on
# a loaded machine. The real driver traces nothing: half a second in.
rolls_back_when() {
  local job=$1 op=$2 trigger=$3 text=$4 rc=0 locks=0
  shift 4
  local args=("$job")
  [ "$op" = checkpoint ] && args+=(-o "$T/ckpt-$op")
  [ "$REAL_DRIVER" = 1 ] || locks=$(calls_begun "${SUP_OUT:?}" cuCheckpointProcessLock)
  "$CUSNAP" "$op" "${args[@]}" >"$T/$op.out" 2>&1 &
  local cmd=$!
  if [ "$REAL_DRIVER" = 1 ]; then
    sleep 0.5
  else
    wait_driver_call "$SUP_OUT" cuCheckpointProcessLock "$locks" "$cmd" ||
      fail "$op did not reach the driver's lock: $(cat "$T/$op.out")"
  fi
  touch "$trigger"
  "$@"
  wait "$cmd" || rc=$?
  [ "$rc" = 1 ] || fail "$op exited $rc, expected 1 (rolled back): $(cat "$T/$op.out")"
  grep -q "$text" "$T/$op.out" || fail "$op did not say '$text': $(cat "$T/$op.out")"
  grep -q "the job runs on unchanged" "$T/$op.out" || fail "$op did not say the job runs on"
  [ ! -e "$T/ckpt-$op" ] || fail "the failed $op left $T/ckpt-$op behind"
}

# wait_guardian NAME OLD-SUPERVISOR [STATE]: waits (20 s at most) until a
# process other than OLD-SUPERVISOR supervises job NAME (its guardian, after
# the supervisor died), the job shown in STATE when given, or fails. Sets
# GUARD to the guardian's pid, which the test's cleanup stops.
wait_guardian() {
  local name=$1 old=$2 state=${3:-} g=
  for _ in $(seq 1 400); do
    g=$(job_field "$name" supervisor_pid)
    [ -n "$g" ] && [ "$g" != "$old" ] &&
      { [ -z "$state" ] || [ "$(job_field "$name" state)" = "$state" ]; } && break
    sleep 0.05
  done
  [ -n "$g" ] && [ "$g" != "$old" ] ||
    fail "no guardian took job $name over: $(cat "$CUSNAP_RUNTIME_BASE/$name/output.log" 2>/dev/null)"
  SUPERVISORS+=("$g")
  GUARD=$g
  [ -z "$state" ] || [ "$(job_field "$name" state)" = "$state" ] ||
    fail "the guardian shows job $name $(job_field "$name" state), expected $state"
}

# cuda_states NAME: the driver's state of each CUDA process of the job,
# comma-separated; empty when inspect cannot tell.
cuda_states() {
  "$CUSNAP" inspect "$1" --json 2>/dev/null | python3 -c '
import json, sys
try:
    procs = json.load(sys.stdin)["processes"]
except (ValueError, KeyError):
    sys.exit(0)
print(",".join(p.get("cuda_state", "") for p in procs if p.get("uses_cuda")))'
}

# expect_held NAME OUTFILE: the job is shown suspended, its GPU state is
# checkpointed, and it does not count on.
expect_held() {
  local st n
  st=$(job_field "$1" state)
  [ "$st" = suspended ] || fail "$1 shows $st, not suspended"
  st=$(cuda_states "$1")
  [ "$st" = checkpointed ] || fail "$1's GPU state is $st"
  # A line the job printed after its last driver call returned may still be
  # on its way through the supervisor's echo: let it arrive first.
  n=$(settled_count "$2")
  sleep 0.3
  [ "$(last_count "$2")" = "$n" ] || fail "$1 counted on while its GPU state was out"
}

# op CMD...: runs cusnap CMD, its output in $T/op.out (shown cut short); sets RC.
op() {
  RC=0
  "$CUSNAP" "$@" >"$T/op.out" 2>&1 || RC=$?
  echo "   cusnap $1 (exit $RC): $(tr '\n' ' ' <"$T/op.out" | cut -c1-500)"
}

# said PATTERN WHAT: the last op's output matches PATTERN (grep), or WHAT fails.
said() { grep -q -- "$1" "$T/op.out" || fail "$2 did not say '$1': $(cat "$T/op.out")"; }

# term_job: stops the supervisor $SUP (SIGTERM) and waits for it and the job's $PID to be gone.
term_job() { kill -TERM "$SUP"; wait_exit "$SUP"; wait_gone "$PID" 20; }

# A CRIU held at one of its action-script stages, for tests that act while
# CRIU is at work (kill the restore or the supervisor, look at the tree):
#   criu_hold_setup      writes $HOLD_CRIU, the real CRIU (or $CUSNAP_CRIU)
#                        with an action script added to each dump and restore;
#                        give CUSNAP_CRIU="$HOLD_CRIU" to the cusnap that runs
#                        CRIU (criu_hold_at calls it when needed)
#   criu_hold_at ACTION  arms the hold: the next dump or restore run through
#                        $HOLD_CRIU waits at ACTION (post-dump, post-restore,
#                        pre-resume, ...) until released
#   criu_held [SECONDS]  waits (60 s) until CRIU is held there; false if not.
#                        Sets HELD_CRIU (the held CRIU's pid) and HELD_SCRIPT
#                        (its action script's, which holds it).
#   criu_release         disarms and lets a held CRIU go on (the action script
#                        of a CRIU killed meanwhile, left waiting, ends too);
#                        waits until the action script has ended.
# Unarmed, $HOLD_CRIU runs every action straight through.
HOLD_CRIU=$T/criu-hold/criu
_hold_real_criu=${CUSNAP_CRIU:-$(PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin command -v criu || true)}
criu_hold_setup() {
  if [ ! -x "$HOLD_CRIU" ]; then
    mkdir -p "$T/criu-hold"
    # The action script runs in a shell CRIU starts (sh -c): it finds the
    # CRIU above it and records both pids, then waits while the hold lasts.
    cat >"$T/criu-hold/action.sh" <<SH
#!/bin/sh
[ "\$CRTOOLS_SCRIPT_ACTION" = "\$(cat "$T/criu-hold/at" 2>/dev/null)" ] || exit 0
[ -e "$T/criu-hold/on" ] || exit 0
c=\$\$
while [ "\$c" -gt 1 ] && [ "\$(cat /proc/\$c/comm 2>/dev/null)" != criu ]; do
  c=\$(awk '/^PPid:/ {print \$2}' /proc/\$c/status 2>/dev/null || echo 1)
done
echo "\$\$ \$c" >"$T/criu-hold/held.tmp" && mv "$T/criu-hold/held.tmp" "$T/criu-hold/held"
while [ -e "$T/criu-hold/on" ]; do sleep 0.1; done
exit 0
SH
    cat >"$HOLD_CRIU" <<SH
#!/bin/sh
case "\$1" in
dump | restore) exec "$_hold_real_criu" "\$@" --action-script "$T/criu-hold/action.sh" ;;
esac
exec "$_hold_real_criu" "\$@"
SH
    chmod 755 "$T/criu-hold/action.sh" "$HOLD_CRIU"
  fi
}
criu_hold_at() {
  criu_hold_setup
  rm -f "$T/criu-hold/held"
  : >"$T/criu-hold/on"
  echo "$1" >"$T/criu-hold/at"
}
criu_held() {
  for _ in $(seq 1 $((${1:-60} * 20))); do
    [ -e "$T/criu-hold/held" ] && break
    sleep 0.05
  done
  [ -e "$T/criu-hold/held" ] || return 1
  read -r HELD_SCRIPT HELD_CRIU <"$T/criu-hold/held"
  [ "$HELD_CRIU" -gt 1 ] || fail "the held action script $HELD_SCRIPT has no CRIU above it"
}
criu_release() {
  rm -f "$T/criu-hold/on" "$T/criu-hold/at"
  if [ -e "$T/criu-hold/held" ]; then
    read -r HELD_SCRIPT HELD_CRIU <"$T/criu-hold/held"
    wait_gone "$HELD_SCRIPT" 10
  fi
  rm -f "$T/criu-hold/held"
}
