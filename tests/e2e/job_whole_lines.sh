#!/usr/bin/env bash
# The test jobs that print "count N ok" write each line in one write(2), also
# with PYTHONUNBUFFERED=1 (set in some environments, and by python3 -u),
# under which print() writes the text and its newline in two. A checkpoint
# that froze the job between the two split the line between the launch's
# output and the restored job's: "count N ok" ended the first without its
# newline, glued to the supervisor's "cusnap: job ... checkpointed" line, and
# the restored output began with the lone newline; the tests, reading counts
# line by line, saw the restored job begin at LAST + 2 (reliability_restore_
# killed_tcp.sh, about one run in ten). Nothing was lost: every byte was in
# one output or the other.
# The job's stdout here is a datagram socket, which keeps each write whole:
# every datagram must be one whole line. No root, CRIU or build needed.
set -euo pipefail
DIR=$(cd "$(dirname "$0")" && pwd)
PYTHONUNBUFFERED=1 python3 - "$DIR/tcp_pair.py" <<'PY'
import os, signal, socket, subprocess, sys, time
job = sys.argv[1]
mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
p = subprocess.Popen([sys.executable, job], stdout=theirs, stdin=subprocess.DEVNULL,
                     start_new_session=True)
theirs.close()
mine.settimeout(10)
writes, counts = [], 0
try:
    while counts < 10:
        d = mine.recv(65536)
        writes.append(d)
        if d.startswith(b"count "):
            counts += 1
        if not d.endswith(b"\n") or d.count(b"\n") != 1:
            break
finally:
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
bad = [d for d in writes if not d.endswith(b"\n") or d.count(b"\n") != 1]
if bad:
    print(f"FAIL: {job} wrote a line in pieces: {writes!r}")
    sys.exit(1)
print(f"ok: {os.path.basename(job)}: {len(writes)} writes, each one whole line ({counts} counts)")
PY
echo PASS
