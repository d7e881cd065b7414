"""The calls that select a card (`torch.cuda.set_device`, `with torch.cuda.device(...)`,
`torch.set_default_device`) select the pinned one; under `cpu` there is none to select."""

from __future__ import annotations

import torch

from ...borrow import Borrowed, wrap_like
from ..cuda_on_cpu import under_cpu
from .remapper import Remapper


def patch_selection(owner: Borrowed, remapper: Remapper) -> None:
    """`torch.cuda.set_device`, `torch.cuda.device`, `torch.set_default_device`."""
    _patch_set_device(owner, remapper)
    _patch_cuda_device(owner, remapper)
    _patch_set_default_device(owner, remapper)


def _patch_set_device(owner: Borrowed, remapper: Remapper) -> None:
    original = torch.cuda.set_device

    def set_device(device):
        # Every rank's card is the pinned card: cuda:0 under a hard pin (CUDA_VISIBLE_DEVICES),
        # cuda:N under a soft pin. Pinned to the CPU there is no card to select.
        pinned = remapper.device
        if under_cpu(pinned):
            remapper.say("set_device", "torch.cuda.set_device({})", device)
            return
        if remapper.target(device) is not None:
            remapper.say("set_device", "torch.cuda.set_device({})", device)
        original(pinned.index)

    owner.set_attr(torch.cuda, "set_device", wrap_like(original, set_device))


def _patch_cuda_device(owner: Borrowed, remapper: Remapper) -> None:
    cls = torch.cuda.device
    original = cls.__init__

    def __init__(self, device):
        pinned = remapper.device
        if under_cpu(pinned):
            # Nothing to select: entering and leaving change nothing (and never start CUDA).
            self.idx = self.prev_idx = -1
            if device is not None and not (type(device) is int and device < 0):
                remapper.say("cuda.device", "torch.cuda.device({})", device)
            return
        original(self, device)
        if self.idx is not None and self.idx >= 0 and self.idx != pinned.index:
            self.idx = pinned.index
            remapper.say("cuda.device", "torch.cuda.device({})", device)

    owner.set_attr(cls, "__init__", wrap_like(original, __init__), "torch.cuda.device")


def _patch_set_default_device(owner: Borrowed, remapper: Remapper) -> None:
    original = torch.set_default_device

    def set_default_device(device):
        new = remapper.target(device) if device is not None else None
        if new is not None:
            remapper.say("set_default_device", "torch.set_default_device({})", device)
            device = new
        return original(device)

    owner.set_attr(torch, "set_default_device", wrap_like(original, set_default_device))
