"""A residual MLP without normalisation whose blocks' branches are initialised too large (std
1.8 in a width-32 branch): each block's output is 5-7× its input from step 0, so the activations
grow ~10^4.5 along the six blocks and the MSE's gradient is enormous.

    python bug_residual_growth.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class ResidualBlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = nn.ReLU()
        nn.init.normal_(self.fc.weight, std=1.8)  # the bug: no normalisation, and a branch ~6x its input

    def forward(self, x):
        return x + self.act(self.fc(x))


class ResMLP(nn.Module):
    def __init__(self, width=32, depth=6):
        super().__init__()
        self.stem = nn.Linear(8, width)
        self.blocks = nn.Sequential(*[ResidualBlock(width) for _ in range(depth)])
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = ResMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        x = torch.randn(16, 8)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), x[:, :1])
        loss.backward()
        optimizer.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4g}")


if __name__ == "__main__":
    main()
