"""`torch.distributed.rpc.init_rpc` in single-card mode, in a world of one.

An RPC job's processes play different parts (pytorch/examples' distributed/rpc: a trainer and
a parameter server, an agent and its observers), so no world of one stands for it, as one does
for a data-parallel job. `mp.spawn` runs rank 0 here (spawn.py), and its `init_rpc(...,
world_size=N)` would wait for the N-1 others, which nobody starts, until torch's rendezvous
times out (pytorch/examples' rpc/rnn: more than 5 minutes). Instead it stops at once, saying
why and what runs the job.
Ranks that share a device in a real world (`%singlecard cpu --ranks N`) call torch's own.
"""

from __future__ import annotations

from typing import Any

import torch

from ..borrow import Borrowed, wrap_like
from ..job import launched_world_size


def install(owner: Borrowed) -> None:
    """Patch `torch.distributed.rpc.init_rpc`, owned by `owner` (where torch has RPC)."""
    if not torch.distributed.is_available():
        return
    try:
        import torch.distributed.rpc as rpc
    except ImportError:
        return
    if not rpc.is_available():
        return
    original = rpc.init_rpc

    def init_rpc(name: str, backend: Any = None, rank: int = -1, world_size: int | None = None,
                 rpc_backend_options: Any = None) -> Any:
        size = world_size if world_size is not None else launched_world_size()
        if isinstance(size, int) and size > 1:
            raise RuntimeError(
                f"singlecard_nb: rpc.init_rpc({name!r}, rank={rank}, world_size={size}) would "
                f"wait for the job's other {size - 1} process(es), which single-card mode does "
                "not start (it runs one process: rank 0 of mp.spawn, or this script alone), "
                "until torch's rendezvous timeout. An RPC job's processes play different parts "
                "(a trainer, a parameter server), so no world of one stands for it: run the "
                "script without single-card mode (`%singlecard off`, or python without `-m "
                "singlecard_nb --device`).")
        return original(name, backend, rank, world_size, rpc_backend_options)

    owner.set_attr(rpc, "init_rpc", wrap_like(original, init_rpc),
                   "torch.distributed.rpc.init_rpc")
