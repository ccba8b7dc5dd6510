# nccl_teardown.py: a one-rank NCCL process group that all-reduces, then is
# destroyed (ncclCommDestroy frees NCCL's cuMem buffers: retain, release,
# unmap, release, free the reservation), then a second group the same way.
# Run with NCCL_DEBUG=WARN, on the driver alone and under `cusnap launch`:
# a free that fails shows as an NCCL warning, a leak as device memory not
# given back (the driver's free memory before and after, printed).
import os
import torch
import torch.distributed as dist

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29561")
torch.cuda.set_device(0)
free0 = torch.cuda.mem_get_info()[0]
for round_ in range(2):
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    x = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    assert x[0].item() == 1.0
    dist.destroy_process_group()
    torch.cuda.synchronize()
    free = torch.cuda.mem_get_info()[0]
    print(f"round {round_}: all-reduce ok, group destroyed; device memory not given back since start: "
          f"{(free0 - free) >> 20} MiB", flush=True)
