"""A gated regression whose gate is a Tanh of a pre-activation multiplied by a "sharpness" of 50
(a hyper-parameter meant as 0.5): the Tanh's outputs sit at ±1, its gradient is ~0, the gate's
Linear never learns.

    python bug_saturated_tanh.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class GatedRegressor(nn.Module):
    def __init__(self, sharpness=50.0):  # the bug: meant 0.5
        super().__init__()
        self.gate_proj = nn.Linear(16, 32)
        self.gate = nn.Tanh()
        self.value = nn.Linear(16, 32)
        self.out = nn.Linear(32, 1)
        self.sharpness = sharpness

    def forward(self, x):
        return self.out(self.gate(self.sharpness * self.gate_proj(x)) * self.value(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = GatedRegressor()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        x = torch.randn(16, 16)
        y = torch.sigmoid(x[:, :1]) * x[:, 1:2]
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
