"""`.to()` and `.cuda()` of tensors, modules and storages follow the pin."""

from __future__ import annotations

import torch
from torch import nn

from ...borrow import Borrowed, wrap_like
from ..cuda_on_cpu import under_cpu
from .remapper import DEVICE_TYPES, NO_ARGUMENT, Remapper, compiling


def patch_moves(owner: Borrowed, remapper: Remapper) -> None:
    """`.to()` first: `.cuda()` under `cpu` moves through the patched `Tensor.to`."""
    _patch_to(owner, remapper, torch.Tensor, "Tensor.to", "tensor.to({})")
    _patch_to(owner, remapper, nn.Module, "Module.to", "module.to({})")
    _patch_tensor_cuda(owner, remapper)
    _patch_storage_cuda(owner, remapper)


def _patch_to(owner: Borrowed, remapper: Remapper, cls: type, label: str, call: str) -> None:
    original = cls.to

    def to(self, *args, **kwargs):
        if args:
            if type(args[0]) in DEVICE_TYPES and not compiling():
                new = remapper.target(args[0])
                if new is not None:
                    remapper.say(".to", call, args[0])
                    args = (new, *args[1:])
        elif kwargs.get("device") is not None and not compiling():
            new = remapper.target(kwargs["device"])
            if new is not None:
                remapper.say(".to", call.replace("{}", "device={}"), kwargs["device"])
                kwargs["device"] = new
        return original(self, *args, **kwargs)

    owner.set_attr(cls, "to", wrap_like(original, to), label)


def _patch_tensor_cuda(owner: Borrowed, remapper: Remapper) -> None:
    original = torch.Tensor.cuda
    to = torch.Tensor.to  # already patched: moving to remapper.device is never remapped again

    def cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
        if compiling():
            return original(self, device, non_blocking, memory_format=memory_format)
        if under_cpu(remapper.device):  # pinned to the CPU: .cuda() means "the device"
            remapper.say(".cuda", "tensor.cuda({})", NO_ARGUMENT if device is None else device)
            return to(self, remapper.device, non_blocking=non_blocking,
                      memory_format=memory_format)
        if device is not None:
            new = remapper.target(device)
            if new is not None:
                remapper.say(".cuda", "tensor.cuda({})", device)
                device = new
        return original(self, device, non_blocking, memory_format=memory_format)

    owner.set_attr(torch.Tensor, "cuda", wrap_like(original, cuda), "Tensor.cuda")


def _patch_storage_cuda(owner: Borrowed, remapper: Remapper) -> None:
    # map_location=lambda storage, loc: storage.cuda(gpu) is how older scripts resume.
    from torch.storage import _StorageBase

    for cls, label in ((_StorageBase, "UntypedStorage.cuda"), (torch.TypedStorage,
                                                               "TypedStorage.cuda")):
        original = cls.cuda

        def cuda(self, device=None, non_blocking=False, _original=original):
            if under_cpu(remapper.device):
                remapper.say(".cuda", "storage.cuda({})", NO_ARGUMENT if device is None else device)
                return self.to(device=remapper.device, non_blocking=non_blocking)
            if device is not None:
                new = remapper.target(device)
                if new is not None:
                    remapper.say(".cuda", "storage.cuda({})", device)
                    device = new.index
            return _original(self, device, non_blocking)

        owner.set_attr(cls, "cuda", wrap_like(original, cuda), label)
