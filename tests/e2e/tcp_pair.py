# A job of two processes that talk over an established TCP connection on the
# loopback (as torchrun's store and NCCL's bootstrap do): the parent sends
# numbers, the forked child answers each plus one, and the parent prints
# "count N ok" for every answer that is right ("mismatch: ..." and exit 3
# otherwise). Both also listen on one port of 127.0.0.1 with SO_REUSEADDR and
# SO_REUSEPORT, as NCCL's RAS subsystem does in every NCCL process (on its
# fixed port 28028; here a free port the parent picks and prints as "ras port
# N", which the child binds again); each answers a connection with its name.
# The pair's connection is made to the parent's listener, whose port it
# prints as "pair port N".
# With --cuda-child PATTERN_JOB the parent also runs cusnap-pattern-job (4
# MiB, its output dropped) as a child: a job with a CUDA process, whose driver
# restore a test can fail. Used by checkpoint_tcp.sh,
# checkpoint_tcp_rollback.sh and reliability_restore_killed_tcp.sh.
#
# Each line goes out in one write(2) (say): print() with PYTHONUNBUFFERED=1
# (or python3 -u) writes the text and its newline in two, and a checkpoint
# that froze the job between them split the line: "count N ok" ended the
# launch's output without its newline, glued to the supervisor's "cusnap: job
# ... checkpointed" line, and the restored job's output began with the
# newline alone, so that a test reading counts line by line saw N missing.
import os, socket, subprocess, sys, threading, time

def say(line):  # one line, in one write
    os.write(1, (line + "\n").encode())

def ras_listen(port):  # NCCL's RAS listener: one port shared by every process
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", port))
    s.listen(16)
    return s

def ras_serve(s, who):  # answers each connection with who accepted it
    while True:
        c, _ = s.accept()
        c.sendall(f"{who}\n".encode())
        c.close()

srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
port = srv.getsockname()[1]
ras = ras_listen(0)
ras_port = ras.getsockname()[1]
say(f"ras port {ras_port}")
say(f"pair port {port}")
if os.fork() == 0:  # the client: echoes every number it gets, plus one
    srv.close()
    ras.close()
    ras = ras_listen(ras_port)
    threading.Thread(target=ras_serve, args=(ras, "child"), daemon=True).start()
    c = socket.create_connection(("127.0.0.1", port))
    f = c.makefile("rw")
    for line in f:
        f.write(f"{int(line) + 1}\n")
        f.flush()
    sys.exit(0)
threading.Thread(target=ras_serve, args=(ras, "parent"), daemon=True).start()
if len(sys.argv) == 3 and sys.argv[1] == "--cuda-child":
    subprocess.Popen([sys.argv[2], "--mib", "4", "--interval-ms", "50"],
                     stdout=subprocess.DEVNULL)
s, _ = srv.accept()
f = s.makefile("rw")
n = 0
while True:
    n += 1
    f.write(f"{n * 2}\n")
    f.flush()
    got = int(f.readline())
    if got != n * 2 + 1:
        say(f"mismatch: sent {n * 2}, got {got}")
        sys.exit(3)
    say(f"count {n} ok")
    time.sleep(0.02)
