"""PyTorch under the shim (scripts/gpu-test-shim.sh): matmul, synchronize, a
CUDA graph, a few kernels; prints digests on stdout that must be identical with
and without LD_PRELOAD of the shim, and on stderr whether the shim was loaded.
Never touches multicast (the caller exports NCCL_NVLS_ENABLE=0 and friends)."""
import ctypes
import hashlib
import sys

import torch


def digest(t):
    return hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True)
    dev = torch.device("cuda")
    g = torch.Generator(device="cpu").manual_seed(1234)
    a = torch.randn(1024, 1024, generator=g).to(dev)
    b = torch.randn(1024, 1024, generator=g).to(dev)

    c = a @ b
    torch.cuda.synchronize()
    print("matmul", digest(c))

    x = torch.randn(4096, generator=g).to(dev)
    y = (torch.sin(x) * 3 + x.square()).cumsum(0)
    torch.cuda.synchronize()
    print("elementwise+scan", digest(y))

    # A CUDA graph: capture on a side stream, replay with new input values.
    static_in = torch.zeros(512, 512, device=dev)
    w = torch.randn(512, 512, generator=g).to(dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm-up before capture
            static_out = torch.relu(static_in @ w) + 1
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = torch.relu(static_in @ w) + 1
    outs = []
    for k in range(3):
        static_in.copy_(torch.full((512, 512), float(k + 1)) .to(dev) * a[:512, :512])
        graph.replay()
        outs.append(static_out.clone())
    torch.cuda.synchronize()
    print("graph replays", " ".join(digest(o) for o in outs))

    m = torch.cuda.max_memory_allocated() > 0
    print("allocator used", m)

    shim = None
    try:
        info = ctypes.c_void_p.in_dll(ctypes.CDLL(None), "cusnap_shim_build_info")
        shim = info is not None
    except ValueError:
        shim = False
    print("shim loaded:", shim, "| torch", torch.__version__, "| cuda", torch.version.cuda, file=sys.stderr)


if __name__ == "__main__":
    main()
