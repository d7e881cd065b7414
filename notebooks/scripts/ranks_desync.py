"""A DDP job whose rank 0 changes a parameter after DDP(model) was built: the ranks' models
part ways (DDP broadcasts the parameters once, at construction), and so do their validation
losses. Shape of a real bug: a "fix-up" of a layer (re-initialising a head, loading a
checkpoint) done on rank 0 only, after the wrapper exists.

    torchrun --nproc_per_node=2 ranks_desync.py [steps]
"""

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
ddp = DDP(model.to(rank), device_ids=[rank])
if rank == 0:
    with torch.no_grad():
        model[2].weight.mul_(1.5)  # the bug: on rank 0 only, after DDP was built
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
torch.manual_seed(1 + rank)  # each rank its own batches, as a DistributedSampler gives
for _step in range(steps):
    x, y = torch.randn(4, 8).to(rank), torch.randn(4, 1).to(rank)
    loss = nn.functional.mse_loss(ddp(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
torch.manual_seed(99)  # the same validation batch on every rank
with torch.no_grad():
    val = nn.functional.mse_loss(model(torch.randn(16, 8).to(rank)), torch.randn(16, 1).to(rank))
print(f"val loss {val.item():.6f}")
dist.destroy_process_group()
