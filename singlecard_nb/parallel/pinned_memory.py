"""Pinned memory and asynchronous copies under `%singlecard cpu`: the GPU is the CPU.

Data loading written for a GPU pins its batches and copies them without blocking: nanoGPT's
`x.pin_memory().to(device, non_blocking=True)`, `DataLoader(pin_memory=True)`, a side
`torch.cuda.Stream` with `x.record_stream(s)`. On a CPU-only machine torch refuses the first
("Cannot access accelerator device when none is available"). Where the device is the host,
every host tensor already sits in the device's memory, as a pinned tensor does: `pin_memory()`
returns the tensor itself (what torch returns for a tensor that is pinned already), so
`is_pinned()` says True for CPU tensors (torch's own code gets torch's answer); `DataLoader(pin_memory=True)` loads into ordinary
memory (what torch does anyway, with a warning on every epoch); a factory function asked for
pinned memory (`torch.zeros(2, pin_memory=True)`, `torch.empty(...)`, `x.new_empty(...)`) makes
the tensor in ordinary memory (remap/factories.py asks `unpinned`); `record_stream` on
the CPU's one stream has nothing to record. `non_blocking=True` copies between CPU tensors already work.
Said once, counted in `%singlecard status`. Torch's own callers (FSDP's CPU offload pins its
shards) get the same answers.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch
from torch.utils.data import DataLoader

from ..borrow import Borrowed, wrap_like
from ..notices import Notices

_NOTE = ("singlecard_nb: {} under `%singlecard cpu`: the device is the host, so host memory is "
         "already the device's; the tensor is used as it is (pinning copies nothing here).")


def install(owner: Borrowed, notices: Notices) -> None:
    """Patch pin_memory, is_pinned, record_stream and DataLoader(pin_memory=), owned by `owner`."""
    tensor = torch.Tensor
    original_pin, original_pinned = tensor.pin_memory, tensor.is_pinned
    original_record = tensor.record_stream

    def pin_memory(self, device: Any = None) -> torch.Tensor:
        if self.device.type != "cpu":
            return original_pin(self, device) if device is not None else original_pin(self)
        notices.say("pin_memory", _NOTE.format("tensor.pin_memory()"))
        return self

    def is_pinned(self, device: Any = None) -> bool:
        # torch's own callers get torch's answer: sharded tensors copy it into
        # `torch.empty(pin_memory=...)`, which the CPU refuses.
        if self.device.type == "cpu" and not _from_torch(sys._getframe(1)):
            return True
        return original_pinned(self, device) if device is not None else original_pinned(self)

    def record_stream(self, stream: Any) -> None:
        if isinstance(stream, torch.Stream) or self.device.type != "cpu":
            return original_record(self, stream)
        return None  # the CPU's one stream (torch.cuda.Stream under cpu): nothing to record

    owner.set_attr(tensor, "pin_memory", wrap_like(original_pin, pin_memory), "Tensor.pin_memory")
    owner.set_attr(tensor, "is_pinned", wrap_like(original_pinned, is_pinned), "Tensor.pin_memory")
    owner.set_attr(tensor, "record_stream", wrap_like(original_record, record_stream),
                   "Tensor.record_stream")

    original_init = DataLoader.__init__
    signature = inspect.signature(original_init)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        call = signature.bind(self, *args, **kwargs)
        if call.arguments.get("pin_memory"):
            notices.say("pin_memory", _NOTE.format("DataLoader(pin_memory=True)"))
            call.arguments["pin_memory"] = False  # torch turns it off too, warning every epoch
        original_init(*call.args, **call.kwargs)

    owner.set_attr(DataLoader, "__init__", wrap_like(original_init, __init__),
                   "DataLoader(pin_memory=True)")


def unpinned(kwargs: dict[str, Any], call: str, notices: Notices) -> None:
    """A factory call's `pin_memory=True` for a tensor on the host (`%singlecard cpu`) turned
    off in `kwargs`, as `.pin_memory()` is answered; said once, at the caller of the factory."""
    device = kwargs.get("device")
    if device is None or torch.device(device).type == "cpu":
        notices.say("pin_memory", _NOTE.format(f"{call}(..., pin_memory=True)"), stacklevel=3)
        kwargs["pin_memory"] = False


def _from_torch(frame: Any) -> bool:
    return frame is not None and frame.f_globals.get("__name__", "").startswith("torch.")
