"""A job where one rank leaves while the others wait: by default rank 1 meets a bad batch after
the first collective and raises, and the others wait in the next collective for a rank that is
gone. The other ways a rank goes wrong, by the first argument:

    exit0       rank 1 runs out of data: sys.exit(0) while rank 0 waits in all_reduce
    exit3       rank 1 calls sys.exit(3)
    extra       rank 0 logs a metric with an all_reduce of its own: gloo finds the sizes differ
    extra-hang  the same with tensors gloo does not check: every rank waits for ever
    loader      no collective at all: each rank waits for a batch that never comes

    torchrun --nproc_per_node=2 ranks_raise.py [mode]
"""

import queue
import sys

import torch
import torch.distributed as dist

mode = sys.argv[1] if len(sys.argv) > 1 else "raise"
dist.init_process_group("gloo")
rank = dist.get_rank()
if mode == "loader":
    print("waiting for a batch", flush=True)
    queue.Queue().get()  # LOADER_LINE: a DataLoader whose workers deadlocked
dist.all_reduce(torch.ones(1))
print("first all_reduce done")
if mode in ("extra", "extra-hang"):
    for _step in range(3):
        dist.all_reduce(torch.ones(4))  # STEP_LINE: the gradient, on every rank
        if rank == 0:
            size = 100_000 if mode == "extra" else 1
            dist.all_reduce(torch.ones(size))  # EXTRA_LINE: a metric, on rank 0 only
    sys.exit(0)
if rank == 1:
    if mode == "exit0":
        sys.exit(0)  # EXIT_LINE: out of data
    if mode == "exit3":
        sys.exit(3)  # EXIT_LINE
    raise ValueError("bad batch on rank 1: labels out of range")  # RAISE_LINE
dist.all_reduce(torch.ones(1))  # WAIT_LINE: the others wait here for rank 1
print("never printed")
