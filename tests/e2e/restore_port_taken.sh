#!/usr/bin/env bash
# A job listening on a TCP port (an inference server, say) is checkpointed and
# stopped; meanwhile another process listens on that port (a fresh instance of
# the server). The restore is refused before CRIU runs, naming the port and the
# process that holds it, with the exit status of a failed precondition (3),
# also as JSON; nothing of the job is left running. Once that process is gone
# the same checkpoint restores: the job counts on and its listener accepts.
source "$(dirname "$0")/lib_checkpoint.sh"

cat >"$T/serve.py" <<'PY'
import os, socket, threading, time
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0))
srv.listen(8)
print(f"port {srv.getsockname()[1]}", flush=True)

def serve():
    while True:
        c, _ = srv.accept()
        c.sendall(b"hello\n")
        c.close()

threading.Thread(target=serve, daemon=True).start()
n = 0
while True:
    n += 1
    os.write(1, f"count {n} ok\n".encode())  # one write: see tcp_pair.py
    time.sleep(0.05)
PY

# squat ADDR PORT: a process that listens on ADDR:PORT (SO_REUSEADDR, as
# servers set it; no SO_REUSEPORT), in the background; sets SQUAT to its pid.
squat() {
  rm -f "$T/squat.ready"
  python3 -c '
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1)
open(sys.argv[3], "w").close()
time.sleep(600)' "$1" "$2" "$T/squat.ready" >"$T/squat.out" 2>&1 &
  SQUAT=$!
  echo "$SQUAT" >>"$T/job-pids"
  for _ in $(seq 1 100); do
    [ -e "$T/squat.ready" ] && return 0
    kill -0 "$SQUAT" 2>/dev/null || fail "the squatter could not listen on $1:$2: $(cat "$T/squat.out")"
    sleep 0.05
  done
  fail "the squatter did not listen on $1:$2"
}

unsquat() {
  kill "$SQUAT" 2>/dev/null || true
  wait "$SQUAT" 2>/dev/null || true
  sed -i "/^$SQUAT\$/d" "$T/job-pids"  # the cleanup must not kill a reused pid
}

# refused_while_squatted ADDR WHAT: with the squatter on ADDR:$PORT the restore
# fails with 3, names 127.0.0.1:$PORT and the squatter, before CRIU ran, and
# leaves no job process and the squatter listening.
refused_while_squatted() {
  squat "$1" "$PORT"
  expect_refused 3 "TCP port 127\.0\.0\.1:$PORT that the job listened on is in use by pid $SQUAT \(python3[.0-9]*\): stop that process, then restore" \
    timeout 60 "$CUSNAP" restore "$T/ckpt"
  if grep -qi "criu" "$T/cmd.out"; then fail "$2: the refusal speaks of CRIU: $(cat "$T/cmd.out")"; fi
  if ls -d "$T"/cusnap-restore-* >/dev/null 2>&1; then fail "$2: a CRIU restore ran"; fi
  [ ! -e "/proc/$PID" ] || fail "$2: process $PID of the job exists after the refused restore"
  [ -z "$(job_field serve pid)" ] || fail "$2: cusnap ps shows job serve after the refused restore"
  kill -0 "$SQUAT" 2>/dev/null || fail "$2: the squatter is gone"
  pass "$2: refused before CRIU ran, naming the port and the squatter (pid $SQUAT)"
}

launch serve "$T/launch.out" python3 "$T/serve.py"
SUP=$LAST_SUPERVISOR
wait_count "$T/launch.out" 5
PID=$(wait_job serve)
job_said PORT "$T/launch.out" "port "
"$CUSNAP" checkpoint serve -o "$T/ckpt" >"$T/ckpt.out" 2>&1 || fail "checkpoint failed: $(cat "$T/ckpt.out")"
python3 - "$T/ckpt/manifest.json" "$PORT" <<'PY' || fail "the manifest does not record the job's listener"
import json, sys
ls = json.load(open(sys.argv[1])).get("tcp_listeners")
want = {"family": 4, "addr": "127.0.0.1", "port": int(sys.argv[2]), "reuseport": False,
        "reuseaddr": True}
assert ls == [want], ls
PY
wait_exit "$SUP"
wait_gone "$PID"
LAST=$(last_count "$T/launch.out")
pass "checkpointed at count $LAST, listening on 127.0.0.1:$PORT (recorded); stopped"

refused_while_squatted 127.0.0.1 "the same address"
# --json: the failure as an object.
rc=0
timeout 60 "$CUSNAP" restore "$T/ckpt" --json >"$T/json.out" 2>"$T/json.err" || rc=$?
[ "$rc" = 3 ] || fail "restore --json exited $rc, expected 3: $(cat "$T/json.out" "$T/json.err")"
python3 - "$T/json.out" "$PORT" "$SQUAT" <<'PY' || fail "restore --json: $(cat "$T/json.out")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["ok"] is False and r["exit_code"] == 3, r
assert f"TCP port 127.0.0.1:{sys.argv[2]} that the job listened on is in use by pid {sys.argv[3]} (" in r["error"], r
PY
pass "restore --json: ok false, exit_code 3, the same error"
unsquat

# A wildcard listener takes the job's address too.
refused_while_squatted 0.0.0.0 "a squatter on 0.0.0.0"
unsquat

restore_bg "$T/ckpt" "$T/restore.out"
SUP=$LAST_SUPERVISOR
wait_count "$T/restore.out" $((LAST + 5)) "" 30
FIRST=$(first_count "$T/restore.out")
[ "$FIRST" = $((LAST + 1)) ] || fail "continued at $FIRST, expected $((LAST + 1))"
got=$(python3 -c '
import socket, sys
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5) as c:
    print(c.makefile().readline().strip())' "$PORT") || fail "cannot connect to the restored job on 127.0.0.1:$PORT"
[ "$got" = hello ] || fail "the restored listener answered '$got'"
pass "with the port free: restored, counts on from $FIRST, and accepts on 127.0.0.1:$PORT"
kill -TERM "$SUP"
wait_exit "$SUP"
echo "PASS"
