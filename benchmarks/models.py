"""The three benchmark models of issue 4 ("Speed — benchmarks/") and their inputs.

* ``resnet``      — a ResNet-18-like CNN written here (no torchvision): BasicBlocks that call
  ``self.relu`` twice per block as torchvision does, so the same module is called twice per step.
* ``transformer`` — ``nn.TransformerEncoder`` of 6 ``nn.TransformerEncoderLayer`` (d_model 256,
  4 heads, batch_first, dropout 0).  Run with grad enabled, the fused fast path is off.
* ``mlp5000``     — ``nn.Sequential`` of 2 500 × (Linear(16, 16) + ReLU): 5 000 tiny leaf modules,
  which measures the fixed per-module-call cost of an inspector.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)  # the same ReLU module, second call in this block


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._layer(64, 2, 1)
        self.layer2 = self._layer(128, 2, 2)
        self.layer3 = self._layer(256, 2, 2)
        self.layer4 = self._layer(512, 2, 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def _layer(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        layers = [BasicBlock(self.inplanes, planes, stride)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet() -> tuple[nn.Module, torch.Tensor]:
    return ResNet18(), torch.randn(16, 3, 64, 64)


def transformer() -> tuple[nn.Module, torch.Tensor]:
    layer = nn.TransformerEncoderLayer(
        d_model=256, nhead=4, dim_feedforward=1024, dropout=0.0, batch_first=True
    )
    # enable_nested_tensor=False: avoids a warning; with grad enabled no fast path is taken anyway
    model = nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False)
    return model, torch.randn(16, 128, 256)


def mlp5000() -> tuple[nn.Module, torch.Tensor]:
    mods: list[nn.Module] = []
    for _ in range(2500):
        mods += [nn.Linear(16, 16), nn.ReLU()]
    return nn.Sequential(*mods), torch.randn(16, 16)


MODELS: dict[str, Callable[[], tuple[nn.Module, torch.Tensor]]] = {
    "resnet": resnet,
    "transformer": transformer,
    "mlp5000": mlp5000,
}

LABELS = {
    "resnet": "ResNet-18-like CNN, 16×3×64×64",
    "transformer": "Transformer encoder 6×256, 16×128",
    "mlp5000": "2 500×(Linear16+ReLU), 16×16",
}
