"""A DDP regression job (torchrun-style; a plain launch is a world of one on gloo) whose loop
never zeroes the gradients: `loss.backward()` adds to the last step's .grad, so each step's
gradient is the sum of every gradient so far and the updates grow step by step.

Bug: no `optimizer.zero_grad()` anywhere in the loop.

    python bug_no_zero_grad.py --steps 100
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 32)
        self.out = nn.Linear(32, 1)

    def forward(self, x):
        return self.out(F.relu(self.fc2(F.relu(self.fc1(x)))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    for key, default in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                         ("MASTER_PORT", "29501")):
        os.environ.setdefault(key, default)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(dist.get_rank())
    w = torch.randn(16, 1, generator=torch.Generator().manual_seed(0))
    for step in range(args.steps):
        x = torch.randn(16, 16, generator=generator)
        loss = F.mse_loss(model(x), x @ w)
        loss.backward()  # the bug: the gradients of every earlier step are still in .grad
        optimizer.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
