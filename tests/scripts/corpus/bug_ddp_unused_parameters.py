"""A DDP job (a world of one on gloo when launched plainly) whose model has an auxiliary branch
(a temperature and an `aux` Linear) that forward never uses, wrapped with the default
find_unused_parameters=False: DDP waits for gradients those parameters never get, and the second
step's forward raises "Expected to have finished reduction in the prior iteration ... Parameter
indices which did not receive grad for rank 0: 0 1 2".

    python bug_ddp_unused_parameters.py --steps 5
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.temperature = nn.Parameter(torch.ones(1))
        self.aux = nn.Linear(32, 4)  # an auxiliary head, no longer called in forward
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.body(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    for key, default in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                         ("MASTER_PORT", "29503")):
        os.environ.setdefault(key, default)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(Model())  # the bug: find_unused_parameters=False with a branch never used
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        for step in range(args.steps):
            x, y = torch.randn(16, 16), torch.randint(4, (16,))
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            print(f"step {step}: loss {loss.item():.4f}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
