"""Device references follow the pin: every way code names a CUDA device reaches the pinned one.

Multi-GPU code names its card everywhere: `.to(local_rank)`, `.cuda(rank)`, `device=f"cuda:{rank}"`,
`torch.load(path, map_location=f"cuda:{rank}")`, `torch.cuda.set_device(rank)`,
`with torch.cuda.device(rank):`. While single-card mode is on, each of these is sent to the
pinned device: under a hard GPU pin (the card is cuda:0) only other ordinals change; under a soft
pin to cuda:N every other ordinal becomes N; pinned to the CPU, every CUDA device is the CPU.

Mechanism: targeted patches of the calls that take a device, chosen by measurement over a
`TorchFunctionMode` (benchmarks/: a mode adds Python work to every torch operation, these add a
dictionary look-up to the calls that name a device and nothing to the others). Each remapping is
said once per kind (`Notices`) and counted for `%singlecard status`. The decision is one
`Remapper` (remapper.py); the patches, by the calls they take over: `.to()` / `.cuda()` (moves.py),
factory functions' `device=` (factories.py), `torch.load`'s map_location (load.py), and the calls
that select a card (selection.py).

Not covered (they fail as torch makes them fail): `torch.device(0)` on a torch without CUDA,
`torch.Generator(device="cuda")`, CUDA streams and events, factory functions imported by name
before single-card mode was turned on, and code inside `torch.compile`d regions.
"""

from __future__ import annotations

from ...borrow import Borrowed
from .factories import FACTORIES, TENSOR_FACTORIES, patch_factories
from .load import patch_load
from .moves import patch_moves
from .remapper import Remapper
from .selection import patch_selection

__all__ = ["FACTORIES", "TENSOR_FACTORIES", "Remapper", "install"]


def install(owner: Borrowed, remapper: Remapper) -> None:
    """Patch every call that takes a device so that it follows `remapper` (owned by `owner`)."""
    _device_constructors_from_torch(owner)
    patch_moves(owner, remapper)
    patch_factories(owner, remapper)
    patch_load(owner, remapper)
    patch_selection(owner, remapper)


def _device_constructors_from_torch(owner: Borrowed) -> None:
    """`with torch.device(d)` and `torch.set_default_device(d)` give `d` to the factories in
    torch's cached set of them (`torch.utils._device._device_constructors`, made on first use).
    Made while the factories are patched, it would hold the patches and, once they are given
    back, none of torch's own: device contexts would stop working for the rest of the process.
    So it is made from torch's own factories before patching, and forgotten at the release."""
    from torch.utils import _device

    constructors = getattr(_device, "_device_constructors", None)
    if constructors is None or not hasattr(constructors, "cache_clear"):
        return
    constructors.cache_clear()
    constructors()
    owner.on_restore(constructors.cache_clear, "torch's cached device constructors")
