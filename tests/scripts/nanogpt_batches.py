"""nanoGPT's data path in small (a test script; argv: checkpoint path).

`get_batch` pins each batch and copies it with `non_blocking=True` when the device is CUDA;
a side `torch.cuda.Stream` copy with `record_stream`; a `DataLoader(pin_memory=True)`; the
gradient accumulation divided by WORLD_SIZE under torchrun, as train.py does; a checkpoint.
"""

import os
import sys

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

path = sys.argv[1]
device, device_type = "cuda", "cuda"
ddp = int(os.environ.get("RANK", -1)) != -1
accumulation = 8
if ddp:
    torch.distributed.init_process_group(backend="nccl")
    accumulation //= int(os.environ["WORLD_SIZE"])
torch.manual_seed(0)
data = np.random.default_rng(0).integers(0, 16, 4096).astype(np.uint16)
block, batch = 8, 4


def get_batch():
    ix = torch.randint(len(data) - block, (batch,))
    x = torch.stack([torch.from_numpy(data[i:i + block].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block].astype(np.int64)) for i in ix])
    if device_type == "cuda":
        x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device,
                                                                                non_blocking=True)
    else:
        x, y = x.to(device), y.to(device)
    return x, y


model = nn.Sequential(nn.Embedding(16, 16), nn.Linear(16, 16)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
side = torch.cuda.Stream()
losses = []
for _ in range(3):
    for _micro in range(accumulation):
        x, y = get_batch()
        with torch.cuda.stream(side):
            y = y.cuda(non_blocking=True)
        torch.cuda.current_stream().wait_stream(side)
        y.record_stream(torch.cuda.current_stream())
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()) / accumulation
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    losses.append(round(loss.item() * accumulation, 4))
loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4, pin_memory=True)
pinned = [b.is_pinned() for (b,) in loader]
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
print(f"nanogpt: accumulation {accumulation} losses {losses} pinned {pinned}")
if ddp:
    torch.distributed.destroy_process_group()
