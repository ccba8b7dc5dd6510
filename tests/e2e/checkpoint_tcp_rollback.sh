#!/usr/bin/env bash
# A checkpoint of a job whose two processes talk over an established TCP
# connection fails after CRIU has locked that connection, and the job runs on
# with the connection working (criu_leftovers.h). Dumping it, CRIU puts the
# sockets into repair mode (a send fails with EINVAL) and drops their packets
# through an nftables table "inet CRIU-<run id>"; it lifts neither when it is
# killed, nor after a successful dump under --leave-stopped. Two cases:
#   timeout    CRIU is held at post-dump past the
#              checkpoint's --timeout and killed: the job is stopped before
#              the kill, the roll back removes the table, takes the sockets
#              out of repair mode and continues the job
#   disk full  while CRIU is held at post-dump, the file system the
#              checkpoint is written to is filled: CRIU succeeds (the lock
#              stays, the job stopped), the manifest cannot be written, and
#              the roll back lifts the lock the same way
# In both the checkpoint exits 1 saying the job runs on and what was lifted,
# the job counts on over its connection with nothing lost, and the table
# CRIU named is gone. CRIU is held at post-dump through lib_checkpoint.sh's
# criu_hold_at (its action script waits there until criu_release). Then the same where the supervisor is killed
# while CRIU is held at post-dump, so that its guardian recovers the job:
#   guardian finish  CRIU is let go 2 s later and succeeds (the lock stays)
#   guardian hung    CRIU is held until the guardian kills it (after
#                    CUSNAP_GUARDIAN_CRIU_WAIT_MS=2000)
# the guardian lifts the lock before the job runs again, and says so; and
#   guardian after   CRIU succeeds while the supervisor is stopped, which is
#                    then killed: no CRIU is left to say how it locked the
#                    job, the guardian lifts the lock from what the
#                    supervisor told it as the dump began. The
# timeout case again with CRIU's iptables lock. And a
# CRIU that fails to take its lock (no nftables here): the checkpoint says
# which variable to set.
source "$(dirname "$0")/lib_checkpoint.sh"

SMALL=$T/small
mkdir -p "$SMALL"
# The supervisors' CRIU: lib_checkpoint.sh's $HOLD_CRIU (the real CRIU with
# the hold's action script), or, while $T/nolock exists, a dump that fails
# taking its lock.
criu_hold_setup
cat >"$T/criu" <<SH
#!/bin/sh
if [ "\$1" = dump ] && [ -e "$T/nolock" ]; then
  # As CRIU fails where the kernel has no nftables: its log, exit 1.
  while [ \$# -gt 0 ]; do
    case \$1 in -W) work=\$2 ;; -o) log=\$2 ;; esac
    shift
  done
  printf '(00.000000) CRIU run id = 00000000-1111-2222-3333-444444444444\\n(00.040606) net: Lock network\\n(00.040700) Error (criu/netfilter.c:214): Locking network failed using nftables\\n' >"\$work/\$log"
  exit 1
fi
exec "$HOLD_CRIU" "\$@"
SH
chmod 755 "$T/criu"
export CUSNAP_CRIU=$T/criu

TCP_PAIR=$(dirname "$0")/tcp_pair.py  # counts over its connection

# lifted CASE FILE OUT [iptables]: FILE (the checkpoint's output, or the
# guardian's log) says CRIU's lock was lifted: the nftables table (or with
# iptables, CRIU's 4 rules: two sockets, two each) removed, the sockets out
# of repair mode; none of it is left, and the job (counting into OUT) counts
# on over its connection with nothing lost.
lifted() {
  local name=$1 file=$2 out=$3 id last rc=0
  if [ "${4:-nftables}" = iptables ]; then
    grep -q "CRIU's network lock (4 iptables rule(s)) removed" "$file" ||
      fail "$name: nothing says CRIU's 4 iptables rules were removed: $(grep 'cusnap' "$file")"
    [ "$(criu_iptables_rules)" = 0 ] || fail "$name: $(criu_iptables_rules) rules of CRIU's are left"
    LIFTED="CRIU's 4 rules removed"
  else
    id=$(sed -n 's/.*nftables table inet CRIU-\([0-9a-f-]*\)) removed.*/\1/p' "$file" | head -1)
    [ -n "$id" ] || fail "$name: nothing says CRIU's nftables lock was removed: $(grep 'cusnap' "$file")"
    nft_has_table "CRIU-$id" || rc=$?
    [ "$rc" = 1 ] || fail "$name: the table inet CRIU-$id is still there (or nftables cannot be listed: $rc)"
    LIFTED="table CRIU-$id removed"
  fi
  grep -q "TCP socket(s) of the job taken out of repair mode" "$file" ||
    fail "$name: nothing says the sockets left repair mode: $(grep 'cusnap' "$file")"
  last=$(last_count "$out")
  wait_count "$out" $((last + 20)) "" 20
  grep -q mismatch "$out" && fail "$name: a number was lost on the connection"
  LIFTED="$LIFTED, the job counts on past $((last + 20)) over its connection"
}

# rolled_back CASE OUT [iptables]: the checkpoint (output OUT) failed, said
# the job runs on and that CRIU's lock was lifted (lifted).
rolled_back() {
  grep -q "the job runs on unchanged" "$2" || fail "$1: the job does not run on: $(cat "$2")"
  lifted "$1" "$2" "$T/launch.out" "${3:-nftables}"
  kill -0 "$PID" 2>/dev/null || fail "$1: the job is gone"
  pass "$1: checkpoint failed, $LIFTED"
}

launch tcp "$T/launch.out" python3 "$TCP_PAIR"
SUP=$LAST_SUPERVISOR
wait_count "$T/launch.out" 5
PID=$(wait_job tcp)

# timed_out CASE OUT [VAR=VALUE...]: a checkpoint (output OUT, in that
# environment) whose CRIU is held at post-dump past --timeout 5 and killed.
timed_out() {
  local name=$1 out=$2 rc=0
  shift 2
  criu_hold_at post-dump
  env "$@" "$CUSNAP" checkpoint tcp -o "$T/$name.ck" --timeout 5 >"$out" 2>&1 || rc=$?
  criu_held 1 || fail "$name: CRIU's dump did not reach post-dump: $(cat "$out")"
  criu_release
  [ "$rc" = 1 ] || fail "$name: the checkpoint exited $rc, expected 1: $(cat "$out")"
  grep -q "timed out after .* and was killed" "$out" ||
    fail "$name: the checkpoint does not say CRIU was killed: $(cat "$out")"
}

# timeout: CRIU held at post-dump past --timeout 5, then killed.
timed_out timeout "$T/ck1.out"
rolled_back timeout "$T/ck1.out"

# iptables: the same under CUSNAP_CRIU_NETWORK_LOCK=iptables, whose lock is
# two rules per connection (mark 0xC114) that the roll back deletes.
command -v iptables >/dev/null 2>&1 ||
  fail "iptables is not installed (scripts/install-deps.sh installs it): the iptables case cannot run"
timed_out iptables "$T/ipt.out" CUSNAP_CRIU_NETWORK_LOCK=iptables
rolled_back iptables "$T/ipt.out" iptables

# disk full: the checkpoint's file system filled once CRIU has written it.
if mount -t tmpfs -o size=256m tmpfs "$SMALL" 2>/dev/null; then
  # shellcheck disable=SC2154 # st is assigned inside the trap
  trap 'st=$?; set +e; mountpoint -q "$SMALL" && umount -l "$SMALL"; (exit $st); cleanup_checkpoint_test' EXIT
  criu_hold_at post-dump
  "$CUSNAP" checkpoint tcp -o "$SMALL/ck2" >"$T/ck2.out" 2>&1 &
  ck=$!
  criu_held 30 || fail "disk full: CRIU's dump did not reach post-dump: $(cat "$T/ck2.out")"
  dd if=/dev/zero of="$SMALL/fill" bs=1M 2>/dev/null || true
  [ "$(df --output=avail -k "$SMALL" | tail -1)" -lt 64 ] || fail "disk full: $SMALL was not filled"
  criu_release
  rc=0
  wait "$ck" || rc=$?
  [ "$rc" = 1 ] || fail "disk full: the checkpoint exited $rc, expected 1: $(cat "$T/ck2.out")"
  grep -q "manifest phase: .*No space left on device" "$T/ck2.out" ||
    fail "disk full: the checkpoint does not say the manifest could not be written: $(cat "$T/ck2.out")"
  [ ! -e "$SMALL/ck2" ] || fail "disk full: the unfinished checkpoint $SMALL/ck2 was left"
  rolled_back "disk full" "$T/ck2.out"
else
  echo "note: cannot mount a tmpfs here; the disk-full case was not run"
fi

# A CRIU that cannot take its lock (no nftables): the checkpoint says what
# to set, and the job runs on.
: >"$T/nolock"
rc=0
"$CUSNAP" checkpoint tcp -o "$T/ck-nolock" >"$T/nolock.out" 2>&1 || rc=$?
rm -f "$T/nolock"
[ "$rc" = 1 ] || fail "no lock: the checkpoint exited $rc, expected 1: $(cat "$T/nolock.out")"
grep -q "could not lock the job's TCP connections with nftables (CUSNAP_CRIU_NETWORK_LOCK)" "$T/nolock.out" ||
  fail "no lock: the checkpoint does not say what to set: $(cat "$T/nolock.out")"
grep -q "the job runs on unchanged" "$T/nolock.out" || fail "no lock: the job does not run on: $(cat "$T/nolock.out")"
last=$(last_count "$T/launch.out")
wait_count "$T/launch.out" $((last + 10)) "" 20
pass "no lock: the checkpoint names CUSNAP_CRIU_NETWORK_LOCK, the job counts on"

# guardian_case NAME WAIT_MS [after]: a job of its own whose supervisor is
# killed while CRIU is held at post-dump; the guardian recovers it. With
# "after", the supervisor is stopped instead, CRIU let go to end its dump
# (successfully: the job left stopped, its connections locked), and the
# supervisor killed then: no CRIU is left for the guardian to ask how it
# ran, so it lifts the lock from what the supervisor told it as the dump began.
guardian_case() {
  local name=$1 out=$T/$1.out log=$CUSNAP_RUNTIME_BASE/$1/output.log sup pid ck rc=0 st
  CUSNAP_GUARDIAN_CRIU_WAIT_MS=$2 "$CUSNAP" launch --name "$name" -- python3 "$TCP_PAIR" >"$out" 2>&1 &
  sup=$!
  SUPERVISORS+=("$sup")
  wait_count "$out" 5
  pid=$(wait_job "$name")
  criu_hold_at post-dump
  "$CUSNAP" checkpoint "$name" -o "$T/$name.ck" >"$T/$name.ck.out" 2>&1 &
  ck=$!
  criu_held 30 || fail "$name: CRIU's dump did not reach post-dump: $(cat "$T/$name.ck.out")"
  if [ "${3:-}" = after ]; then
    kill -STOP "$sup"
    criu_release
    # CRIU ends, a zombie: its parent, the supervisor, is stopped.
    for _ in $(seq 1 600); do
      st=$(awk '{print $3}' "/proc/$HELD_CRIU/stat" 2>/dev/null || echo gone)
      [ "$st" = Z ] || [ "$st" = gone ] && break
      sleep 0.05
    done
    [ "$st" = Z ] || [ "$st" = gone ] || fail "$name: CRIU did not end after its hold (state $st)"
    grep -q "Dumping finished successfully" "$TMPDIR"/cusnap-dump-"$sup"-*/dump.log 2>/dev/null ||
      fail "$name: CRIU's dump did not succeed"
  fi
  kill -KILL "$sup"
  kill -CONT "$sup" 2>/dev/null || true
  wait "$sup" 2>/dev/null || true
  [ "$2" -gt 10000 ] && [ "${3:-}" != after ] && { sleep 2; criu_release; }
  wait "$ck" || rc=$?
  [ "$rc" != 0 ] || fail "$name: the checkpoint reported success after its supervisor was killed"
  for _ in $(seq 1 600); do grep -q "guardian: the job runs on" "$log" 2>/dev/null && break; sleep 0.05; done
  criu_release
  grep -q "guardian: the job runs on, supervised by process" "$log" ||
    fail "$name: the guardian did not bring the job back: $(grep 'cusnap:' "$log" 2>/dev/null)"
  lifted "$name" "$log" "$log"
  kill -0 "$pid" 2>/dev/null || fail "$name: the job is gone"
  pass "$name: supervisor killed ${3:-mid-dump}; the guardian lifted the lock: $LIFTED"
  kill -TERM "$pid" 2>/dev/null || true
}
guardian_case guardian-finish 60000
guardian_case guardian-hung 2000
guardian_case guardian-after 60000 after

# And the job still checkpoints and restores.
rm -f "$SMALL/fill"
"$CUSNAP" checkpoint tcp -o "$T/ck3" >"$T/ck3.out" 2>&1 || fail "checkpoint failed: $(cat "$T/ck3.out")"
wait_exit "$SUP"
wait_gone "$PID"
LAST=$(last_count "$T/launch.out")
restore_continues "$T/ck3" "$T/restore.out" tcp "$PID" "$LAST"
pass "then checkpointed at $LAST and restored, counting on from $FIRST"
kill -TERM "$SUP"
wait_exit "$SUP"
echo "PASS"
