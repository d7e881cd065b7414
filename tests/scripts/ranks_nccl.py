"""A job written for NCCL on GPUs: init_process_group("nccl"), then an all_reduce of its rank.

    torchrun --nproc_per_node=2 ranks_nccl.py
"""

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"backend {dist.get_backend()} world {dist.get_world_size()} sum {t.item():g}")
dist.destroy_process_group()
