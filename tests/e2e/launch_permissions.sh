#!/usr/bin/env bash
# The runtime directory is 0700, the socket and job.json 0600; a peer that is
# neither root nor the job's owner is refused even when it reaches the socket.
source "$(dirname "$0")/lib_launch.sh"

launch_bg perm sleep 60
dir="$CUSNAP_RUNTIME_BASE/perm"
expect_eq "base dir mode" 700 "$(stat -c %a "$CUSNAP_RUNTIME_BASE")"
expect_eq "job dir mode" 700 "$(stat -c %a "$dir")"
expect_eq "socket mode" 600 "$(stat -c %a "$dir/control.sock")"
expect_eq "job.json mode" 600 "$(stat -c %a "$dir/job.json")"
expect_eq "output.log mode" 600 "$(stat -c %a "$dir/output.log")"

[ "$(id -u)" = 0 ] || { echo "SKIP: switching uid needs root"; exit 77; }
command -v setpriv >/dev/null || { echo "SKIP: setpriv missing"; exit 77; }
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
PY3=/usr/bin/python3
[ -x "$PY3" ] || PY3=$(command -v python3)

# Through the filesystem: nobody cannot even reach the socket.
rc=$(run_status as_nobody "$CUSNAP" inspect "$dir" 2>"$SCRATCH/e1")
[ "$rc" != 0 ] || fail "nobody inspected the job"
pass "nobody cannot reach the job through its directory (rc $rc)"

# Through the socket itself, opened up on purpose: the peer check refuses.
chmod 0711 "$CUSNAP_RUNTIME_BASE" "$dir"
chmod 0666 "$dir/control.sock"
as_nobody "$PY3" - "$dir/control.sock" >"$SCRATCH/peer.out" <<'PY' || fail "raw client failed: $(cat "$SCRATCH/peer.out")"
import socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(5)
s.connect(sys.argv[1])
data = b""
while True:
    chunk = s.recv(4096)
    if not chunk:
        break
    data += chunk
n = struct.unpack("<I", data[:4])[0]
assert len(data) == 4 + n, (len(data), n)
print(data[4:].decode("latin-1"))
PY
grep -q "permission denied: uid 65534" "$SCRATCH/peer.out" || fail "no refusal: $(cat "$SCRATCH/peer.out")"
pass "a non-owner peer is refused by the supervisor"
chmod 0700 "$CUSNAP_RUNTIME_BASE" "$dir"

# The owner (root here) is still served.
"$CUSNAP" inspect perm >/dev/null || fail "owner refused"
pass "the owner is served"

# A symlinked runtime directory is refused.
mkdir -p "$SCRATCH/real"
ln -s "$SCRATCH/real" "$SCRATCH/link"
rc=$(run_status "$CUSNAP" launch --runtime-dir "$SCRATCH/link" -- true 2>"$SCRATCH/e2")
expect_eq "symlinked runtime dir refused" 3 "$rc"
grep -q "symbolic link" "$SCRATCH/e2" || fail "unclear: $(cat "$SCRATCH/e2")"
# One owned by someone else too.
mkdir "$SCRATCH/other"; chown 65534:65534 "$SCRATCH/other"
rc=$(run_status "$CUSNAP" launch --runtime-dir "$SCRATCH/other" -- true 2>"$SCRATCH/e3")
expect_eq "foreign runtime dir refused" 3 "$rc"
grep -q "owned by uid 65534" "$SCRATCH/e3" || fail "unclear: $(cat "$SCRATCH/e3")"
