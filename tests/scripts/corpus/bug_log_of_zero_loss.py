"""A classifier whose loss is written by hand outside any module, -(y * log p).sum(1).mean(),
on the probabilities of the model's Softmax: once the logits separate by more than ~100 (lr 3
lets them), float32's softmax gives exact zeros, 0 * log(0) is NaN and the loss is NaN.

    python bug_log_of_zero_loss.py --steps 100
"""

import argparse

import torch
import torch.nn as nn


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
        self.softmax = nn.Softmax(dim=1)

    def forward(self, x):
        return self.softmax(self.net(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)
    x_all = torch.randn(1024, 16)
    y_all = nn.functional.one_hot(x_all[:, :4].argmax(1), 4).float()
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=3.0)
    for step in range(args.steps):
        index = torch.randint(len(x_all), (16,))
        p = model(x_all[index])
        loss = -(y_all[index] * torch.log(p)).sum(1).mean()  # the bug: log of an exact 0
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
