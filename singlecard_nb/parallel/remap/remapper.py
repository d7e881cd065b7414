"""Where a device reference goes while single-card mode is on a device: the one decision every
patch of `remap/` asks (memoised per reference), and the notice that says it once per kind."""

from __future__ import annotations

from typing import Any

import torch

from ...notices import Notices
from ..cuda_on_cpu import under_cpu

DEVICE_TYPES = (str, int, torch.device)  # exact types: bool is no device, a dtype never is
NO_ARGUMENT = object()  # `.cuda()` called with no device


def compiling() -> bool:
    # Inside torch.compile the original runs untouched: the remapping would break the graph.
    return torch.compiler.is_compiling()


class Remapper:
    """Where a device reference goes while single-card mode is on `device`."""

    def __init__(self, device: torch.device, notices: Notices):
        self.device = device
        self.notices = notices
        self._memo: dict[tuple[type, Any], torch.device | None] = {}

    def target(self, requested: Any) -> torch.device | None:
        """The device to use instead of `requested`, or None to leave `requested` as it is."""
        key = (type(requested), requested)
        try:
            return self._memo[key]
        except KeyError:
            decided = self._memo[key] = self._decide(requested)
            return decided
        except TypeError:  # unhashable: not a device reference
            return None

    def _decide(self, requested: Any) -> torch.device | None:
        if type(requested) is int:
            index: int | None = requested  # an int device is a CUDA ordinal
        elif type(requested) in (str, torch.device):
            if isinstance(requested, str) and not requested.startswith("cuda"):
                return None
            try:
                requested = torch.device(requested)
            except RuntimeError:
                return None  # torch will say what is wrong with it
            if requested.type != "cuda":
                return None
            index = requested.index
        else:
            return None
        if under_cpu(self.device):
            return self.device  # pinned to the CPU: it is the one device there is
        if index is None or index == self.device.index:
            return None  # "cuda" is the current device, which single-card mode keeps pinned
        return self.device

    def say(self, kind: str, call: str, requested: Any, stacklevel: int = 3) -> None:
        """Count a remapping of `requested` in `call`; the first of its kind is warned about."""
        self.notices.say(
            kind,
            lambda: (f"singlecard_nb: {call.format(_argument(requested))} uses {self.device}, and "
                     f"so will every {_KINDS.get(kind, kind)} that names a CUDA device other "
                     "than the pinned one while single-card mode is on."),
            stacklevel=stacklevel,
        )


_KINDS = {".to": ".to()", ".cuda": ".cuda()", "device=": "device= of a factory function",
          "torch.load": "torch.load", "set_device": "torch.cuda.set_device()",
          "cuda.device": "torch.cuda.device()", "set_default_device": "torch.set_default_device()"}


def _argument(requested: Any) -> str:
    return "" if requested is NO_ARGUMENT else repr(requested)

