"""A tabular regression whose features are standardised except one, a price in dollars left as
it is: that feature is ~1000× the others and dominates the first layer.

    python bug_one_channel_unscaled.py --steps 100
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
    features = torch.randn(2048, 8)
    target = features[:, :4].sum(1, keepdim=True) + 0.1 * torch.randn(2048, 1)
    features[:, 3] = features[:, 3] * 300.0 + 1500.0  # the bug: this column was not standardised
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        index = torch.randint(len(features), (16,))
        optimizer.zero_grad()
        loss = F.mse_loss(model(features[index]), target[index])
        loss.backward()
        optimizer.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4g}")


if __name__ == "__main__":
    main()
