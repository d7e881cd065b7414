"""An MLP regression with a validation pass every k steps, the loop most tutorials teach:
`model.train()` steps (BatchNorm, Dropout in training mode), and every `--eval_every` steps
`model.eval()` with `torch.no_grad()` over a held-out batch, then `model.train()` again. Adam,
MSE; the data (a smooth function plus noise) is made in the script.

    python healthy_mlp_eval.py --steps 300
"""

import argparse

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, d_in=8, width=64):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_in, width), nn.BatchNorm1d(width), nn.ReLU(), nn.Dropout(0.1),
            nn.Linear(width, width), nn.ReLU(), nn.Dropout(0.1),
            nn.Linear(width, 1))

    def forward(self, x):
        return self.net(x)


def make_data(n, generator):
    x = torch.randn(n, 8, generator=generator)
    y = (x[:, :1] * x[:, 1:2]).tanh() + 0.5 * x[:, 2:3] + 0.05 * torch.randn(n, 1, generator=generator)
    return x, y


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--eval_every", type=int, default=25)
    args = parser.parse_args()
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    x_train, y_train = make_data(2048, generator)
    x_val, y_val = make_data(64, generator)
    model = MLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.MSELoss()
    model.train()
    for step in range(args.steps):
        index = torch.randint(len(x_train), (args.batch_size,), generator=generator)
        optimizer.zero_grad()
        loss = loss_fn(model(x_train[index]), y_train[index])
        loss.backward()
        optimizer.step()
        if step % args.eval_every == 0 or step == args.steps - 1:
            model.eval()
            with torch.no_grad():
                val_loss = loss_fn(model(x_val), y_val)
            model.train()
            print(f"step {step}: train {loss.item():.4f} val {val_loss.item():.4f}")


if __name__ == "__main__":
    main()
