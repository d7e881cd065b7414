"""`PinState`: what a pin is (device, hard or soft, why) and what it changed; and the
environment as it was before it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .driver import DriverState
from .model import GpuInfo, MigInfo, visible_uuid
from .render import mig_number

if TYPE_CHECKING:
    import torch

ENV_VARS = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


def mode_of(gpu: GpuInfo | None, hard: bool) -> str:
    """"hard" | "soft" | "cpu": the one word for a pin to `gpu` (None: the CPU)."""
    if gpu is None:
        return "cpu"
    return "hard" if hard else "soft"


class PinnedDevice:
    """What a pin and its plan both say of their device (they hold `gpu`, `mig` and `hard`)."""

    gpu: GpuInfo | None
    mig: MigInfo | None
    hard: bool

    @property
    def mode(self) -> str:
        """"hard" | "soft" | "cpu" (a cpu pin is `hard` when it hides every GPU)."""
        return mode_of(self.gpu, self.hard)

    @property
    def uuid(self) -> str | None:
        """The UUID given to CUDA_VISIBLE_DEVICES (the MIG device's for a MIG pin)."""
        return visible_uuid(self.gpu, self.mig)


@dataclass(frozen=True)
class PinState(PinnedDevice):
    target: str  # what the user asked for
    gpu: GpuInfo | None
    mig: MigInfo | None
    torch_device: torch.device  # cuda:0 (hard), cuda:N (soft), cpu
    reason: str  # human explanation (why auto chose it, why soft, ...)
    hard: bool = False  # True only when the other GPUs really are hidden from this process
    env_before: dict[str, str | None] = field(default_factory=dict)
    env_after: dict[str, str | None] = field(default_factory=dict)
    default_device: bool = False
    driver: DriverState | None = None

    def describe_device(self) -> str:
        if self.gpu is None:
            return "CPU"
        text = f"GPU {self.gpu.index} ({self.gpu.name}, {self.gpu.uuid})"
        if self.mig is not None:
            text += (f", MIG device {mig_number(self.gpu.index, self.mig.index)} "
                     f"({self.mig.name}, {self.mig.uuid})")
        return text

    def summary(self) -> str:
        """One paragraph for the user: what was pinned, how, and what to use."""
        head = {"hard": "Pinned (hard)", "soft": "Pinned (SOFT)", "cpu": "Pinned to CPU"}[self.mode]
        return f"{head}: {self.describe_device()} -> use {self.torch_device}. {self.reason}"


def env_values(environ: Mapping[str, str]) -> dict[str, str | None]:
    """The pin's variables in `environ` (None: unset)."""
    return {name: environ.get(name) for name in ENV_VARS}


def environ_before(environ: Mapping[str, str], state: PinState | None) -> dict[str, str]:
    """`environ` as it was before the pin `state` changed it (a copy; `state` None: as it is).

    What a re-pin resolves against, and what the kernel's allocation is read from.
    """
    before = dict(environ)
    if state is not None:
        for name, value in state.env_before.items():
            if value is None:
                before.pop(name, None)
            else:
                before[name] = value
    return before
