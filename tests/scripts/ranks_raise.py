"""A job where rank 1 meets a bad batch after the first collective and raises: the others wait
in the next collective for a rank that is gone.

    torchrun --nproc_per_node=2 ranks_raise.py
"""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
dist.all_reduce(torch.ones(1))
print("first all_reduce done")
if rank == 1:
    raise ValueError("bad batch on rank 1: labels out of range")  # RAISE_LINE
dist.all_reduce(torch.ones(1))  # WAIT_LINE: the others wait here for rank 1
print("never printed")
