"""The pin's side of torch: the ordinal of a UUID, the current device, the default device.

Only reached once the CUDA driver has started (a soft pin) or when asked for the default
device. Everything goes through torch's *own* functions (`own`): single-card mode replaces
`torch.cuda.set_device`, `torch.set_default_device` and more with versions that send every
device to the pinned one, and a re-pin that selected or restored a device through those would
land on the previous pin's card.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import borrow
from .pin_targets import TargetError

if TYPE_CHECKING:
    import torch

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _ours(function: Any) -> bool:
    code = getattr(function, "__code__", None)
    return code is not None and os.path.abspath(code.co_filename).startswith(_PACKAGE)


def own(function: Callable) -> Callable:
    """`function` without singlecard_nb's own wrappers around it: torch's function (or whatever
    the user installed), never a patch of ours. Our patches keep `__wrapped__`
    (`functools.update_wrapper`); a wrapper that is not ours is where unwrapping stops."""
    return inspect.unwrap(function, stop=lambda f: not _ours(f))


def _normal_uuid(uuid: str) -> str:
    return re.sub(r"^(gpu|mig)-", "", str(uuid).strip().lower())


def torch_ordinal_for_uuid(uuid: str) -> int | None:
    """The torch ordinal of the device with this UUID. Only call after the driver started."""
    import torch

    if not torch.backends.cuda.is_built():
        raise TargetError(f"this torch ({torch.__version__}) is built without CUDA, so it cannot "
                          f"use {uuid}; install a CUDA build of torch")
    properties = own(torch.cuda.get_device_properties)
    for ordinal in range(own(torch.cuda.device_count)()):
        if _normal_uuid(str(properties(ordinal).uuid)) == _normal_uuid(uuid):
            return ordinal
    return None


def select_current_device(ordinal: int, owner: borrow.Borrowed) -> None:
    """Make `cuda:ordinal` torch's current device, restoring the previous one on release."""
    import torch

    set_device = own(torch.cuda.set_device)
    previous = own(torch.cuda.current_device)()
    set_device(ordinal)
    owner.on_restore(lambda: set_device(previous), "torch.cuda current device")


def set_default_device(device: torch.device, owner: borrow.Borrowed) -> None:
    """Make `device` torch's default device, restoring the previous one on release."""
    import torch

    # The public getter resolves an index-less device by allocating a tensor, which could start
    # CUDA, so read the global context torch.set_default_device itself keeps.
    globals_ = torch._GLOBAL_DEVICE_CONTEXT
    context = getattr(globals_, "device_context", None)
    previous = None if context is None else context.device
    set_default = own(torch.set_default_device)
    set_default(device)

    def restore() -> None:
        set_default(previous)
        forget_empty_default_device()

    owner.on_restore(restore, "torch default device")


def forget_empty_default_device() -> None:
    """"No default device" as torch 2.6-2.7 can read it: their get_default_device() fails on
    the None context their own set_default_device(None) leaves, so such a context goes."""
    import torch

    globals_ = torch._GLOBAL_DEVICE_CONTEXT
    if getattr(globals_, "device_context", 0) is None:
        del globals_.device_context


def no_cuda_note() -> str:
    """A sentence to add to a GPU pin when this torch cannot use a GPU at all ("" when it can)."""
    import torch

    if torch.backends.cuda.is_built():
        return ""
    return (f" Note: this torch ({torch.__version__}) is built without CUDA, so torch itself "
            "cannot use the GPU; install a CUDA build of torch.")
