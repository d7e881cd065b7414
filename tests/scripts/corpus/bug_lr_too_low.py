"""A classifier trained with Adam at lr 1e-8 (a typo for 1e-3): every update is ~1e-8 of the
weights' size, nothing moves, the loss stays where it started.

    python bug_lr_too_low.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 64)
        self.fc2 = nn.Linear(64, 64)
        self.fc3 = nn.Linear(64, 5)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=1e-8)  # the bug
    args = parser.parse_args()
    torch.manual_seed(0)
    x_all = torch.randn(1024, 20)
    y_all = x_all[:, :5].argmax(1)
    model = MLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        index = torch.randint(len(x_all), (16,))
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x_all[index]), y_all[index])
        loss.backward()
        optimizer.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
