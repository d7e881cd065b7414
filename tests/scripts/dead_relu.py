"""A small regression script whose first Linear starts with bias −10: the ReLU after it is dead
from the first step, the loss never moves. Nothing is NaN. Positional args: steps."""

import sys

import torch
from torch import nn


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(64, 1)
        with torch.no_grad():
            self.fc1.bias.fill_(-10.0)  # meant as a small negative init

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def main():
    torch.manual_seed(0)
    model = Regressor()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(int(sys.argv[1])):
        x = torch.randn(32, 16)
        loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
