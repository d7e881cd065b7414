"""An accelerate-style loop that forgot `optimizer.step()`: the gradients are computed (and
zeroed) every step, the scheduler steps, but the weights never change.

    python bug_no_optimizer_step.py --steps 100
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(1024, 16)
    y = x[:, :3].sum(1, keepdim=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 - s / (args.steps + 1))
    model.train()
    step = 0
    while step < args.steps:
        for inputs, targets in loader:
            loss = nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            # the bug: optimizer.step() is missing here
            lr_scheduler.step()
            optimizer.zero_grad()
            step += 1
            if step == args.steps:
                break
    print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
