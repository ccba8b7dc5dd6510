#!/usr/bin/env bash
# A restore of a job whose two processes talk over an established TCP
# connection (tcp_pair.py, checkpointed with --tcp-established) killed
# (SIGKILL) while CRIU restores it, then the checkpoint restored again at
# once: the job must count on over its connection, and CRIU's lock on the
# connection must be gone. CRIU is held (lib_checkpoint.sh's criu_hold_at)
# where the restore is killed:
#   post-restore  before CRIU's network unlock: the connections are restored
#                 in repair mode and the checkpoint's lock (the dump's
#                 nftables table "inet CRIU-<dump run id>", or its iptables
#                 rules) still drops their packets. The restore adds no lock
#                 of its own; the checkpoint's stays, for the next restore to
#                 remove (until then it keeps an outside peer's packets from
#                 being answered with a reset, as after the checkpoint)
#   pre-resume    after the unlock: the lock is gone and the sockets are out
#                 of repair mode. The watch (restore_watch.h) puts them back
#                 into repair mode before it ends their processes, so that
#                 they close without a word: killed as they were, they closed
#                 the ordinary way, and the connection's port stayed in
#                 TIME-WAIT for a minute, in which the next restore was
#                 refused ("TCP port ... is in use")
# Both with CRIU's nftables lock, then again with its iptables lock. Last, a
# restore that fails after CRIU's unlock (the driver restore of the job's
# CUDA process, a child, fails): the restore kills what it restored with the
# sockets in repair mode, as the watch does, so the checkpoint restores again
# at once.
source "$(dirname "$0")/lib_checkpoint.sh"

# job_pids DIR: the pids of the checkpoint's processes.
job_pids() {
  python3 -c 'import json,sys; print(" ".join(str(p["pid"]) for p in json.load(open(sys.argv[1]))["processes"]))' \
    "$1/manifest.json"
}

# lock_there DIR: whether the lock CRIU's dump of DIR left is in place: its
# nftables table (named by the run id the manifest records), or with
# iptables its 4 rules (two sockets, two each).
lock_there() {
  local method id rc=0
  method=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["criu"]["network_lock"])' "$1/manifest.json")
  if [ "$method" = iptables ]; then
    [ "$(criu_iptables_rules)" = 4 ]
    return
  fi
  id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["criu"]["run_id"])' "$1/manifest.json")
  nft_has_table "CRIU-${id:0:21}" || rc=$?
  [ "$rc" = 2 ] && fail "nftables cannot be listed"
  return "$rc"
}

# killed_at DIR ACTION: a restore of DIR, its CRIU held at ACTION, is
# killed; the watch ends the restored processes and says so.
killed_at() {
  local dir=$1 action=$2 out=$T/killed-$2-$RANDOM.out r rc=0 pid id log
  criu_hold_at "$action"
  CUSNAP_CRIU="$HOLD_CRIU" "$CUSNAP" restore "$dir" >"$out" 2>&1 &
  r=$!
  SUPERVISORS+=("$r")
  criu_held 30 || fail "$action: CRIU's restore did not reach $action: $(cat "$out")"
  if [ "$action" = post-restore ]; then
    lock_there "$dir" || fail "$action: the checkpoint's lock is not there while CRIU restores"
    # Nothing of the restore's own: no table named by its run id.
    log=$(ls -t "$T"/cusnap-restore-*/restore.log | head -1)
    id=$(sed -n 's/.*) CRIU run id = \([0-9a-f-]*\)$/\1/p' "$log" | head -1)
    [ -n "$id" ] || fail "$action: the restore's log names no run id"
    rc=0
    nft_has_table "CRIU-${id:0:21}" || rc=$?
    [ "$rc" = 1 ] || fail "$action: a table of the restore's own run ($id) is there ($rc)"
  else
    rc=0
    lock_there "$dir" || rc=$?
    [ "$rc" = 1 ] || fail "$action: the checkpoint's lock is still there after CRIU's unlock"
  fi
  kill -KILL "$r"
  rc=0
  wait "$r" || rc=$?
  criu_release
  [ "$rc" = 137 ] || fail "$action: the restore exited $rc, not killed: $(cat "$out")"
  for pid in $(job_pids "$dir"); do wait_gone "$pid" 10; done
  for _ in $(seq 1 100); do grep -q "the checkpoint is unchanged" "$out" && break; sleep 0.05; done
  grep -q "its restored processes [0-9]*, [0-9]* were ended; the checkpoint is unchanged and restores again" "$out" ||
    fail "$action: the watch did not say it ended both processes: $(cat "$out")"
  [ -z "$(job_pids_all)" ] || fail "$action: a job is left: $("$CUSNAP" ps)"
}

# restored DIR OUT LAST WHAT: DIR restored at once (output OUT) counts on
# from LAST + 1 over its connection, with nothing lost, and CRIU's lock is
# gone; sets SUP.
restored() {
  local dir=$1 out=$2 last=$3 what=$4 first rc=0
  restore_bg "$dir" "$out"
  SUP=$LAST_SUPERVISOR
  for _ in $(seq 1 600); do
    [ "$(last_count "$out")" -ge $((last + 20)) ] && break
    kill -0 "$SUP" 2>/dev/null || fail "$what: the restore right after the killed ones failed: $(cat "$out")"
    sleep 0.05
  done
  first=$(first_count "$out")
  # From the checkpoint's count: exactly LAST + 1. (LAST + 2 was seen about
  # one run in ten: under PYTHONUNBUFFERED=1 print() wrote a line's text and
  # its newline in two writes, the checkpoint came between them, and the
  # line, left without its newline, did not count; tcp_pair.py now writes
  # each line whole, job_whole_lines.sh checks it.)
  [ "$first" = $((last + 1)) ] ||
    fail "$what: the restore began at count $first, expected $((last + 1)): $(tail -3 "$out")"
  [ "$(last_count "$out")" -ge $((last + 20)) ] || fail "$what: the restored job does not count on over its connection: $(tail -3 "$out")"
  grep -q mismatch "$out" && fail "$what: a number was lost on the connection"
  lock_there "$dir" || rc=$?
  [ "$rc" = 1 ] || fail "$what: CRIU's lock is still there after the restore"
  pass "$what: restored at once after the restores that failed: counts on from $first over its connection, no lock left"
}

launch tcp "$T/launch.out" python3 "$(dirname "$0")/tcp_pair.py"
SUP=$LAST_SUPERVISOR
wait_count "$T/launch.out" 5
PID=$(wait_job tcp)
"$CUSNAP" checkpoint tcp -o "$T/ck" >"$T/ck.out" 2>&1 || fail "checkpoint failed: $(cat "$T/ck.out")"
wait_exit "$SUP"
wait_gone "$PID"
LAST=$(last_count "$T/launch.out")
lock_there "$T/ck" || fail "the nftables table CRIU's dump left is not there"
killed_at "$T/ck" post-restore
lock_there "$T/ck" || fail "post-restore: the checkpoint's lock is gone after the killed restore"
pass "nftables, killed before CRIU's unlock: the checkpoint's lock stays (none of the restore's own), the processes ended"
killed_at "$T/ck" pre-resume
pass "nftables, killed after CRIU's unlock: the processes ended"
restored "$T/ck" "$T/r1.out" "$LAST" nftables

# Again under CRIU's iptables lock.
command -v iptables >/dev/null 2>&1 || fail "iptables is not installed (scripts/install-deps.sh installs it)"
CUSNAP_CRIU_NETWORK_LOCK=iptables "$CUSNAP" checkpoint tcp -o "$T/ck-ipt" >"$T/ck-ipt.out" 2>&1 ||
  fail "checkpoint with the iptables lock failed: $(cat "$T/ck-ipt.out")"
wait_exit "$SUP"
wait_gone "$PID"
LAST=$(last_count "$T/r1.out")
lock_there "$T/ck-ipt" || fail "$(criu_iptables_rules) rules of CRIU's after the checkpoint, expected 4"
killed_at "$T/ck-ipt" post-restore
lock_there "$T/ck-ipt" || fail "post-restore: the checkpoint's iptables rules are gone after the killed restore"
pass "iptables, killed before CRIU's unlock: the checkpoint's 4 rules stay, the processes ended"
killed_at "$T/ck-ipt" pre-resume
pass "iptables, killed after CRIU's unlock: the processes ended"
restored "$T/ck-ipt" "$T/r2.out" "$LAST" iptables
kill -TERM "$SUP"
wait_exit "$SUP"
wait_gone "$PID"

# The driver restore fails only where the simulated driver injects it; on the
# real driver the restore would succeed and supervise the job for ever.
if fake_only "driver fault injection (FAKECUDA_FAIL)"; then
  launch tcpcuda "$T/cuda.out" python3 "$(dirname "$0")/tcp_pair.py" --cuda-child "$PATTERN_JOB"
  SUP=$LAST_SUPERVISOR
  wait_count "$T/cuda.out" 5
  PID=$(wait_job tcpcuda)
  "$CUSNAP" checkpoint tcpcuda -o "$T/ck-cuda" >"$T/ck-cuda.out" 2>&1 || fail "checkpoint of tcpcuda failed: $(cat "$T/ck-cuda.out")"
  wait_exit "$SUP"
  wait_gone "$PID"
  LAST=$(last_count "$T/cuda.out")
  [ "$(job_pids "$T/ck-cuda" | wc -w)" = 3 ] || fail "tcpcuda: the checkpoint does not hold 3 processes: $(job_pids "$T/ck-cuda")"
  rc=0
  FAKECUDA_FAIL="cuCheckpointProcessRestore:1:999" "$CUSNAP" restore "$T/ck-cuda" >"$T/fail-cuda.out" 2>&1 || rc=$?
  [ "$rc" = 1 ] || fail "driver-fail: the restore exited $rc, expected 1: $(cat "$T/fail-cuda.out")"
  grep -q "the restored processes were killed; the checkpoint $T/ck-cuda is unchanged" "$T/fail-cuda.out" ||
    fail "driver-fail: $(cat "$T/fail-cuda.out")"
  for pid in $(job_pids "$T/ck-cuda"); do wait_gone "$pid" 10; done
  # Closed in repair mode, the connection leaves no socket behind; closed the
  # ordinary way, the side that closed first stays in TIME-WAIT for a minute
  # (on the listener's port, the next restore is refused).
  job_said PAIR_PORT "$T/cuda.out" "pair port "
  left=$(python3 - "$PAIR_PORT" <<'PY'
import sys
port = "%04X" % int(sys.argv[1])
with open("/proc/net/tcp") as f:
    next(f)
    print(sum(1 for l in f if port in (l.split()[1][-4:], l.split()[2][-4:]) and l.split()[3] == "06"))
PY
  )
  [ "$left" = 0 ] || fail "driver-fail: the killed restore left $left socket(s) of the job's connection in TIME-WAIT"
  restored "$T/ck-cuda" "$T/r3.out" "$LAST" driver-fail
  kill -TERM "$SUP"
  wait_exit "$SUP"
fi
echo "PASS"
