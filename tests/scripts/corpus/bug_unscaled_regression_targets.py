"""A house-price regression on standardised features whose targets are left in dollars
(~1e4-1e5): the MSE is ~1e9, its gradients explode and SGD's first steps throw the weights far
off.

    python bug_unscaled_regression_targets.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)
    features = torch.randn(2048, 10)
    prices = 50_000 + 15_000 * features[:, :3].sum(1, keepdim=True)  # the bug: never scaled
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        index = torch.randint(len(features), (16,))
        optimizer.zero_grad()
        loss = F.mse_loss(model(features[index]), prices[index])
        loss.backward()
        optimizer.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4g}")


if __name__ == "__main__":
    main()
