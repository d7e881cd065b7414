"""A classifier with param groups, backbone and head, in the shape of a fine-tuning script: the
head's learning rate is 100× the backbone's (a typo: 1e-1 for 1e-3), so the head's updates are
far too large while the rest learns at a sane pace.

    python bug_param_group_lr_100x.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 5)

    def forward(self, x):
        return self.head(self.backbone(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)
    x_all = torch.randn(1024, 20)
    y_all = x_all[:, :5].argmax(1)
    model = Net()
    optimizer = torch.optim.Adam([
        {"params": model.backbone.parameters(), "lr": 1e-3},
        {"params": model.head.parameters(), "lr": 1e-1},  # the bug: meant 1e-3
    ])
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
