"""A DistributedDataParallel (or FSDP1 tree) built in single-card mode, let go of its
world-of-one process group once that group is destroyed: its autograd hooks removed, reducer and
group dropped, so gloo's listener can close. It keeps `.module` and its `state_dict()`; calling
it says to rebuild it, as a real DDP over a destroyed group fails."""

from __future__ import annotations

import sys
from typing import Any

from torch import nn

_RELEASED = ("This DistributedDataParallel (or FullyShardedDataParallel) was built in "
             "single-card mode, and its world-of-one process group has since been destroyed (destroy_process_group, `%singlecard off` "
             "or `%unload_ext`). Build the wrapper again (its `.module` is intact).")


def release_wrapper(wrapper: nn.Module) -> None:
    """Drop a DDP's (or an FSDP1 tree's) hold on its process group (so gloo's listener can
    close)."""
    if _is_fsdp(wrapper):
        _release_fsdp(wrapper)
        return
    state = wrapper.__dict__  # also a half-built one: only what is there
    reducer = state.get("reducer")
    if reducer is not None:
        reducer._remove_autograd_hooks()  # the hooks on the module's parameters call it
    for name in ("reducer", "logger"):
        state.pop(name, None)
    if "process_group" in state:
        state["process_group"] = None
    state["forward"] = _released_forward


def _is_fsdp(wrapper: nn.Module) -> bool:
    fsdp = sys.modules.get("torch.distributed.fsdp.fully_sharded_data_parallel")
    return fsdp is not None and isinstance(wrapper, fsdp.FullyShardedDataParallel)


def _release_fsdp(wrapper: nn.Module) -> None:
    # FSDP1 holds its group on every wrapper of the tree, on their flat-parameter handles and
    # on the execution-order record they share.
    fsdp = sys.modules["torch.distributed.fsdp.fully_sharded_data_parallel"]
    if "_modules" not in wrapper.__dict__:  # failed before nn.Module.__init__: holds nothing
        return
    for module in wrapper.modules():
        if not isinstance(module, fsdp.FullyShardedDataParallel):
            continue
        state = module.__dict__
        for holder in (state, getattr(state.get("_handle"), "__dict__", {}),
                       getattr(state.get("_exec_order_data"), "__dict__", {})):
            for name in ("process_group", "_inter_node_pg"):
                if holder.get(name) is not None:
                    holder[name] = None
        state["forward"] = _released_forward


def _released_forward(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError(_RELEASED)


def is_live_group(group: Any) -> bool:
    from torch.distributed import distributed_c10d

    return group is not None and group in distributed_c10d._world.pg_map
