"""A mixture-of-experts layer whose router takes log of a softmax that underflows to 0 (a
temperature far too low): NaN from the first step. Positional args: steps."""

import sys

import torch
from torch import nn


class Router(nn.Module):
    def __init__(self, d, experts):
        super().__init__()
        self.gate = nn.Linear(d, experts)

    def forward(self, x):
        probs = torch.softmax(self.gate(x) * 1e4, dim=-1)  # underflows to exact zeros
        return torch.log(probs)  # log(0) = -inf, and -inf - -inf = NaN downstream


class MoE(nn.Module):
    def __init__(self, d=16, experts=4):
        super().__init__()
        self.router = Router(d, experts)
        self.experts = nn.ModuleList(nn.Linear(d, d) for _ in range(experts))

    def forward(self, x):
        weights = self.router(x).softmax(-1)
        return sum(w.unsqueeze(-1) * e(x) for w, e in zip(weights.unbind(-1), self.experts))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.moe = MoE()
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        return self.head(self.moe(self.embed(x)))


def main():
    torch.manual_seed(0)
    model = nn.DataParallel(Model())  # as written for several GPUs
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(int(sys.argv[1])):
        x = torch.randn(8, 8)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
