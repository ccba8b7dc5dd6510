#!/usr/bin/env python3
"""torch_hostmem.py: kernels that read and write pinned host memory in place.

    python3 tests/gpu/torch_hostmem.py [--kind alloc|register] [--mib N]

NCCL keeps its work queue and, between ranks on different hosts, its network
buffers in pinned host memory that its kernels access directly. This job does
the same: --kind alloc takes the memory from cudaHostAlloc (a pinned tensor),
--kind register pins an ordinary anonymous mapping with cudaHostRegister. A
device view of the same bytes (unified addressing: the device address is the
host address) is incremented by a kernel every step; the host then checks
every element. Prints "count s ok" each step, "MISMATCH ..." and exits 3 on
a wrong element.
"""
import argparse
import mmap
import sys
import time


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class DeviceView:
    """A CUDA array interface over a host address (UVA)."""

    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<i8", "data": (ptr, False),
                                         "version": 3, "strides": None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=("alloc", "register"), default="alloc")
    ap.add_argument("--mib", type=int, default=16)
    a = ap.parse_args()
    import torch
    n = (a.mib << 20) // 8
    if a.kind == "alloc":
        host = torch.zeros(n, dtype=torch.int64, pin_memory=True)
    else:
        buf = mmap.mmap(-1, n * 8)
        host = torch.frombuffer(buf, dtype=torch.int64)
        host.zero_()
        err = torch.cuda.cudart().cudaHostRegister(host.data_ptr(), n * 8, 0)
        if int(err) != 0:
            say(f"cudaHostRegister failed: {err}")
            sys.exit(2)
    dev = torch.as_tensor(DeviceView(host.data_ptr(), n), device="cuda")
    base = torch.arange(n, dtype=torch.int64, device="cuda")
    dev.copy_(base)
    torch.cuda.synchronize()
    expect = torch.arange(n, dtype=torch.int64)
    say(f"ready kind {a.kind} host 0x{host.data_ptr():x} device 0x{dev.data_ptr():x}")
    step = 0
    while True:
        step += 1
        dev.add_(1)
        torch.cuda.synchronize()
        expect.add_(1)
        if not torch.equal(host, expect):
            bad = (host != expect).nonzero()[0].item()
            say(f"MISMATCH at step {step}: element {bad} is {host[bad].item()}, expected {expect[bad].item()}")
            sys.exit(3)
        say(f"count {step} ok")
        time.sleep(0.02)


if __name__ == "__main__":
    main()
