"""A DDP job in the shape of torchrun's tutorial, with param groups: the head's learning rate is
100× the body's (a typo: 5.0 for 0.05). Nothing is NaN for a while; the head's weights grow.

Positional args: steps.
"""

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.body(x))


def main():
    steps = int(sys.argv[1])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = Net()
    model = DDP(net)
    optimizer = torch.optim.SGD([{"params": net.body.parameters(), "lr": 0.05},
                                 {"params": net.head.parameters(), "lr": 5.0}])
    generator = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(steps):
        x = torch.randn(32, 16, generator=generator)
        y = torch.randn(32, 4, generator=generator)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
