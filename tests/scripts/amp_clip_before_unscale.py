"""A mixed-precision regression job in the shape of the AMP recipe (autocast + GradScaler), with
gradient clipping put before `scaler.unscale_`: clip_grad_norm_ clips the still-scaled
gradients to norm 1, the scaler then divides them by 65536, and every update is 65536× too
small. Nothing is NaN; the loss barely moves. Positional args: steps.
"""

import sys

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
    torch.manual_seed(0)
    model = Regressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(int(sys.argv[1])):
        x = torch.randn(32, 16)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(model(x).float(), x.sum(1, keepdim=True))
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the bug: scaler.unscale_ first
        scaler.step(optimizer)
        scaler.update()
    print(f"final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
