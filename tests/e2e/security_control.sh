#!/usr/bin/env bash
# The control socket under bad input: garbage, an oversized or truncated
# frame, a wrong protocol version, an unknown or malformed request,
# descriptors attached, stalled connections beyond the connection limit.
# None crashes or wedges the supervisor, none leaks a descriptor in it, and
# the job keeps running with its pattern intact. A request from another uid
# (65534, through a socket opened up on purpose) is refused, a checkpoint
# request included, and creates nothing.
source "$(dirname "$0")/lib_checkpoint.sh"
source "$(dirname "$0")/lib_reliability.sh"

"$CUSNAP" launch --name ctl --control-timeout 1 -- "$PATTERN_JOB" --mib 4 --interval-ms 20 \
  >"$T/ctl.out" 2>&1 &
SUPERVISORS+=($!)
SUP=$!
wait_count "$T/ctl.out" 3
PID=$(wait_job ctl)
SOCK=$CUSNAP_RUNTIME_BASE/ctl/control.sock

cat >"$T/client.py" <<'PY'
import array, os, socket, struct, sys, time

def mp_str(s):
    b = s.encode()
    return (bytes([0xa0 | len(b)]) if len(b) < 32 else bytes([0xd9, len(b)])) + b

def body(version, typ, payload=b"\x80"):
    return b"\x93" + bytes([version]) + mp_str(typ) + payload

def frame(b):
    return struct.pack("<I", len(b)) + b

def conn():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(sys.argv[1])
    return s

def exchange(data, fds=()):
    """Sends data (descriptors on the first byte), returns what comes back until EOF."""
    s = conn()
    if fds:
        s.sendmsg([data[:1]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        data = data[1:]
    try:
        if data:
            s.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass  # closed early (a refusal is sent before the request is read): read what came
    out = b""
    try:
        while True:
            c = s.recv(65536)
            if not c:
                break
            out += c
    except socket.timeout:
        out += b"<timeout>"
    except ConnectionResetError:
        out += b"<reset>"
    s.close()
    return out

case = sys.argv[2]
null = os.open("/dev/null", os.O_RDONLY)
if case == "garbage":
    print(exchange(os.urandom(4096)))
elif case == "oversized":
    print(exchange(struct.pack("<I", 0xFFFFFFFF) + b"x" * 100))
elif case == "zero":
    print(exchange(struct.pack("<I", 0)))
elif case == "truncated":
    print(exchange(struct.pack("<I", 1000) + b"\x93\x01"))
elif case == "version":
    print(exchange(frame(body(7, "hello"))))
elif case == "unknown":
    print(exchange(frame(body(1, "reboot"))))
elif case == "badckpt":
    print(exchange(frame(body(1, "checkpoint", b"\x81" + mp_str("dir") + mp_str("rel")))))
elif case == "fds":
    for n in (1, 2, 3):
        exchange(frame(body(1, "hello")), [null] * n)
    print(exchange(frame(body(1, "hello")), [null]))
elif case == "stall":
    held = []
    for _ in range(24):
        try:
            held.append(conn())
        except (BlockingIOError, socket.timeout, ConnectionRefusedError):
            pass  # the listen backlog is full: what a flood gets
    for s in held[:12]:
        s.send(struct.pack("<I", 100) + b"\x93")
    time.sleep(float(sys.argv[3]))
    print("held", len(held))
elif case == "ckpt-as-other":
    payload = (b"\x83" + mp_str("dir") + mp_str(sys.argv[3]) + mp_str("leave_running") + b"\xc3"
               + mp_str("timeout_ms") + b"\xcd\x27\x10")
    print(exchange(frame(body(1, "checkpoint", payload))))
elif case == "badsetting":
    # A setting no cusnap command sends (each checks it first): the
    # supervisor refuses it itself.
    payload = (b"\x84" + mp_str("dir") + mp_str(sys.argv[3]) + mp_str("leave_running") + b"\xc3"
               + mp_str("timeout_ms") + b"\xcd\x27\x10" + mp_str("settings") + b"\x81"
               + mp_str("CUSNAP_RESTORE_MEMORY_MARGIN") + mp_str("lots"))
    print(exchange(frame(body(1, "checkpoint", payload))))
PY
client() { timeout 30 python3 "$T/client.py" "$SOCK" "$@"; }

alive() {
  kill -0 "$SUP" 2>/dev/null || fail "$1: the supervisor died"
  "$CUSNAP" inspect ctl >/dev/null 2>&1 || fail "$1: the supervisor does not answer inspect"
  expect_running ctl "$PID" "$T/ctl.out" >/dev/null
  pass "$1: supervisor answers, job runs on"
}

# The first inspect loads the driver into the supervisor (descriptors of its own).
alive "before any bad input"
FDS0=$(fd_count "$SUP")
for c in garbage oversized zero truncated version; do
  client "$c" >"$T/$c.txt" 2>&1 || fail "$c: the client failed: $(cat "$T/$c.txt")"
  grep -q "Traceback" "$T/$c.txt" && fail "$c: $(cat "$T/$c.txt")"
  alive "$c"
done
grep -q "request refused: unsupported protocol version 7 (this side speaks 1)" "$T/version.txt" ||
  fail "a request of another version was not told why: $(cat "$T/version.txt")"
pass "a request of another protocol version is answered with the version spoken"
client unknown >"$T/unknown.txt"
grep -q "unknown request 'reboot'" "$T/unknown.txt" || fail "unknown request: $(cat "$T/unknown.txt")"
alive "an unknown request is answered with an error"
client badckpt >"$T/badckpt.txt"
grep -qi "malformed\|absolute" "$T/badckpt.txt" || fail "malformed checkpoint request: $(cat "$T/badckpt.txt")"
alive "a malformed checkpoint request is answered with an error"
client badsetting "$T/badset" >"$T/badset.txt"
grep -qF 'CUSNAP_RESTORE_MEMORY_MARGIN="lots" is not a size' "$T/badset.txt" ||
  fail "a checkpoint request with a bad setting was not refused for it: $(cat "$T/badset.txt")"
grep -qF 'exit_code\x03' "$T/badset.txt" ||
  fail "a checkpoint request with a bad setting was not refused with exit code 3: $(cat "$T/badset.txt")"
[ ! -e "$T/badset" ] || fail "a checkpoint request with a bad setting created $T/badset"
alive "a checkpoint request with a setting cusnap would not send is refused by the supervisor"
client fds >"$T/fds.txt"
grep -q "hello" "$T/fds.txt" || fail "a hello with a descriptor attached got no answer: $(cat "$T/fds.txt")"
alive "descriptors attached to requests"

# Stalled connections, more than the supervisor serves at once: each times
# out after --control-timeout (1 s); afterwards everything answers again.
client stall 3 >"$T/stall.txt" &
STALL=$!
sleep 1
wait "$STALL" || fail "stall client: $(cat "$T/stall.txt")"
sleep 1.5
alive "24 stalled connections"

FDS1=$(fd_count_settled "$SUP" "$FDS0")
[ "$FDS1" -le "$FDS0" ] || fail "the supervisor holds $FDS1 descriptors after the bad input, $FDS0 before"
pass "no descriptor leaked in the supervisor ($FDS0 before, $FDS1 after)"

# Another uid, through a socket opened up on purpose: refused before the
# request is read; the checkpoint it asked for is not made.
if command -v setpriv >/dev/null; then
  chmod 0711 "$CUSNAP_RUNTIME_BASE" "$CUSNAP_RUNTIME_BASE/ctl" "$T"
  chmod 0666 "$SOCK"
  setpriv --reuid=65534 --regid=65534 --clear-groups \
    timeout 30 python3 "$T/client.py" "$SOCK" ckpt-as-other "$T/stolen" >"$T/other.txt" 2>&1 ||
    fail "client as uid 65534: $(cat "$T/other.txt")"
  chmod 0700 "$CUSNAP_RUNTIME_BASE" "$CUSNAP_RUNTIME_BASE/ctl"
  chmod 0600 "$SOCK"
  grep -q "permission denied: uid 65534" "$T/other.txt" || fail "not refused: $(cat "$T/other.txt")"
  [ ! -e "$T/stolen" ] || fail "a checkpoint asked for by uid 65534 created $T/stolen"
  alive "a checkpoint request from uid 65534 is refused and creates nothing"
else
  echo "note: no setpriv: the other-uid case was not run"
fi
echo "PASS"
