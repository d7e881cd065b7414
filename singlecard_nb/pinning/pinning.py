"""Pin this process to one GPU: `pin()`, `release()`, `current()`, `device()`.

A *hard* pin sets CUDA_DEVICE_ORDER=PCI_BUS_ID and CUDA_VISIBLE_DEVICES=<UUID> before the CUDA
driver starts, so the process sees exactly one GPU, `cuda:0`. Once the driver has started that
variable is ignored ("too late"); then the pin is *soft*: the matching torch device becomes the
current one, and the other GPUs stay visible. `pin()` is `apply(plan_pin(...))`: the decision
(pin_plan.py) is made before anything changes, then applied through `borrow.Borrowed` owners, so
`release()` (and `%unload_ext`) put back exactly what was there.

This module owns the pin and nothing else: single-card mode and the status display are tied to
it by `singlecard_nb.session`, which is what `singlecard_nb.pin()` and `%singlecard` call.
"""

from __future__ import annotations

import functools
import os
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import borrow
from . import devices, torch_side
from . import driver as driver_probe
from .driver import DriverState
from .model import Machine
from .pin_plan import PinPlan, plan_pin
from .pin_targets import Choice, TargetError, auto, normalise
from .state import ENV_VARS, PinState, env_values, environ_before

if TYPE_CHECKING:
    import torch

__all__ = ["ENV_VARS", "Choice", "PinPlan", "PinState", "TargetError", "apply", "auto_choice",
           "current", "device", "machine_view", "pin", "pinned_environ", "plan_pin", "release"]


@dataclass
class _Pin:
    """The pin in force: its state, the owners holding its changes, the mapping it changed."""

    state: PinState | None = None
    env_owner: borrow.Borrowed | None = None  # CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER
    torch_owner: borrow.Borrowed | None = None  # default device, current device
    environ: MutableMapping[str, str] | None = None

    def on(self, environ: MutableMapping[str, str]) -> PinState | None:
        """The pin in force on `environ` (None: none, or one that changed another mapping)."""
        return self.state if environ is self.environ else None

    def clear(self) -> None:
        self.state = self.env_owner = self.torch_owner = self.environ = None


_pin = _Pin()


def pin(
    target: str | int,
    *,
    set_default: bool = False,
    force: bool = False,
    environ: MutableMapping[str, str] | None = None,
    machine: Machine | None = None,
    driver: DriverState | None = None,
) -> PinState:
    """Pin this process to one device; raises `TargetError` on bad input, changing nothing.

    target: nvidia-smi index, GPU/MIG UUID or unique prefix, "auto" or "cpu".
    set_default: also make the device torch's default device (restored on release).
    force: allow a GPU outside the kernel's allocation (the CUDA_VISIBLE_DEVICES it had
        before our pin, e.g. set by a scheduler); without it such a target is refused.
    environ, machine, driver: injectable for tests (default: os.environ, NVML, the probe).
    """
    environ = os.environ if environ is None else environ
    text = normalise(target)  # a bad target is refused before the machine is read
    current_pin = _pin.on(environ)
    if machine is None:
        try:
            machine = devices.read_machine(environ_before(environ, current_pin))
        except devices.MachineFileError as e:
            if not text.is_cpu:
                raise
            # the CPU pin names no GPU: a broken description of them must not stop it
            machine = Machine(gpus=(), reason=str(e), driver_version=None, source="unreadable")
    driver = driver_probe.driver_state() if driver is None else driver
    return apply(plan_pin(text, machine, environ, driver, current=current_pin,
                          set_default=set_default, force=force))


def apply(plan: PinPlan) -> PinState:
    """Carry out `plan`: give back the pin it replaces, then make its changes, each owned.

    Raises RuntimeError, changing nothing, when the pin in force is not the one `plan` was
    made against (plan again).
    """
    if plan.replaces is not _pin.on(plan.environ):
        raise RuntimeError("singlecard_nb: this pin plan was made against another pin than the "
                           "one in force; make the plan again")
    kept_env_owner = None
    if plan.keep_env:  # release() below must not give back the hard pin we keep
        kept_env_owner, _pin.env_owner = _pin.env_owner, None
    release()

    env_owner = kept_env_owner or borrow.Borrowed("singlecard pin: environment")
    torch_owner = borrow.Borrowed("singlecard pin: torch")
    torch_owner.on_restore(functools.partial(_forget, torch_owner), "pin state")
    committed = False
    try:
        for name, value in plan.env_changes:
            env_owner.set_env(name, value, plan.environ)
        if plan.select is not None:
            torch_side.select_current_device(plan.select, torch_owner)
        if plan.set_default:
            torch_side.set_default_device(plan.torch_device, torch_owner)
        state = PinState(
            target=plan.target, gpu=plan.gpu, mig=plan.mig, torch_device=plan.torch_device,
            reason=plan.reason, hard=plan.hard, env_before=plan.env_before,
            env_after=env_values(plan.environ), default_device=plan.set_default,
            driver=plan.driver,
        )
        _pin.state, _pin.env_owner, _pin.torch_owner = state, env_owner, torch_owner
        _pin.environ = plan.environ
        committed = True
    finally:
        if not committed:
            # Half a pin is worse than none: give back whatever this attempt changed.
            release()
            torch_owner.restore()
            env_owner.restore()
    return state


def _forget(owner: borrow.Borrowed) -> None:
    """Forget the pin when its owner is given back by `borrow.restore_all()` (unload)."""
    if _pin.torch_owner is owner:
        _pin.clear()


def release() -> None:
    """Undo the pin: torch defaults and environment variables restored."""
    env_owner, torch_owner = _pin.env_owner, _pin.torch_owner
    _pin.clear()
    try:
        if torch_owner is not None:
            torch_owner.restore()
    finally:
        if env_owner is not None:
            env_owner.restore()


def current() -> PinState | None:
    """The active pin, or None."""
    return _pin.state


def device() -> torch.device:
    """The pinned device; unpinned: `cuda` where torch has CUDA and a GPU is visible, else cpu."""
    import torch

    if _pin.state is not None:
        return _pin.state.torch_device
    visible = any(g.cuda_ordinal is not None for g in devices.read_machine().gpus)
    return torch.device("cuda" if visible and torch.backends.cuda.is_built() else "cpu")


def pinned_environ() -> MutableMapping[str, str]:
    """The environment the pin changed (os.environ when nothing is pinned)."""
    return _pin.environ if _pin.environ is not None else os.environ


def auto_choice(machine: Machine | None = None, *, force: bool = False) -> Choice:
    """The device `pin("auto")` would choose now, and why (the picker shows it before pinning).

    Raises TargetError when no GPU can be chosen (none, none allowed, none readable).
    """
    base_env = environ_before(pinned_environ(), _pin.state)
    machine = devices.read_machine(base_env) if machine is None else machine.with_ordinals(base_env)
    if not machine.gpus:
        raise TargetError(f"'auto' asks for a GPU, but this machine has none ({machine.reason})")
    return auto(machine, force)


def machine_view(machine: Machine | None = None,
                 environ: MutableMapping[str, str] | None = None) -> Machine:
    """The machine as this kernel sees it: CUDA ordinals under the current environment, and
    the allocation (`in_allocation`) under the environment from before our pin.

    machine: annotate this one instead of reading NVML (or SINGLECARD_NB_MACHINE).
    """
    environ = pinned_environ() if environ is None else environ
    base = environ_before(environ, _pin.on(environ))
    if machine is not None:
        return machine.with_ordinals(environ, allocation_environ=base)
    return devices.read_machine(environ, allocation_environ=base)
