"""A regression with a LambdaLR schedule meant to decay the learning rate by 5 % per step that
grows it instead (1.05 ** step for 0.95 ** step): the lr is ×130 by step 100, the updates grow
with it and training diverges.

    python bug_scheduler_runaway.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.fc2 = nn.Linear(64, 1)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.005, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.05 ** step)  # the bug
    for step in range(args.steps):
        x = torch.randn(16, 16)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), x[:, :2].sum(1, keepdim=True))
        loss.backward()
        optimizer.step()
        scheduler.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step}: lr {scheduler.get_last_lr()[0]:.3g} loss {loss.item():.4g}")


if __name__ == "__main__":
    main()
