"""An encoder/decoder model run under nn.DataParallel (as a multi-GPU script would; on the CPU
DataParallel calls the module itself) whose forward detaches the encoder's output, left from
a debugging session: the encoder's parameters are in the optimizer but get no gradient, so only
the decoder learns.

    python bug_detached_encoder.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class AutoEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
        self.decoder = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 32))

    def forward(self, x):
        z = self.encoder(x).detach()  # the bug: no gradient flows back into the encoder
        return self.decoder(z)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.DataParallel(AutoEncoder()).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    basis = torch.randn(8, 32)
    for step in range(args.steps):
        x = (torch.randn(16, 8) @ basis).to(device)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), x)
        loss.backward()
        optimizer.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
