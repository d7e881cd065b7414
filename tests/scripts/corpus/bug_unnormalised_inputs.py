"""An image classifier fed raw pixels: uint8 images turned into floats 0-255 without
`/ 255` or Normalize, so every channel of the model's input is ~100-1000× unit scale.

    python bug_unnormalised_inputs.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 4)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)
    labels = torch.randint(4, (512,))
    pixels = torch.randint(0, 200, (512, 3, 16, 16), dtype=torch.uint8)
    for c in range(4):
        r, k = divmod(c, 2)
        pixels[labels == c, :, r * 8:r * 8 + 8, k * 8:k * 8 + 8] += 55
    images = pixels.float()  # the bug: no / 255, no Normalize
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for step in range(args.steps):
        index = torch.randint(len(images), (16,))
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images[index]), labels[index])
        loss.backward()
        optimizer.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4g}")


if __name__ == "__main__":
    main()
