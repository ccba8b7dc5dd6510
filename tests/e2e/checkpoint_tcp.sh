#!/usr/bin/env bash
# A job whose two processes talk over an established TCP connection on the
# loopback (as torchrun's store and NCCL's bootstrap do) is checkpointed,
# stopped and restored: CRIU saves the connection (--tcp-established, which the
# manifest records) and both processes go on exchanging, exactly where they
# stopped, with nothing lost on the connection.
source "$(dirname "$0")/lib_checkpoint.sh"

cat >"$T/tcp_pair.py" <<'PY'
import os, socket, sys, time
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
port = srv.getsockname()[1]
if os.fork() == 0:  # the client: echoes every number it gets, plus one
    srv.close()
    c = socket.create_connection(("127.0.0.1", port))
    f = c.makefile("rw")
    for line in f:
        f.write(f"{int(line) + 1}\n")
        f.flush()
    sys.exit(0)
s, _ = srv.accept()
f = s.makefile("rw")
n = 0
while True:
    n += 1
    f.write(f"{n * 2}\n")
    f.flush()
    got = int(f.readline())
    if got != n * 2 + 1:
        print(f"mismatch: sent {n * 2}, got {got}", flush=True)
        sys.exit(3)
    print(f"count {n} ok", flush=True)
    time.sleep(0.02)
PY

launch tcp "$T/launch.out" python3 "$T/tcp_pair.py"
SUP=$LAST_SUPERVISOR
wait_count "$T/launch.out" 5
PID=$(wait_job tcp)
"$CUSNAP" checkpoint tcp -o "$T/ckpt" >"$T/ckpt.out" 2>&1 || fail "checkpoint failed: $(cat "$T/ckpt.out")"
python3 - "$T/ckpt/manifest.json" <<'PY' || fail "the manifest does not record the TCP connections"
import json, sys
assert json.load(open(sys.argv[1])).get("tcp_established") is True
PY
wait_exit "$SUP"
wait_gone "$PID"
LAST=$(last_count "$T/launch.out")
pass "checkpointed at count $LAST with its TCP connection; stopped"

restore_bg "$T/ckpt" "$T/restore.out"
SUP=$LAST_SUPERVISOR
wait_count "$T/restore.out" $((LAST + 5)) "" 30
FIRST=$(first_count "$T/restore.out")
[ "$FIRST" = $((LAST + 1)) ] || fail "continued at $FIRST, expected $((LAST + 1))"
if grep -q mismatch "$T/restore.out"; then fail "a number was lost on the connection"; fi
pass "restored: counts on from $FIRST over the same connection"
kill -TERM "$SUP"
wait_exit "$SUP"
echo "PASS"
