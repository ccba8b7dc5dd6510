#!/usr/bin/env bash
# The shims' sockets admit only root and the job's owner. The runtime
# directory (0700) and the sockets (0600) keep others out already; here they
# are opened up on purpose so that the shims' own check is what answers: a
# client running as uid 65534 that asks the importer's shim to close its gate
# (and to inspect) gets the connection closed unanswered, the job keeps
# counting; the same request from root is answered (so the probe can tell).
# A request longer than the shims take (8 MiB of nils, which would decode to
# some 200 MiB inside the workload) is refused unread, even from root: the
# importer's peak memory does not grow by it and the job counts on.
source "$(dirname "$0")/lib_shared.sh"
command -v setpriv >/dev/null || skip "no setpriv: cannot act as another uid"
# A Python every uid can run (root's may live in a private directory).
PY=/usr/bin/python3
[ -x "$PY" ] || skip "no /usr/bin/python3 for the probe"

PREFIXES=("" "importer ")
LAUNCH_OUT=$T/launch.out
start_job guarded "$LAUNCH_OUT" "$SHARE_JOB" --mib 4 --interval-ms 20
RUNDIR=$CUSNAP_RUNTIME_BASE/guarded
IMPORTER=$(sed -n 's/^importer ready pid \([0-9]*\).*/\1/p' "$LAUNCH_OUT")
SOCK=$RUNDIR/shim-ctl.$IMPORTER.sock
[ -S "$SOCK" ] || fail "no control socket of the importer's shim"
[ "$(stat -c %a "$SOCK")" = 600 ] || fail "the shim's control socket is mode $(stat -c %a "$SOCK"), not 600"
[ "$(stat -c %a "$RUNDIR")" = 700 ] || fail "the runtime directory is mode $(stat -c %a "$RUNDIR"), not 700"

# probe UID TYPE: sends one framed message [1, TYPE, {}] (or gate-close with
# a timeout) and prints the reply's type, or "closed" when none came.
cat >"$T/probe.py" <<'PY'
import socket, struct, sys
path, kind = sys.argv[1], sys.argv[2]
def s(x):
    b = x.encode()
    return bytes([0xa0 | len(b)]) + b
if kind == "gate-close":
    payload = bytes([0x81]) + s("timeout_ms") + bytes([0xcd]) + struct.pack(">H", 5000)
elif kind == "big":
    kind = "inspect"
    n = 8 << 20
    payload = bytes([0xdd]) + struct.pack(">I", n) + bytes([0xc0]) * n
else:
    payload = bytes([0x80])
body = bytes([0x93, 0x01]) + s(kind) + payload
c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    c.connect(path)
except OSError as e:
    print("connect: " + e.strerror); sys.exit(0)
c.settimeout(5)
try:
    c.sendall(struct.pack("<I", len(body)) + body)
except (BrokenPipeError, ConnectionResetError):
    print("closed"); sys.exit(0)
data = b""
try:
    while len(data) < 4 or len(data) < 4 + struct.unpack("<I", data[:4])[0]:
        try:
            chunk = c.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk: break
        data += chunk
except socket.timeout:
    print("timeout"); sys.exit(0)
if len(data) < 6:
    print("closed"); sys.exit(0)
n = data[6] & 0x1f if data[6] & 0xe0 == 0xa0 else 0
print(data[7:7 + n].decode(errors="replace"))
PY
# Closed to others as launched.
OUT=$(setpriv --reuid=65534 --regid=65534 --clear-groups "$PY" "$T/probe.py" "$SOCK" inspect)
case $OUT in connect:*) ;; *) fail "uid 65534 reached the shim through the closed directory: $OUT" ;; esac
pass "uid 65534 cannot reach the shim's socket as launched ($OUT)"
BASE_MODE=$(stat -c %a "$CUSNAP_RUNTIME_BASE")
chmod 755 "$CUSNAP_RUNTIME_BASE" "$RUNDIR"
chmod 666 "$SOCK"
for kind in gate-close inspect; do
  OUT=$(setpriv --reuid=65534 --regid=65534 --clear-groups "$PY" "$T/probe.py" "$SOCK" "$kind")
  [ "$OUT" = closed ] || fail "the shim answered '$kind' from uid 65534: $OUT"
done
n=$(last_count "$LAUNCH_OUT" "importer ")
wait_count "$LAUNCH_OUT" $((n + 5)) "importer " 20
no_errors "$LAUNCH_OUT"
pass "uid 65534 through an opened socket: gate-close and inspect closed unanswered, the job counts on"
OUT=$("$PY" "$T/probe.py" "$SOCK" inspect)
[ "$OUT" = records ] || fail "root's inspect got '$OUT', not records"
pass "root's inspect is answered (records)"
hwm() { sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$IMPORTER/status"; }
HWM0=$(hwm)
OUT=$("$PY" "$T/probe.py" "$SOCK" big)
[ "$OUT" = closed ] || fail "the shim answered an 8 MiB request: $OUT"
n=$(last_count "$LAUNCH_OUT" "importer ")
wait_count "$LAUNCH_OUT" $((n + 5)) "importer " 20
HWM1=$(hwm)
[ -n "$HWM0" ] && [ -n "$HWM1" ] || fail "cannot read the importer's VmHWM"
[ $((HWM1 - HWM0)) -lt 32768 ] || fail "the importer's peak memory grew by $(((HWM1 - HWM0) / 1024)) MiB on an oversized request"
OUT=$("$PY" "$T/probe.py" "$SOCK" inspect)
[ "$OUT" = records ] || fail "after the oversized request root's inspect got '$OUT', not records"
no_errors "$LAUNCH_OUT"
pass "an 8 MiB request is refused unread (peak memory +$((HWM1 - HWM0)) KiB), the shim answers on, the job counts on"
chmod 700 "$RUNDIR"
chmod "$BASE_MODE" "$CUSNAP_RUNTIME_BASE"
stop_job "$LAUNCH_OUT"
echo "PASS"
