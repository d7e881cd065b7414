"""A regression MLP whose first Linear has its bias initialised at -10 (meant as a small
negative init): every pre-activation is < 0, the ReLU after it outputs zeros from step 0, no
gradient reaches the first layer, the loss never moves.

    python bug_dead_relu.py --steps 100
"""

import argparse

import torch
from torch import nn


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(64, 32)
        self.act2 = nn.ReLU()
        self.out = nn.Linear(32, 1)
        nn.init.constant_(self.fc1.bias, -10.0)  # the bug

    def forward(self, x):
        return self.out(self.act2(self.fc2(self.act(self.fc1(x)))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Regressor()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        x = torch.randn(16, 16)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        loss.backward()
        optimizer.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
