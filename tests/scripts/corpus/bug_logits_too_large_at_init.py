"""An MNIST-style MLP classifier whose output layer is initialised with std 1 (meant: the
default, ~1/sqrt(fan_in)): the logits start at ±20, the loss at init is ~10× a uniform guess's
log(10), and the first steps spend themselves shrinking the logits (Karpathy's recipe: verify
the loss at init).

    python bug_logits_too_large_at_init.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Classifier(nn.Module):
    def __init__(self, features=32, hidden=64, classes=10):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, classes)
        nn.init.normal_(self.fc2.weight, std=1.0)  # the bug

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Classifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    centers = torch.randn(10, 32) * 2
    for step in range(args.steps):
        y = torch.randint(0, 10, (16,))
        x = centers[y] + torch.randn(16, 32)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
