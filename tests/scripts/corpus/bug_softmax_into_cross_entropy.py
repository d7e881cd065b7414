"""A classifier whose model ends in nn.Softmax while the loss is nn.CrossEntropyLoss, which
applies log_softmax itself: the loss sees probabilities in [0, 1] as logits, its gradients are
squashed and training crawls.

    python bug_softmax_into_cross_entropy.py --steps 100
"""

import argparse

import torch
import torch.nn as nn


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.classifier = nn.Sequential(nn.Linear(64, 6), nn.Softmax(dim=1))  # the bug

    def forward(self, x):
        return self.classifier(self.features(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)
    x_all = torch.randn(1024, 20)
    y_all = x_all[:, :6].argmax(1)
    model = Classifier()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        index = torch.randint(len(x_all), (16,))
        optimizer.zero_grad()
        loss = criterion(model(x_all[index]), y_all[index])
        loss.backward()
        optimizer.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
