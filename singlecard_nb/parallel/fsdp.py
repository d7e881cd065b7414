"""FSDP1 (`FullyShardedDataParallel`) on one card: the real FSDP over a world of one.

On a GPU pin, `device_id` in every form (`local_rank`, `torch.cuda.current_device()`,
`torch.device("cuda", rank)`, none) becomes the pinned card, as DDP's device arguments do.
Under `%singlecard cpu`, torch's FSDP1 refuses a module on the CPU unless it is told the CPU is
its device ("FSDP needs a non-CPU accelerator device"); told `device_id=torch.device("cpu")`
it runs, with torch.cpu's streams (which wait for nothing) as its device handle. So it is
still torch's FSDP1: nested wrapping by `auto_wrap_policy`, `FSDP.state_dict_type(...)`,
`summon_full_params`, `clip_grad_norm_`, `no_sync`, `optim_state_dict` and the checkpoints they
write are torch's own (keys without `_fsdp_wrapped_module.`, as a multi-GPU FSDP1 run writes
them). What differs under `cpu`: `sync_module_states=True` is dropped (a broadcast from rank 0
has no one to reach in a world of one, and FSDP1 demands GPU tensors for it);
`CPUOffload(offload_params=True)` is dropped (the parameters are on the CPU already, and
torch's offload path waits on a CPU stream, which has no `synchronize`). In a world of one,
FSDP1 itself shards nothing (torch switches FULL_SHARD to NO_SHARD and says so); a
SHARDED_STATE_DICT then holds whole tensors.
Without a process group, the wrapper forms the world of one, as DDP does; when that group is
destroyed (`destroy_process_group`, `%singlecard off`) the wrapper tree lets go of it, so
gloo's listener closes (groups.py), and calling it says to rebuild it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ..borrow import Borrowed, wrap_like
from ..notices import Notices
from .cuda_on_cpu import under_cpu
from .groups import Groups


def install(owner: Borrowed, device: torch.device, groups: Groups, notices: Notices,
            converted: Callable[[str, str], None]) -> None:
    """Patch `FullyShardedDataParallel.__init__` for `device`, owned by `owner`, telling
    `converted(what, into)` of each FSDP made: now if
    torch.distributed.fsdp is imported, else when it is (importing it takes a third of torch's
    own import time, which every pin, and every rank of `--ranks N`, would pay for nothing)."""
    if not dist.is_available():
        return
    owner.after_import(
        _MODULE, lambda module: _patch(owner, module.FullyShardedDataParallel, device, groups,
                                       notices, converted),
        "FullyShardedDataParallel (world of one)")


_MODULE = "torch.distributed.fsdp.fully_sharded_data_parallel"


def _patch(owner: Borrowed, FSDP: Any, device: torch.device, groups: Groups,  # noqa: N803
           notices: Notices, converted: Callable[[str, str], None]) -> None:
    original = FSDP.__init__
    signature = inspect.signature(original)
    depth = [0]  # auto_wrap_policy builds the inner wrappers inside the outer one's __init__

    def __init__(self, module, *args, **kwargs):
        call = signature.bind(self, module, *args, **kwargs)
        arguments = call.arguments
        outer = depth[0] == 0
        requested = arguments.get("device_id")
        arguments["device_id"] = _device_id(requested, device)
        if under_cpu(device) and arguments.get("sync_module_states"):
            arguments["sync_module_states"] = False
            notices.say("fsdp-sync", "singlecard_nb: FullyShardedDataParallel("
                        "sync_module_states=True) under `%singlecard cpu`: a world of one has no "
                        "other rank to broadcast to, so there is nothing to sync (FSDP1 would "
                        "refuse CPU tensors for it).", stacklevel=3)
        offload = arguments.get("cpu_offload")
        if under_cpu(device) and getattr(offload, "offload_params", False):
            arguments["cpu_offload"] = None
            notices.say("fsdp-offload", "singlecard_nb: FullyShardedDataParallel(cpu_offload="
                        "CPUOffload(offload_params=True)) under `%singlecard cpu`: the device is "
                        "the CPU, where the parameters already are, so there is nothing to "
                        "offload (torch's offload path would wait on a CPU stream that cannot).",
                        stacklevel=3)
        if outer and arguments.get("process_group") is None \
                and arguments.get("device_mesh") is None and not dist.is_initialized():
            notices.say("fsdp-group", "singlecard_nb: FullyShardedDataParallel built without "
                        "init_process_group: single-card mode formed a world of one (rank 0) "
                        "for it.", stacklevel=3)
            groups.form()
        depth[0] += 1
        try:
            original(*call.args, **call.kwargs)
        except BaseException:
            if outer:  # as for DDP: a traceback keeps the half-built tree, not our group
                groups.release(self)
            raise
        finally:
            depth[0] -= 1
        if outer:
            groups.track(self)  # released (its group let go of) when the group is destroyed
            converted(f"FullyShardedDataParallel(device_id={requested!r})",
                      f"the real FSDP1 on {device}, a world of one")

    owner.set_attr(FSDP, "__init__", wrap_like(original, __init__),
                   "FullyShardedDataParallel (world of one)")


def _device_id(requested: Any, device: torch.device) -> Any:
    """FSDP's device_id for the pinned device: the CPU under `cpu` (the only form FSDP1 accepts
    there), the pinned card for any GPU form, none where none was given on a GPU."""
    if under_cpu(device):
        return torch.device("cpu")
    if requested is None:
        return None  # FSDP takes the current device, which the pin selected
    return torch.device("cuda", device.index)
