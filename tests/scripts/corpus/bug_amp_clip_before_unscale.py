"""A mixed-precision regression in the shape of the AMP recipe (autocast + GradScaler) with the
gradient clipping put before `scaler.unscale_(optimizer)`: clip_grad_norm_ clips the still-scaled
gradients to norm 1, the scaler then divides them by 65536, and every update is 65536× too
small. On the CPU: torch.autocast("cpu", dtype=torch.bfloat16) and torch.amp.GradScaler("cpu").

    python bug_amp_clip_before_unscale.py --steps 100
"""

import argparse

import torch
from torch import nn


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 1)

    def forward(self, x):
        return self.head(self.encoder(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Regressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu")
    for step in range(args.steps):
        x = torch.randn(16, 16)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(model(x).float(), x.sum(1, keepdim=True))
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the bug: scaler.unscale_ first
        scaler.step(optimizer)
        scaler.update()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
