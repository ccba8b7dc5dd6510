#!/usr/bin/env bash
# A job whose two processes talk over an established TCP connection on the
# loopback (as torchrun's store and NCCL's bootstrap do) is checkpointed,
# stopped and restored: CRIU saves the connection (--tcp-established, which the
# manifest records) and both processes go on exchanging, exactly where they
# stopped, with nothing lost on the connection.
# Both processes also listen on 127.0.0.1 on one port with SO_REUSEADDR and
# SO_REUSEPORT, as NCCL's RAS subsystem does in every NCCL process (on its
# fixed port 28028; here a free port the parent picks, which the forked child
# binds again): after the restore both listeners are there again and accept.
# Then the same under CRIU's iptables lock.
source "$(dirname "$0")/lib_checkpoint.sh"


# listeners PORT: how many sockets listen on 127.0.0.1:PORT, from
# /proc/net/tcp (state 0A; address and port in hex, the address in host byte
# order), which every machine has (ss is not everywhere).
listeners() {
  python3 - "$1" <<'PY'
import sys
want = "0100007F:%04X" % int(sys.argv[1])
with open("/proc/net/tcp") as f:
    next(f)
    print(sum(1 for line in f if line.split()[1] == want and line.split()[3] == "0A"))
PY
}

# ras_check PORT WHEN: two sockets listen on 127.0.0.1:PORT and both accept
# (SO_REUSEPORT spreads connections over them by a hash of the client's
# address: up to 64 connections until both answered).
ras_check() {
  local n who
  n=$(listeners "$1")
  [ "$n" = 2 ] || fail "$2: $n listeners on 127.0.0.1:$1, expected 2"
  who=$(python3 - "$1" <<'PY'
import socket, sys
seen = set()
for _ in range(64):  # read to the end: the job has closed its side when this returns
    with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5) as c:
        seen.add(c.makefile().read().strip())
    if len(seen) == 2:
        break
print(" ".join(sorted(seen)))
PY
  ) || fail "$2: cannot connect to 127.0.0.1:$1"
  [ "$who" = "child parent" ] || fail "$2: only '$who' accepted on 127.0.0.1:$1"
}

launch tcp "$T/launch.out" python3 "$(dirname "$0")/tcp_pair.py"
SUP=$LAST_SUPERVISOR
wait_count "$T/launch.out" 5
PID=$(wait_job tcp)
job_said RAS_PORT "$T/launch.out" "ras port "
ras_check "$RAS_PORT" "before the checkpoint"
"$CUSNAP" checkpoint tcp -o "$T/ckpt" >"$T/ckpt.out" 2>&1 || fail "checkpoint failed: $(cat "$T/ckpt.out")"
python3 - "$T/ckpt/manifest.json" <<'PY' || fail "the manifest does not record the TCP connections"
import json, sys
assert json.load(open(sys.argv[1])).get("tcp_established") is True
PY
"$CUSNAP" inspect "$T/ckpt" >"$T/inspect.out" 2>&1 || fail "inspect failed: $(cat "$T/inspect.out")"
# The lock CRIU leaves until the restore, named by the run id its log gave.
python3 - "$T/ckpt/manifest.json" "$T/ckpt/criu/dump.log" <<'PY' || fail "the manifest does not record CRIU's run id and lock"
import json, re, sys
c = json.load(open(sys.argv[1]))["criu"]
run_id = re.search(r"CRIU run id = ([0-9a-f-]{36})", open(sys.argv[2]).read()).group(1)
assert c.get("run_id") == run_id and c.get("network_lock") == "nftables", (c, run_id)
PY
grep -q "lock: .*nftables table inet CRIU-[0-9a-f-]\{21\} drops those connections until a restore removes it" "$T/inspect.out" ||
  fail "inspect does not name CRIU's lock: $(grep -A1 tcp "$T/inspect.out")"
line=$(grep "tcp: *established connections saved; listening on " "$T/inspect.out" || true)
[ "$(grep -o "127.0.0.1:$RAS_PORT\b" <<<"$line" | wc -l)" = 2 ] ||
  fail "inspect does not show the saved connections and both listeners: $(grep tcp "$T/inspect.out")"
wait_exit "$SUP"
wait_gone "$PID"
LAST=$(last_count "$T/launch.out")
pass "checkpointed at count $LAST with its TCP connection; stopped"
# CRIU leaves its lock on the connections until the restore.
lock=$(sed -n 's/.*nftables table inet \(CRIU-[0-9a-f-]*\) drops.*/\1/p' "$T/inspect.out")
nft_has_table "$lock" || fail "CRIU's lock $lock is not there after the checkpoint, as inspect says"

# A job without GPUs: a device map has nothing to move, and is refused.
expect_refused 3 "no process of the checkpoint used a GPU" "$CUSNAP" restore "$T/ckpt" --device-map 0=0
pass "a device map for a checkpoint without GPUs: refused"
restore_bg "$T/ckpt" "$T/restore.out"
SUP=$LAST_SUPERVISOR
wait_count "$T/restore.out" $((LAST + 5)) "" 30
FIRST=$(first_count "$T/restore.out")
[ "$FIRST" = $((LAST + 1)) ] || fail "continued at $FIRST, expected $((LAST + 1))"
if grep -q mismatch "$T/restore.out"; then fail "a number was lost on the connection"; fi
pass "restored: counts on from $FIRST over the same connection"
rc=0
nft_has_table "$lock" || rc=$?
[ "$rc" = 1 ] || fail "CRIU's lock $lock is still there after the restore (or nftables cannot be listed: $rc)"
pass "restored: CRIU's lock ($lock) is gone"
ras_check "$RAS_PORT" "after the restore"
pass "restored: both processes listen on 127.0.0.1:$RAS_PORT again (SO_REUSEPORT) and accept"

# Again under CUSNAP_CRIU_NETWORK_LOCK=iptables: CRIU's lock is then two
# rules per connection (mark 0xC114), recorded in the manifest and named by
# inspect; the restore (CRIU takes the method from its images) deletes them.
command -v iptables >/dev/null 2>&1 || fail "iptables is not installed (scripts/install-deps.sh installs it)"
PID=$(wait_job tcp)
CUSNAP_CRIU_NETWORK_LOCK=iptables "$CUSNAP" checkpoint tcp -o "$T/ckpt-ipt" >"$T/ckpt-ipt.out" 2>&1 ||
  fail "checkpoint with the iptables lock failed: $(cat "$T/ckpt-ipt.out")"
wait_exit "$SUP"
wait_gone "$PID"
python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["criu"]["network_lock"] == "iptables"' \
  "$T/ckpt-ipt/manifest.json" || fail "the manifest does not record the iptables lock"
"$CUSNAP" inspect "$T/ckpt-ipt" >"$T/inspect-ipt.out" 2>&1 || fail "inspect failed: $(cat "$T/inspect-ipt.out")"
grep -q "lock: .*CRIU's iptables rules (mark 0xC114) drop those connections until a restore removes them" \
  "$T/inspect-ipt.out" || fail "inspect does not name the iptables lock: $(grep -A1 tcp "$T/inspect-ipt.out")"
[ "$(criu_iptables_rules)" = 4 ] || fail "$(criu_iptables_rules) rules of CRIU's after the checkpoint, expected 4 (two sockets)"
LAST=$(last_count "$T/restore.out")
restore_continues "$T/ckpt-ipt" "$T/restore-ipt.out" tcp "$PID" "$LAST"
wait_count "$T/restore-ipt.out" $((LAST + 10)) "" 30
grep -q mismatch "$T/restore-ipt.out" && fail "iptables lock: a number was lost on the connection"
[ "$(criu_iptables_rules)" = 0 ] || fail "$(criu_iptables_rules) rules of CRIU's left after the restore"
pass "iptables lock: checkpointed at $LAST with 4 rules in place, restored from $FIRST, the rules gone"
kill -TERM "$SUP"
wait_exit "$SUP"
echo "PASS"
