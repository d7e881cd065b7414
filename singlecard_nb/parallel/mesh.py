"""Device meshes at the job's world: `init_device_mesh` for FSDP2, DTensor and tensor parallel.

A mesh is sized from the job (`(WORLD_SIZE,)`, `(dp, tp)`), and single-card mode runs a world
of one, so a mesh whose dimensions multiply to 1 is what one card can be: it is built on the
pinned device (`"cuda"` becomes `"cpu"` under `%singlecard cpu`), forming the world of one when
no group exists yet (through `init_process_group`, groups.py). `parallelize_module` with
`ColwiseParallel` / `RowwiseParallel`, `fully_shard` and `torch.distributed.checkpoint` then
run on it as torch's own. A mesh asking for more ranks fails at the user's call with what to
change, instead of deep inside torch's group set-up. In a rank of N that a launcher started
(`%singlecard cpu --ranks N`, torchrun under `--device`) the world is N, all on the one device.
"""

from __future__ import annotations

import inspect
import math
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ..borrow import Borrowed, wrap_like
from ..notices import Notices
from .cuda_on_cpu import under_cpu

# Modules that hold torch's init_device_mesh as an attribute users import it from.
_HOLDERS = ("torch.distributed.device_mesh", "torch.distributed._tensor.device_mesh",
            "torch.distributed.tensor.device_mesh")


class MeshTooLargeError(RuntimeError):
    """A device mesh asking for more ranks than the world of one single-card mode runs."""


def install(owner: Borrowed, device: torch.device, notices: Notices,
            converted: Callable[[str, str], None], world: int = 1) -> None:
    """Patch init_device_mesh wherever it is importable from, owned by `owner`, telling
    `converted(what, into)` of each mesh made.

    world: N in a rank of a world of N whose ranks share the device (single_card.enable)."""
    if not dist.is_available():
        return
    import torch.distributed.device_mesh as device_mesh

    original = device_mesh.init_device_mesh
    patched = wrap_like(original, _init_device_mesh(original, device, notices, converted,
                                                    world))
    for name in _HOLDERS:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "init_device_mesh", None) is original:
            owner.set_attr(module, "init_device_mesh", patched, "init_device_mesh (world of one)")


def _init_device_mesh(original: Any, device: torch.device, notices: Notices,
                      converted: Callable[[str, str], None], launched: int) -> Any:
    signature = inspect.signature(original)

    def init_device_mesh(*args: Any, **kwargs: Any) -> Any:
        call = signature.bind(*args, **kwargs)
        arguments = call.arguments
        requested_type, shape = arguments["device_type"], tuple(arguments["mesh_shape"])
        asked = f"init_device_mesh({requested_type!r}, {shape})"
        ranks = math.prod(shape)
        # the job's world: the group's, else the one a launcher started this process in
        # (`--ranks N`, torchrun under --device), whose group forms at this call
        world = dist.get_world_size() if dist.is_initialized() else launched
        if ranks != world:
            raise MeshTooLargeError(_too_large(asked, shape, ranks, world, device,
                                               arguments.get("mesh_dim_names")))
        if str(requested_type).startswith("cuda") and under_cpu(device):
            arguments["device_type"] = device.type
            notices.say("mesh-cpu", lambda: (
                f"singlecard_nb: {asked} under `%singlecard cpu` is a {device.type} mesh: this "
                "session's one device is the CPU."))
        if not dist.is_initialized():  # torch would rendezvous through env:// instead
            dist.init_process_group("gloo" if under_cpu(device) else None)
        mesh = original(*call.args, **call.kwargs)
        converted(asked, f"a {arguments['device_type']} mesh {shape}, a world of "
                         f"{'one' if world == 1 else world}")
        return mesh

    return init_device_mesh


def _too_large(asked: str, shape: tuple, ranks: int, world: int, device: torch.device,
               names: Any) -> str:
    ones = tuple(1 for _ in shape)
    env = os.environ.get("WORLD_SIZE")
    hint = (f" WORLD_SIZE={env} is set in this process's environment: unset it (single-card "
            "mode provides 1) or set it to 1." if env not in (None, "1") else "")
    dims = f", mesh_dim_names={tuple(names)!r}" if names else ""
    job = (f" `%singlecard off` runs the {ranks}-rank job with torchrun on {ranks} GPUs."
           if ranks > 1 else " A dimension of 0 comes from a world size divided by more than it "
           "is, or from device_count(), which is 0 under `%singlecard cpu` (torch.cuda's answer).")
    return (f"singlecard_nb: {asked} asks for {ranks} ranks, and single-card mode runs a world "
            f"of {world} on {device}. Size the mesh from the world: "
            f"init_device_mesh(..., {ones}{dims}) here, e.g. (WORLD_SIZE // tp, tp) with tp=1."
            f"{hint}{job}")
