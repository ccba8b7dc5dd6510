#!/usr/bin/env python3
"""torch_allreduce.py: an all-reduce loop of a PyTorch NCCL job, each result checked.

    torchrun --nproc-per-node 2 tests/gpu/torch_allreduce.py [--mib N] [--steps S]
                                                             [--print-every K]
                                                             [--backend nccl|gloo]
                                                             [--share-gpu] [--sleep-ms M]
                                                             [--graph G] [--store-every K]
                                                             [--local-gpus G]

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

--graph G (nccl only) replays the step from a CUDA graph, as inference
servers and compiled training steps do: after one eager step (NCCL's warm-up),
the fill and G all-reduces of G tensors are captured once (torch.cuda.graph),
the k-th tensor holding the fill times (R + 1 + k), and each step sets the step
number in a device tensor and replays the graph; every element of every
tensor is checked (expected (i + s * 1000003) * (W (W + 1) / 2 + W k)). A step
launches G collective kernels through one cuGraphLaunch, none directly.

--store-every K: every K steps each rank adds 1 to its counter in torchrun's
store (a round trip over its TCP connection to the agent's store) and checks
the count it gets back (step / K): a connection that stopped working, or a
store that lost its state, shows as an exception or a MISMATCH line.

--local-gpus G (nccl only) makes each rank drive G GPUs itself, as single-process
multi-GPU NCCL does (torch.cuda.nccl, ncclCommInitAll, torch.nn.DataParallel): rank R
holds the tensor on each of GPUs R*G .. R*G+G-1 (modulo the GPUs it sees), the k-th
filled with (i + s * 1000003) * (k + 1), and each step all-reduces them across those
GPUs in one process (torch.cuda.nccl.all_reduce: one collective kernel per GPU)
instead of across ranks; every element on every GPU is checked (expected
(i + s * 1000003) G (G + 1) / 2). The cut must then line up the process's GPUs.

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
    ap.add_argument("--graph", type=int, default=0)
    ap.add_argument("--store-every", type=int, default=0)
    ap.add_argument("--local-gpus", type=int, default=0)
    a = ap.parse_args()
    if a.graph and a.backend != "nccl":
        ap.error("--graph needs the nccl backend")
    if a.local_gpus and (a.backend != "nccl" or a.graph or a.share_gpu or a.local_gpus < 2):
        ap.error("--local-gpus needs the nccl backend, at least 2, no --graph or --share-gpu")
    if a.local_gpus and int(os.environ.get("WORLD_SIZE", "1")) != 1:
        ap.error("--local-gpus runs as one rank (--nproc-per-node 1): the rank drives the GPUs")

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
    step = 0
    graph = outs = None
    step_dev = torch.zeros((), device=dev, dtype=torch.int64)
    if a.graph:
        # One eager step first: NCCL connects its peers at the first
        # collective, which a capture cannot do.
        dist.all_reduce(base * 0)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            v_g = base + step_dev * 1000003
            outs = [v_g * (rank + 1 + k) for k in range(a.graph)]
            for t in outs:
                dist.all_reduce(t)
        torch.cuda.synchronize()
    local_devs = []
    if a.local_gpus:
        import torch.cuda.nccl as nccl

        count = torch.cuda.device_count()
        local_devs = [torch.device("cuda", (local * a.local_gpus + k) % count)
                      for k in range(a.local_gpus)]
        if len({d.index for d in local_devs}) < a.local_gpus:
            say(f"rank {rank} MISMATCH: --local-gpus {a.local_gpus} needs that many GPUs, "
                f"this process sees {count}")
            sys.exit(3)
        local_base = [torch.arange(n, device=d, dtype=torch.int64) for d in local_devs]
        where += " local " + ",".join(str(d.index) for d in local_devs)
    store = dist.distributed_c10d._get_default_store() if a.store_every else None
    say(f"rank {rank} ready pid {os.getpid()} device {where}")
    while a.steps == 0 or step < a.steps:
        step += 1
        v = base + step * 1000003 if not local_devs else None
        if local_devs:
            g = a.local_gpus
            vs = [b + step * 1000003 for b in local_base]
            ts = [v_k * (k + 1) for k, v_k in enumerate(vs)]
            nccl.all_reduce(ts)
            results = [(t, v_k * (g * (g + 1) // 2)) for t, v_k in zip(ts, vs)]
        elif graph is not None:
            step_dev.fill_(step)
            graph.replay()
            results = [(t, v * (scale + world * k)) for k, t in enumerate(outs)]
        else:
            t = v * (rank + 1)
            dist.all_reduce(t)
            results = [(t, v * scale)]
        for t, want in results:
            if not torch.equal(t, want):
                bad = (t != want).nonzero()[0].item()
                say(f"rank {rank} MISMATCH at step {step}: element {bad} is {t[bad].item()}, "
                    f"expected {want[bad].item()}")
                sys.exit(3)
        if store is not None and step % a.store_every == 0:
            got = store.add(f"cusnap_steps_{rank}", 1)
            if got != step // a.store_every:
                say(f"rank {rank} MISMATCH at step {step}: the store counts {got}, "
                    f"expected {step // a.store_every}")
                sys.exit(3)
        if step % a.print_every == 0 or step == 1:
            say(f"rank {rank} count {step} ok")
        if a.sleep_ms:
            time.sleep(a.sleep_ms / 1000)
    dist.destroy_process_group()
    say(f"rank {rank} done")


if __name__ == "__main__":
    main()
