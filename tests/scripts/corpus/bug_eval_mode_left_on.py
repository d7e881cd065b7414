"""A CNN whose validation at step 0 calls model.eval() and the loop never calls model.train()
again: BatchNorm normalises with its running statistics and Dropout is off for the rest of
training.

    python bug_eval_mode_left_on.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(16 * 4 * 4, 3)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(self.dropout(torch.flatten(x, 1)))


def evaluate(model, x, y):
    model.eval()
    with torch.no_grad():
        return F.cross_entropy(model(x), y).item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)
    labels = torch.randint(3, (512,))
    images = torch.randn(512, 1, 8, 8) + labels.float().view(-1, 1, 1, 1)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    for step in range(args.steps):
        if step % 50 == 0:
            print(f"step {step}: val loss {evaluate(model, images[:64], labels[:64]):.4f}")
            # the bug: no model.train() after the evaluation
        index = torch.randint(64, len(images), (16,))
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images[index]), labels[index])
        loss.backward()
        optimizer.step()
    print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
