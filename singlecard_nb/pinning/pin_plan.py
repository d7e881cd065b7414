"""`plan_pin`: the whole decision of a pin, made before anything changes.

A plan says which device, hard or soft, which variables to set, which torch device to select,
and why, in words. Making one changes nothing (it reads torch only once the CUDA driver has
started, for the ordinal of a soft pin's card), so every refusal (`TargetError`) leaves the
process as it was; `pinning.apply(plan)` then carries it out.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import torch_side
from .driver import DriverState
from .model import GpuInfo, Machine, MigInfo
from .pin_targets import TargetError, busy_text, normalise, resolve
from .state import PinnedDevice, PinState, env_values, environ_before

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, eq=False)
class PinPlan(PinnedDevice):
    """What `apply` will do, decided: nothing in it has been done yet."""

    target: str  # the target as normalised
    gpu: GpuInfo | None  # None: the CPU
    mig: MigInfo | None
    hard: bool  # the other GPUs will really be hidden from this process
    torch_device: torch.device
    reason: str
    environ: MutableMapping[str, str]  # the mapping the pin changes
    env_changes: tuple[tuple[str, str], ...] = ()  # set in this order
    keep_env: bool = False  # a hard pin CUDA started under: its variables stay, owned as they are
    select: int | None = None  # a soft pin: the torch ordinal to make the current device
    set_default: bool = False  # also make `torch_device` torch's default device
    env_before: dict[str, str | None] = field(default_factory=dict)  # before any pin of ours
    driver: DriverState | None = None
    replaces: PinState | None = None  # the pin in force on `environ` when this was planned



def plan_pin(
    target: Any,
    machine: Machine,
    environ: MutableMapping[str, str],
    driver: DriverState,
    *,
    current: PinState | None = None,
    set_default: bool = False,
    force: bool = False,
    torch_ordinal: Callable[[str], int | None] | None = None,
) -> PinPlan:
    """Decide a pin of `target` on `machine`; raises `TargetError` (bad target, outside the
    allocation without `force`, too late for the device asked).

    environ: the environment the pin will change; driver: whether CUDA has started.
    current: the pin in force on `environ` (a re-pin resolves against the environment from
        before it, and keeps a hard pin that CUDA started under).
    torch_ordinal: the torch ordinal of a UUID, asked only for a soft pin (default: torch's).
    """
    import torch

    text = normalise(target)  # pin() hands its PinTarget on: this takes it as it is
    base_env = environ_before(environ, current)
    machine = machine.with_ordinals(base_env)
    choice = resolve(text, machine, force)
    # Hard-pinned and CUDA has started since: the process's device set is fixed for good, so the
    # variables that made it stay (they keep describing this process and its children).
    keep_env = driver.started and current is not None and current.hard
    env_before = dict(current.env_before) if current is not None else env_values(environ)
    common = dict(target=str(text), gpu=choice.gpu, mig=choice.mig, environ=environ,
                  keep_env=keep_env, set_default=set_default, env_before=env_before,
                  driver=driver, replaces=current)

    if choice.gpu is None:
        if keep_env:
            hard = current.mode == "cpu"  # CUDA started with no GPU visible
        else:
            hard = not driver.started
        changes = (("CUDA_VISIBLE_DEVICES", ""),) if hard and not keep_env else ()
        if hard:
            reason = "CUDA_VISIBLE_DEVICES is empty, so torch in this process sees no GPU."
        else:
            reason = (f"{_too_late(driver.how)} The GPUs stay visible to this process; "
                      "device() returns cpu. " + _restart_hint(text))
        return PinPlan(hard=hard, torch_device=torch.device("cpu"), reason=reason,
                       env_changes=changes, **common)

    note = f"{choice.note} " if choice.note else ""
    if driver.started and keep_env and choice.uuid != current.uuid:
        raise TargetError(
            f"this kernel is hard-pinned to {current.describe_device()} and CUDA has "
            f"started, so no other device exists in this process; restart the kernel to "
            f"pin {text!r}")
    if driver.started and not keep_env:
        lookup = torch_side.torch_ordinal_for_uuid if torch_ordinal is None else torch_ordinal
        ordinal = lookup(choice.uuid)
        if ordinal is None:
            raise TargetError(
                f"{text!r} ({choice.uuid}) is not visible to torch in this process. "
                f"{_too_late(driver.how)} It started with CUDA_VISIBLE_DEVICES="
                f"{base_env.get('CUDA_VISIBLE_DEVICES')!r}. " + _restart_hint(text))
        device = torch.device("cuda", ordinal)
        reason = (f"{note}SOFT pin. {_too_late(driver.how)} {choice.gpu.name} is now "
                  f"torch's current device ({device}), but the other GPUs stay visible to "
                  "this process and code that names another device (e.g. cuda:0) still "
                  "reaches them. " + _restart_hint(text))
        return PinPlan(hard=False, torch_device=device, reason=reason, select=ordinal, **common)

    changes = () if keep_env else (("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
                                   ("CUDA_VISIBLE_DEVICES", choice.uuid))
    reason = (f"{note}CUDA_VISIBLE_DEVICES={choice.uuid} (with "
              "CUDA_DEVICE_ORDER=PCI_BUS_ID) was set before CUDA started, so this "
              "process sees only this device, as cuda:0.")
    if not (choice.mig or choice.gpu).in_allocation:
        reason += (f" Forced outside this kernel's allocation ({machine.allocation_text()})"
                   "; it may be someone else's GPU.")
    if choice.gpu.other_processes():
        reason += f" Note: GPU {choice.gpu.index} is also {busy_text(choice.gpu)}."
    reason += torch_side.no_cuda_note()
    return PinPlan(hard=True, torch_device=torch.device("cuda", 0), reason=reason,
                   env_changes=changes, **common)


def _too_late(how: str) -> str:
    return (f"The CUDA driver had already started in this process ({how}), so "
            "CUDA_VISIBLE_DEVICES can no longer take effect.")


def _restart_hint(target: str) -> str:
    return (f"For a hard pin, restart the kernel and run `%singlecard {target}` before any CUDA "
            f"code, or start the kernel with SINGLECARD_NB_DEVICE={target}.")
