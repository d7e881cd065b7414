"""Transfer learning where the new classification head is assigned after the optimizer was
built: the optimizer holds the old head's parameters, the new `model.head` gets gradients at
every step and never changes (only the body learns).

    python bug_head_after_optimizer.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())
        self.head = nn.Linear(32, num_classes)

    def forward(self, x):
        return self.head(self.body(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.head = nn.Linear(32, 4)  # the bug: a new head for 4 classes, after the optimizer
    x_all = torch.randn(1024, 24)
    y_all = x_all[:, :4].argmax(1)
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
