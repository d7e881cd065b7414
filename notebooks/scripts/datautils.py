"""The data the DDP tutorial-shaped scripts learn: y = x·w + a little noise.

Same role as `datautils.MyTrainDataset` in pytorch/examples' ddp-tutorial-series, but with a
target a `Linear(20, 1)` can learn, so a run shows its loss falling epoch after epoch.
"""

import torch
from torch.utils.data import Dataset


class MyTrainDataset(Dataset):
    def __init__(self, size: int, features: int = 20):
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, features, generator=generator)
        w = torch.randn(features, 1, generator=generator)
        self.y = self.x @ w + 0.01 * torch.randn(size, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        return self.x[index], self.y[index]
