"""A DDP job for torchrun on CPUs (gloo), in the shape of the DDP tutorial's multigpu_torchrun.py:
each rank trains a small model on its share of the data.

Positional args: steps, desync_step: at that step rank 1 changes a weight after the optimiser
step (a desync DDP never repairs: it averages gradients, not parameters); -1 for none.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

steps = int(sys.argv[1])
desync_step = int(sys.argv[2])


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(rank)
    for step in range(steps):
        x = torch.randn(4, 6, generator=generator)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), torch.ones(4, 1)).backward()
        optimizer.step()
        if step == desync_step and rank == 1:
            with torch.no_grad():
                model.module[2].weight[0, 0] += 0.5
    print(f"rank {rank} of {os.environ['WORLD_SIZE']}: {steps} steps")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
