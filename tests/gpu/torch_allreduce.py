#!/usr/bin/env python3
"""torch_allreduce.py: an all-reduce loop of a PyTorch NCCL job, each result checked.

    torchrun --nproc-per-node 2 tests/gpu/torch_allreduce.py [--mib N] [--steps S]
                                                             [--print-every K]
                                                             [--backend nccl|gloo]
                                                             [--share-gpu] [--sleep-ms M]

Rank R runs on GPU LOCAL_RANK (modulo the GPUs it sees) and holds an int64
tensor of N MiB (default 64). Step s = 1, 2, ...: every rank fills its tensor
with (i + s * 1000003) * (R + 1) for element i, all-reduces it (sum), and
checks on the GPU that every element equals (i + s * 1000003) * W (W + 1) / 2
for W ranks, with no sleep between steps. Prints "rank R ready pid P device D
NAME UUID" once, then "rank R count s ok" every K steps (default 1); a wrong
element prints a line with MISMATCH and exits 3. --steps S: stop after S steps
(default: run until killed). The checkpoint tests read these lines (the
labels "rank_0", "rank_1" in scripts/gpu-test.sh).

--backend gloo runs the same loop on CPU tensors (no GPU, no CUDA): the job
keeps torchrun's processes, rendezvous store and TCP connections, so the CPU
machine checkpoints and restores that part of the NCCL job for real (device
"cpu" in the ready line).

--sleep-ms M sleeps M ms after each step (default 0: none), so that a
checkpoint finds the ranks between collectives most of the time.

--share-gpu lets the NCCL ranks share the GPUs they see (two ranks on one
GPU). NCCL refuses two ranks of one host on one GPU ("Duplicate GPU
detected"), so each rank presents itself as a host of its own (NCCL_HOSTID)
and the ranks exchange data through NCCL's network transport (TCP sockets,
with NCCL's proxy threads) instead of P2P. It is how one GPU carries a
two-rank NCCL job: the cut across ranks, the bootstrap/proxy/RAS sockets
between them and their restore.
"""
import argparse
import os
import sys
import time


def say(line):
    """One whole line in one write: torchrun runs its workers unbuffered, where
    print() writes the text and the newline apart and the ranks' lines mix."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--print-every", type=int, default=1)
    ap.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    ap.add_argument("--share-gpu", action="store_true")
    ap.add_argument("--sleep-ms", type=int, default=0)
    a = ap.parse_args()

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if a.backend == "nccl":
        if a.share_gpu:
            # Read by NCCL when the communicator is created, below.
            os.environ["NCCL_HOSTID"] = f"{os.uname().nodename}-rank{local}"
        dev = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", device_id=dev)
        props = torch.cuda.get_device_properties(dev)
        where = f"{dev.index} {props.name} GPU-{getattr(props, 'uuid', '')}"
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
        where = "cpu"
    n = (a.mib << 20) // 8
    base = torch.arange(n, device=dev, dtype=torch.int64)
    scale = world * (world + 1) // 2
    say(f"rank {rank} ready pid {os.getpid()} device {where}")
    step = 0
    while a.steps == 0 or step < a.steps:
        step += 1
        v = base + step * 1000003
        t = v * (rank + 1)
        dist.all_reduce(t)
        if not torch.equal(t, v * scale):
            bad = (t != v * scale).nonzero()[0].item()
            say(f"rank {rank} MISMATCH at step {step}: element {bad} is {t[bad].item()}, "
                f"expected {(v[bad] * scale).item()}")
            sys.exit(3)
        if step % a.print_every == 0 or step == 1:
            say(f"rank {rank} count {step} ok")
        if a.sleep_ms:
            time.sleep(a.sleep_ms / 1000)
    dist.destroy_process_group()
    say(f"rank {rank} done")


if __name__ == "__main__":
    main()
