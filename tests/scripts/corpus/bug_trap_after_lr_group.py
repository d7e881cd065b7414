"""A regression with param groups whose head has 100× the body's learning rate (SGD 5.0 for
0.05): the head's weights grow step by step until the gradient flowing back into the body's Tanh
is Inf. Run under the trap (`%inspect all --trap`), which stops at that Inf: the cause is the
param group, steps before.

    python bug_trap_after_lr_group.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.body(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD([
        {"params": model.body.parameters(), "lr": 0.05},
        {"params": model.head.parameters(), "lr": 5.0},  # the bug: meant 0.05
    ])
    for step in range(args.steps):
        x = torch.randn(32, 16)
        y = torch.randn(32, 4)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.4g}")


if __name__ == "__main__":
    main()
