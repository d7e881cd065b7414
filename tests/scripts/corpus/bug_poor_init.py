"""A deep Tanh MLP whose weights are initialised with std 10 instead of ~1/sqrt(fan_in): every
hidden Tanh is saturated at ±1 from the first step, the gradients through them are ~0.

    python bug_poor_init.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class DeepTanh(nn.Module):
    def __init__(self, width=32, depth=6):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(16 if i == 0 else width, width) for i in range(depth)])
        self.act = nn.Tanh()
        self.head = nn.Linear(width, 4)
        for layer in self.layers:
            nn.init.normal_(layer.weight, std=10.0)  # the bug: std 10 for fan-in 16/32

    def forward(self, x):
        for layer in self.layers:
            x = self.act(layer(x))
        return self.head(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = DeepTanh()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x_all = torch.randn(1024, 16)
    y_all = x_all[:, :4].argmax(1)
    for step in range(args.steps):
        index = torch.randint(len(x_all), (16,))
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x_all[index]), y_all[index])
        loss.backward()
        optimizer.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
