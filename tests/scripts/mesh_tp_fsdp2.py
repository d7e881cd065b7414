"""FSDP2 + tensor parallel on a 2-D mesh sized from WORLD_SIZE (a test script; argv: tp, folder).

The shape of pytorch/examples' fsdp_tp_example.py: `init_device_mesh("cuda", (dp, tp))`,
`parallelize_module` with ColwiseParallel / RowwiseParallel over "tp", `fully_shard` over "dp",
a few steps, then a torch.distributed.checkpoint save and load.
"""

import os
import sys

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

tp_size, folder = int(sys.argv[1]), sys.argv[2]
world_size = int(os.environ["WORLD_SIZE"])
dp_size = world_size // tp_size
mesh = init_device_mesh("cuda", (dp_size, tp_size), mesh_dim_names=("dp", "tp"))
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 5)).to("cuda")
model = parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
model = fully_shard(model, mesh=mesh["dp"])
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
torch.manual_seed(1)
x = torch.randn(16, 10, device="cuda")
losses = []
for _ in range(3):
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    losses.append(loss.item())
dcp.save({"model": model.state_dict()}, checkpoint_id=folder)
state = {"model": model.state_dict()}
dcp.load(state, checkpoint_id=folder)
model.load_state_dict(state["model"])
print(f"mesh {tuple(mesh.shape)} {mesh.device_type}: losses {[round(v, 4) for v in losses]}")
