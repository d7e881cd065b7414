"""A classifier whose loop zeroes the gradients between backward and the optimizer step:
`loss.backward(); optimizer.zero_grad(); optimizer.step()`. zero_grad sets every .grad to None,
so the step skips every parameter: nothing ever changes, the loss stays where it started.

    python bug_zero_grad_before_step.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(20, 64)
        self.head = nn.Linear(64, 5)

    def forward(self, x):
        return self.head(F.relu(self.hidden(x)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)
    x_all = torch.randn(1024, 20)
    y_all = x_all[:, :5].argmax(1)
    model = Classifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        index = torch.randint(len(x_all), (16,))
        loss = F.cross_entropy(model(x_all[index]), y_all[index])
        loss.backward()
        optimizer.zero_grad()  # the bug: this belongs before backward
        optimizer.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
