"""A regression run under nn.DataParallel with a DataLoader over a dataset that holds one
missing value (a NaN from a CSV's empty cell): the batch that carries it, at step 12, makes the
loss, the gradients and then every weight NaN.

    python bug_nan_in_data.py --steps 30
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(1024, 12)
    y = x[:, :2].sum(1, keepdim=True)
    x[12 * 16 + 5, 7] = float("nan")  # the bug: an empty cell read as NaN, never cleaned
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=False)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.DataParallel(nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1))).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while step < args.steps:
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(inputs.to(device)), targets.to(device))
            loss.backward()
            optimizer.step()
            step += 1
            if step == args.steps:
                break
    print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
