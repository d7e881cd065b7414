"""A DDP job that logs its mean loss with an all_reduce made on rank 0 only: the other ranks
go on to the next step's collectives, and every rank waits for ever (on a cluster, until
NCCL's timeout: 30 minutes by default).

    torchrun --nproc_per_node=3 ranks_hang.py
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(nn.Linear(4, 4))
for step in range(3):
    loss = model(torch.randn(2, 4)).sum()
    loss.backward()
    if rank == 0:
        dist.all_reduce(loss.detach())  # HANG_LINE: log the mean loss (rank 0 only)
    print(f"step {step} loss {loss.item():.4f}")
dist.destroy_process_group()
