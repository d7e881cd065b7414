"""An image classifier in the shape of pytorch/examples' mnist and cifar10 tutorials: conv /
BatchNorm / ReLU / max-pool blocks, dropout, a Linear head, log_softmax and nll_loss, Adadelta
at lr 1.0 with StepLR (the mnist example's defaults). The images are made in the script (pixels
in [0, 1], each class a brighter patch in its own place, plus noise; a fifth of the labels
random) and normalised per channel
with the data's mean and std, as transforms.Normalize does.

    python healthy_cnn.py --steps 300
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self, num_classes=4):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, 1, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, 1, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.dropout = nn.Dropout(0.25)
        self.fc1 = nn.Linear(32 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = self.dropout(torch.flatten(x, 1))
        x = F.relu(self.fc1(x))
        return F.log_softmax(self.fc2(x), dim=1)


def make_images(n, generator, num_classes=4):
    labels = torch.randint(num_classes, (n,), generator=generator)
    images = 0.5 * torch.rand(n, 3, 16, 16, generator=generator)
    for c in range(num_classes):
        row, col = divmod(c, 2)
        images[labels == c, :, row * 8:row * 8 + 8, col * 8:col * 8 + 8] += 0.25
    noisy = torch.rand(n, generator=generator) < 0.2  # real labels are not all right either
    labels[noisy] = torch.randint(num_classes, (int(noisy.sum()),), generator=generator)
    return images.clamp(0, 1), labels


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    args = parser.parse_args()
    torch.manual_seed(1)
    generator = torch.Generator().manual_seed(1)
    images, labels = make_images(2048, generator)
    mean, std = images.mean(dim=(0, 2, 3)), images.std(dim=(0, 2, 3))
    images = (images - mean[None, :, None, None]) / std[None, :, None, None]  # Normalize(mean, std)
    model = Net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=args.gamma)
    model.train()
    for step in range(args.steps):
        index = torch.randint(len(images), (args.batch_size,), generator=generator)
        data, target = images[index], labels[index]
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        scheduler.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
