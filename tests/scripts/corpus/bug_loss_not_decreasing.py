"""A classifier whose labels were shuffled independently of the inputs (a `shuffle=True` applied
to the label list only, while building the dataset): nothing links a label to its input, and the
loss stays at log(num_classes) for as long as it trains.

    python bug_loss_not_decreasing.py --steps 300
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    torch.manual_seed(0)
    inputs = torch.randn(4096, 20)
    labels = inputs[:, :4].argmax(1)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        index = torch.randint(len(inputs), (16,))
        shuffled = labels[torch.randint(len(labels), (16,))]  # the bug: labels of other samples
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs[index]), shuffled)
        loss.backward()
        optimizer.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
