"""A DDP regression job (a world of one when launched plainly) with a learning rate far too high
for SGD on this model (lr 2.0): the loss grows step by step until it is Inf/NaN.

    python bug_lr_too_high.py --steps 100
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=2.0)  # the bug: meant 0.02
    args = parser.parse_args()
    for key, default in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                         ("MASTER_PORT", "29502")):
        os.environ.setdefault(key, default)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    model = DDP(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(dist.get_rank())
    for step in range(args.steps):
        x = torch.randn(16, 16, generator=generator)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), x.sum(1, keepdim=True))
        loss.backward()
        optimizer.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4g}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
