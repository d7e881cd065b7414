"""A training loop in the shape of accelerate's examples: a model, an AdamW optimizer and a
DataLoader handed to `accelerator.prepare`, `accelerator.backward(loss)`, `optimizer.step()`,
`lr_scheduler.step()`, `optimizer.zero_grad()`. The model is a 4-module MLP (Linear, GELU,
LayerNorm, Linear) whose LayerNorm bias starts at exactly 0, as torch initialises it. No
accelerate import: a stand-in Accelerator with its one-process behaviour (prepare returns what it
is given, backward calls loss.backward()). The regression data is made in the script.

    python healthy_accelerate_loop.py --steps 300
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Accelerator:
    """accelerate.Accelerator as it behaves in one process on the CPU."""

    device = torch.device("cpu")

    def prepare(self, *objects):
        return objects

    def backward(self, loss):
        loss.backward()

    def print(self, *args):
        print(*args)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    torch.manual_seed(42)
    accelerator = Accelerator()
    x = torch.randn(2048, 16)
    y = torch.sin(x[:, :4].sum(1, keepdim=True)) + 0.1 * torch.randn(2048, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 - s / (args.steps + 1))
    model, optimizer, loader, lr_scheduler = accelerator.prepare(model, optimizer, loader,
                                                                 lr_scheduler)
    model.train()
    step = 0
    while step < args.steps:
        for inputs, targets in loader:
            outputs = model(inputs)
            loss = nn.functional.mse_loss(outputs, targets)
            accelerator.backward(loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            if step % 100 == 0 or step == args.steps - 1:
                accelerator.print(f"step {step}: loss {loss.item():.4f}")
            step += 1
            if step == args.steps:
                break


if __name__ == "__main__":
    main()
