"""`torch.load` sends every CUDA storage to the pinned device, whatever form its map_location
takes (none, a device, a dict, a function), torch's own rules for each form first."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from ...borrow import Borrowed, wrap_like
from .remapper import DEVICE_TYPES, Remapper


def patch_load(owner: Borrowed, remapper: Remapper) -> None:
    import torch.serialization as serialization

    original = torch.load
    signature = inspect.signature(original)
    default_restore = serialization.default_restore_location

    def load(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        map_location = bound.arguments.get("map_location")
        bound.arguments["map_location"] = _map_location(map_location, remapper, default_restore)
        return original(*bound.args, **bound.kwargs)

    patched = wrap_like(original, load)
    owner.set_attr(torch, "load", patched)
    if serialization.load is original:
        owner.set_attr(serialization, "load", patched)


def _map_location(map_location: Any, remapper: Remapper, default_restore: Callable) -> Any:
    """`map_location` for torch.load that sends every CUDA storage to the pinned device."""
    if type(map_location) in DEVICE_TYPES:
        new = remapper.target(map_location)
        if new is None:
            return map_location
        remapper.say("torch.load", "torch.load(..., map_location={})", map_location, 4)
        return new

    def restore(storage, location):
        # torch's own rules for each form first, then the storage's place follows the pin.
        if callable(map_location):
            result = map_location(storage, location)
            if result is not None:
                return result
        elif isinstance(map_location, dict):
            location = map_location.get(location, location)
        new = remapper.target(location)
        if new is None:
            return default_restore(storage, location)
        what = "map_location={}" if map_location is not None else "a storage saved on {}"
        remapper.say("torch.load", f"torch.load(..., {what})",
                     map_location if isinstance(map_location, dict) else location, 3)
        return default_restore(storage, str(new))

    return restore
