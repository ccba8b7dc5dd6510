#!/usr/bin/env python3
"""torch_share.py: two PyTorch processes share one CUDA tensor, the way PyTorch
clients share device memory (torch.multiprocessing, spawn context).

    python3 tests/gpu/torch_share.py [--mib N] [--alloc default|expandable|inherit]
                                     [--interval-ms M] [--check-ms C] [--seconds S]
                                     [--capture-ms G]

The main process allocates an int64 tensor of N MiB (default 64) on GPU 0 and
starts a worker process with it. PyTorch sends the worker the tensor's
allocation through CUDA IPC: with the default allocator a legacy IPC handle
(cudaIpcGetMemHandle, plus an interprocess event), with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (--alloc expandable) the
segment's POSIX-fd VMM handles, which the worker takes from the main process
with pidfd_getfd.

Layout (int64 elements): buf[0] = A, buf[8] = B, buf[64:] = data. Step k of
the worker writes A = k, then data[i] = i + k * 1000003, then B = k, and
synchronizes. Before each step the worker checks that A, B and every element
are still those of step k-1 (only the worker writes, so the importer's view of
the memory must be intact), then prints "worker count k ok".

Every --check-ms (default 100) the main process, the exporter, reads B, checks
every data element on the GPU against B, then reads A: when A == B the data it
checked belonged to step B and must all be right (a seqlock; A != B means the
worker was mid-step, and the main process reads again). B must never go back.
It prints "main count N ok" for its N-th consistent check and "main seen B"
(the worker's step it found in the shared bytes).

--capture-ms G: after each step the worker records a CUDA graph
(torch.cuda.graph, global capture mode) of one increment of a counter tensor,
keeping the capture under way G ms (a host sleep inside it, as while PyTorch
traces a model), then replays the graph once and checks the counter equals the
number of replays so far. A capture that something invalidated fails its end
(the worker dies with the error), so a checkpoint that synchronized the device
during one cannot go unseen.

A wrong element, a header that goes back or stays torn, prints a line with
MISMATCH and exits 3; a worker that ends makes the main process exit 3 (when
the worker exited 3) or 4. --seconds S: the main process stops the worker and
exits 0 after S seconds (default: run until killed). Needs no network.
"""
import argparse
import os
import sys
import time

HEADER = 64  # int64 elements before the data: A at 0, B at 8
SLOT_A = 0
SLOT_B = 8
MULT = 1000003
TORN_LIMIT = 2000  # consecutive torn reads (5 ms apart) before giving up


def say(*parts):
    print(*parts, flush=True)


def mismatch(who, text, code=3):
    msg = f"torch-share: {who}: MISMATCH: {text}"
    say(msg)
    print(msg, file=sys.stderr, flush=True)
    sys.exit(code)


def first_bad(torch, data, expected):
    bad = torch.nonzero(data != expected)
    nbad = bad.shape[0]
    if nbad == 0:
        return "no element differs on a second look (a racing write?)"
    i = int(bad[0, 0].item())
    return (f"{nbad} of {data.numel()} elements wrong; element {i} is "
            f"{int(data[i].item())}, expected {int(expected[i].item())}")


def worker(buf, interval_ms, parent_pid, capture_ms=0):
    import torch

    who = "worker"
    torch.cuda.set_device(buf.device)
    data = buf[HEADER:]
    idx = torch.arange(data.numel(), dtype=torch.int64, device=buf.device)
    expected = torch.empty_like(idx)
    k = int(buf[SLOT_B].item())
    counter = torch.zeros(1, dtype=torch.int64, device=buf.device)
    replays = 0
    say(f"worker: pid {os.getpid()}, got {buf.numel() * 8 >> 20} MiB on {buf.device} "
        f"at 0x{buf.data_ptr():x}, starting after step {k}")
    while True:
        if os.getppid() != parent_pid:
            say("worker: the main process is gone; exiting")
            sys.exit(0)
        a = int(buf[SLOT_A].item())
        b = int(buf[SLOT_B].item())
        if a != k or b != k:
            mismatch(who, f"header A={a} B={b}, expected both {k} (the worker's last step)")
        torch.add(idx, k * MULT, out=expected)
        if not torch.equal(data, expected):
            mismatch(who, f"data of step {k}: " + first_bad(torch, data, expected))
        k += 1
        buf[SLOT_A].fill_(k)
        torch.add(idx, k * MULT, out=data)
        buf[SLOT_B].fill_(k)
        torch.cuda.synchronize()
        say(f"worker count {k} ok")
        if capture_ms > 0:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                counter.add_(1)
                time.sleep(capture_ms / 1000.0)
            g.replay()
            replays += 1
            torch.cuda.synchronize()
            if int(counter.item()) != replays:
                mismatch(who, f"graph counter {int(counter.item())} after {replays} replays")
            del g
        time.sleep(interval_ms / 1000.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=64, help="size of the shared tensor (MiB)")
    ap.add_argument("--alloc", choices=["default", "expandable", "inherit"], default="inherit",
                    help="PyTorch allocator: default (legacy IPC), expandable "
                         "(expandable_segments:True, POSIX-fd VMM), inherit "
                         "(PYTORCH_CUDA_ALLOC_CONF as set)")
    ap.add_argument("--interval-ms", type=int, default=50, help="pause between worker steps")
    ap.add_argument("--check-ms", type=int, default=100, help="pause between main checks")
    ap.add_argument("--seconds", type=float, default=0,
                    help="exit 0 after this many seconds (default 0: run until killed)")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--capture-ms", type=int, default=0,
                    help="after each worker step, record a CUDA graph for this long")
    args = ap.parse_args()

    # Before torch initialises CUDA; the spawned worker inherits the environment.
    if args.alloc == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    elif args.alloc == "default":
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        os.environ.pop("PYTORCH_ALLOC_CONF", None)
    # Never multicast on the lent GPU machines (../shared/GPU.md).
    os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
                      NVSHMEM_DISABLE_NVLS="1")

    import torch
    import torch.multiprocessing as mp

    who = "main"
    if not torch.cuda.is_available():
        say("torch-share: main: CUDA is not available to torch")
        sys.exit(2)
    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    total = max(args.mib << 20, (HEADER + 1024) * 8) // 8
    buf = torch.empty(total, dtype=torch.int64, device=dev)
    data = buf[HEADER:]
    idx = torch.arange(data.numel(), dtype=torch.int64, device=dev)
    expected = torch.empty_like(idx)
    wrong = torch.empty(idx.shape, dtype=torch.bool, device=dev)
    buf[:HEADER].zero_()
    data.copy_(idx)  # step 0
    torch.cuda.synchronize()

    ctx = mp.get_context("spawn")
    w = ctx.Process(target=worker, args=(buf, args.interval_ms, os.getpid(), args.capture_ms),
                    name="torch-share-worker")
    w.start()
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") or "(unset)"
    say(f"main: pid {os.getpid()}, worker pid {w.pid}, torch {torch.__version__}, "
        f"{args.mib} MiB on {torch.cuda.get_device_name(dev)} at 0x{buf.data_ptr():x}, "
        f"PYTORCH_CUDA_ALLOC_CONF={conf}")
    try:  # which kind of handle torch sends (diagnostic only; a private API)
        h = buf.untyped_storage()._share_cuda_()[1]
        say(f"main: share handle {len(h)} bytes, starts {bytes(h[:4])!r}")
    except Exception as e:  # noqa: BLE001
        say(f"main: share handle not shown ({type(e).__name__}: {e})")

    start = time.monotonic()
    last_k = 0
    count = 0
    torn = 0
    while True:
        if not w.is_alive():
            code = w.exitcode
            say(f"torch-share: main: the worker ended with status {code}")
            sys.exit(3 if code == 3 else 4)
        b = int(buf[SLOT_B].item())
        torch.add(idx, b * MULT, out=expected)
        torch.ne(data, expected, out=wrong)
        nbad = int(wrong.sum().item())
        a = int(buf[SLOT_A].item())
        if a != b:
            torn += 1
            if torn >= TORN_LIMIT:
                mismatch(who, f"header torn {torn} times in a row (A={a}, B={b})")
            time.sleep(0.005)
            continue
        torn = 0
        if nbad:
            i = int(torch.nonzero(wrong)[0, 0].item())
            mismatch(who, f"data of step {b}: {nbad} of {data.numel()} elements wrong; "
                          f"element {i} expected {int(expected[i].item())}, now "
                          f"{int(data[i].item())} (the worker may have stepped since)")
        if b < last_k:
            mismatch(who, f"step went back from {last_k} to {b}")
        last_k = b
        count += 1
        say(f"main count {count} ok")
        say(f"main seen {b}")
        if args.seconds and time.monotonic() - start >= args.seconds:
            break
        time.sleep(args.check_ms / 1000.0)

    w.terminate()
    w.join(30)
    say(f"main: done after {args.seconds:g} s: {count} checks, worker at step {last_k}")
    sys.exit(0)


if __name__ == "__main__":
    main()
