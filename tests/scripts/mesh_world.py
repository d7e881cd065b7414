"""A tensor-parallel example's start: a mesh sized by the job's world, built before any group
(torch forms it from torchrun's variables), then a collective over it."""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

mesh = init_device_mesh("cuda", (2,))  # as tensor_parallel_example.py: sized by the world
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
print(f"mesh {tuple(mesh.shape)} rank {dist.get_rank()} sum {t.item()}")
