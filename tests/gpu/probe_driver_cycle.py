#!/usr/bin/env python3
"""probe_driver_cycle.py: the bare driver's checkpoint cycle on running processes.

    python3 tests/gpu/probe_driver_cycle.py PID[,PID...] [par|seq] [--pause S]

No cusnap: calls cuCheckpointProcessLock (30 s timeout; all processes at
once with "par", the default, one after another with "seq"), then
cuCheckpointProcessCheckpoint, waits S seconds (default 2),
cuCheckpointProcessRestore and cuCheckpointProcessUnlock on each process in
the order given, and prints each call's result, its seconds and the
process's state afterwards (0 running, 1 locked, 2 checkpointed). Run as root
on a GPU machine, against processes that use the same driver. Measures what
the driver does by itself (docs/design.md, "Ranks that share a GPU").
"""
import ctypes
import sys
import threading
import time


class LockArgs(ctypes.Structure):
    _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint),
                ("reserved1", ctypes.c_uint64 * 7)]


Args = ctypes.c_uint64 * 8  # the checkpoint, restore and unlock arguments, zeroed


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    pids = [int(p) for p in sys.argv[1].split(",")]
    parallel = "seq" not in sys.argv[2:]
    pause = float(sys.argv[sys.argv.index("--pause") + 1]) if "--pause" in sys.argv else 2.0
    cu = ctypes.CDLL("libcuda.so.1")
    print("cuInit", cu.cuInit(0))

    def state(pid):
        s = ctypes.c_int(-1)
        r = cu.cuCheckpointProcessGetState(pid, ctypes.byref(s))
        return r, s.value

    def call(name, pid, args):
        t = time.time()
        r = getattr(cu, name)(pid, ctypes.byref(args))
        return r, round(time.time() - t, 3)

    locked = {}

    def lock(pid):
        locked[pid] = call("cuCheckpointProcessLock", pid, LockArgs(30000))

    if parallel:
        threads = [threading.Thread(target=lock, args=(p,)) for p in pids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for p in pids:
            lock(p)
    for p in pids:
        print("lock", p, locked[p], state(p))
    for p in pids:
        print("checkpoint", p, call("cuCheckpointProcessCheckpoint", p, Args()), state(p))
    time.sleep(pause)
    for p in pids:
        print("restore", p, call("cuCheckpointProcessRestore", p, Args()), state(p))
    for p in pids:
        print("unlock", p, call("cuCheckpointProcessUnlock", p, Args()), state(p))


if __name__ == "__main__":
    main()
