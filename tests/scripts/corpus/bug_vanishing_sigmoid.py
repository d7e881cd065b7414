"""A 20-layer MLP with Sigmoid activations and no normalisation or residual connections: each
Sigmoid scales the gradient by at most 1/4, the first layers' gradients vanish and they do not
learn.

    python bug_vanishing_sigmoid.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def deep_sigmoid_mlp(width=32, depth=20):
    layers = [nn.Linear(16, width), nn.Sigmoid()]
    for _ in range(depth - 2):
        layers += [nn.Linear(width, width), nn.Sigmoid()]  # the bug: 20 sigmoids deep
    layers.append(nn.Linear(width, 3))
    return nn.Sequential(*layers)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = deep_sigmoid_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x_all = torch.randn(1024, 16)
    y_all = x_all[:, :3].argmax(1)
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
