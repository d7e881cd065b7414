"""Fine-tuning in the shape of the transfer-learning tutorial's "ConvNet as fixed feature
extractor": a backbone (here a small conv net, "pretrained" by being built from a fixed seed)
whose parameters have requires_grad = False, a new Linear head, and an optimizer over the head's
parameters only (SGD, momentum 0.9, StepLR). The images are made in the script and normalised.

    python healthy_finetune_frozen.py --steps 300
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))

    def forward(self, x):
        return torch.flatten(self.features(x), 1)


class Classifier(nn.Module):
    def __init__(self, num_classes=3):
        super().__init__()
        self.backbone = Backbone()
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x):
        return self.fc(self.backbone(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch_size", type=int, default=16)
    args = parser.parse_args()
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    model = Classifier()
    for param in model.backbone.parameters():
        param.requires_grad = False
    labels = torch.randint(3, (1024,), generator=generator)
    images = torch.randn(1024, 3, 12, 12, generator=generator)
    images[:, 0] += labels.float().view(-1, 1, 1) - 1.0  # the class shows in the red channel
    images = (images - images.mean((0, 2, 3), keepdim=True)) / images.std((0, 2, 3), keepdim=True)
    optimizer = torch.optim.SGD(model.fc.parameters(), lr=0.01, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.1)
    model.train()
    for step in range(args.steps):
        index = torch.randint(len(images), (args.batch_size,), generator=generator)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images[index]), labels[index])
        loss.backward()
        optimizer.step()
        scheduler.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
