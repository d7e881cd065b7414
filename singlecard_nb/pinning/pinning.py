"""Pin this process to one GPU: `pin()`, `release()`, `current()`, `device()`.

A *hard* pin sets CUDA_DEVICE_ORDER=PCI_BUS_ID and CUDA_VISIBLE_DEVICES=<UUID> before the CUDA
driver starts, so the process sees exactly one GPU, `cuda:0`. Once the driver has started that
variable is ignored ("too late"); then the pin is *soft*: the matching torch device becomes the
current one, and the other GPUs stay visible. Every change goes through `borrow.Borrowed` owners
so `release()` (and `%unload_ext`) put back exactly what was there.

This module owns the pin and nothing else: single-card mode and the status display are tied to
it by `singlecard_nb.session`, which is what `singlecard_nb.pin()` and `%singlecard` call.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import borrow
from . import devices
from . import driver as driver_probe
from .devices import GpuInfo, Machine, MigInfo
from .driver import DriverState

if TYPE_CHECKING:
    import torch

ENV_VARS = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


class TargetError(ValueError):
    """A pin target that names no device (or more than one); nothing was changed."""


@dataclass
class PinState:
    mode: str  # "hard" | "soft" | "cpu"
    target: str  # what the user asked for
    gpu: GpuInfo | None
    mig: MigInfo | None
    torch_device: torch.device  # cuda:0 (hard), cuda:N (soft), cpu
    reason: str  # human explanation (why auto chose it, why soft, ...)
    hard: bool = False  # True only when the other GPUs really are hidden from this process
    env_before: dict[str, str | None] = field(default_factory=dict)
    env_after: dict[str, str | None] = field(default_factory=dict)
    default_device: bool = False
    single_card: bool = True  # whether single-card mode was asked for (set by session.pin)
    driver: DriverState | None = None

    @property
    def uuid(self) -> str | None:
        """The UUID given to CUDA_VISIBLE_DEVICES (the MIG device's for a MIG pin)."""
        if self.mig is not None:
            return self.mig.uuid
        return None if self.gpu is None else self.gpu.uuid

    def describe_device(self) -> str:
        if self.gpu is None:
            return "CPU"
        text = f"GPU {self.gpu.index} ({self.gpu.name}, {self.gpu.uuid})"
        if self.mig is not None:
            text += f", MIG device {self.mig.index} ({self.mig.name}, {self.mig.uuid})"
        return text

    def summary(self) -> str:
        """One paragraph for the user: what was pinned, how, and what to use."""
        head = {"hard": "Pinned (hard)", "soft": "Pinned (SOFT)", "cpu": "Pinned to CPU"}[self.mode]
        return f"{head}: {self.describe_device()} -> use {self.torch_device}. {self.reason}"


@dataclass(frozen=True)
class Choice:
    """A resolved target: the GPU (None for cpu), the MIG device if any, and why."""

    gpu: GpuInfo | None  # None: cpu
    mig: MigInfo | None
    note: str  # why this device (auto), or remarks about it

    @property
    def uuid(self) -> str | None:
        if self.mig is not None:
            return self.mig.uuid
        return None if self.gpu is None else self.gpu.uuid


# --- module state -------------------------------------------------------------------------
_state: PinState | None = None
_env_owner: borrow.Borrowed | None = None  # CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER
_torch_owner: borrow.Borrowed | None = None  # default device, current device
_environ: MutableMapping[str, str] | None = None  # the mapping the pin changed


# --- parsing and resolving targets ------------------------------------------------------------

def _accepted(machine: Machine) -> str:
    if not machine.gpus:
        return "'cpu' (this machine has no GPU)"
    indices = ", ".join(str(g.index) for g in machine.gpus)
    return (f"a GPU index as nvidia-smi numbers them ({indices}), a GPU or MIG UUID or a unique "
            "prefix of one (e.g. 'GPU-2f6d' or '2f6d'), 'auto' (the idle GPU with the most free "
            "memory) or 'cpu' (hide all GPUs)")


def _normalise(target: Any) -> str:
    # bool is an int subclass; `pin(True)` is a mistake, not GPU 1.
    if isinstance(target, bool) or not isinstance(target, (int, str)):
        raise TargetError(f"{target!r} is not a pin target: give one device as an int or a string")
    if isinstance(target, int):
        if target < 0:
            raise TargetError(f"{target!r} is not a GPU index: indices start at 0")
        return str(target)
    text = target.strip()
    if not text:
        raise TargetError("an empty string is not a pin target")
    if re.search(r"[\s,;]", text):
        raise TargetError(f"{text!r} names more than one device; pin exactly one")
    return text


def _usable(device: GpuInfo | MigInfo, force: bool) -> bool:
    """Pinnable now: its UUID was read, and it is in the allocation (or the pin is forced)."""
    return device.unusable is None and (force or device.in_allocation)


def _with_mig(gpu: GpuInfo, how: str, force: bool = False) -> Choice:
    """A GPU in MIG mode cannot run CUDA work itself: use its MIG device with the most room."""
    if not gpu.mig:
        return Choice(gpu, None, how)
    candidates = [m for m in gpu.mig if _usable(m, force)]
    if not candidates:  # none allowed: take a readable one, and let the allocation check refuse
        candidates = [m for m in gpu.mig if m.unusable is None]
    if not candidates:
        reasons = "; ".join(f"MIG {gpu.index}/{m.index}: {m.unusable}" for m in gpu.mig)
        raise TargetError(f"GPU {gpu.index} is in MIG mode, where CUDA can only use its MIG "
                          f"devices, and none of them can be pinned ({reasons})")
    mig = max(candidates, key=lambda m: (_known(m.memory_free), -m.index))
    note = (f"GPU {gpu.index} is in MIG mode, where CUDA can only use its MIG devices, so the "
            f"pin uses MIG device {mig.index} ({mig.name}, {mig.uuid}, the most free memory); "
            "pin a MIG UUID to choose another.")
    return Choice(gpu, mig, f"{how} {note}".strip())


def _known(n: int | None) -> int:
    return -1 if n is None else n  # unknown memory ranks below any known amount


def _busy_text(gpu: GpuInfo) -> str:
    procs = ", ".join(
        " ".join(str(x) for x in (f"pid {p.pid}", p.user, p.name) if x) for p in gpu.other_processes()
    )
    return f"busy with {procs}"


def _no_gpu_for_auto(machine: Machine) -> TargetError:
    if machine.allocation is not None and not any(g.in_allocation for g in machine.gpus):
        return TargetError(
            f"'auto' found no GPU in this kernel's allocation: {machine.allocation_text()}, so "
            "this kernel was given no GPU. Pin 'cpu', or pin a GPU deliberately with --force "
            "(`%singlecard 0 --force`, `singlecard_nb.pin(0, force=True)`, or at kernel start "
            "SINGLECARD_NB_DEVICE='0 --force').")
    problems = "; ".join(f"GPU {g.index}: {g.unusable}" for g in machine.gpus if g.unusable)
    return TargetError(f"'auto' found no GPU that can be pinned ({problems or machine.reason}); "
                       "pin 'cpu'")


def _auto(machine: Machine, force: bool = False) -> Choice:
    candidates, skipped = [], []
    for gpu in machine.gpus:
        if gpu.unusable is not None:
            skipped.append(f"GPU {gpu.index}: cannot be pinned ({gpu.unusable})")
        elif not _usable(gpu, force):
            skipped.append(f"GPU {gpu.index}: outside the allocation")
        elif gpu.mig and not any(_usable(m, force) for m in gpu.mig):
            skipped.append(f"GPU {gpu.index}: no MIG device of it can be pinned")
        else:
            candidates.append(gpu)
    if not candidates:
        raise _no_gpu_for_auto(machine)
    idle, idle_mig, unknown, busy = [], [], [], []
    for gpu in candidates:
        if not gpu.processes_known:
            unknown.append(gpu)
            skipped.append(f"GPU {gpu.index}: its processes cannot be read "
                           f"({gpu.why_unknown('processes')})")
        elif gpu.other_processes():
            busy.append(gpu)
            skipped.append(f"GPU {gpu.index}: {_busy_text(gpu)}")
        elif gpu.mig_enabled:
            idle_mig.append(gpu)
            skipped.append(f"GPU {gpu.index}: in MIG mode")
        else:
            idle.append(gpu)

    def free(g: GpuInfo) -> tuple[int, int]:
        return (_known(g.memory_free), -g.index)

    if idle:
        gpu = max(idle, key=free)
        why = f"the most free memory ({devices.gib(gpu.memory_free)} GiB) among idle GPUs"
    elif idle_mig:
        gpu = max(idle_mig, key=lambda g: max(_known(m.memory_free) for m in g.mig
                                              if _usable(m, force)))
        why = "no whole GPU is idle; its MIG devices are"
    elif unknown:
        gpu = max(unknown, key=free)
        why = ("no GPU is known to be idle; NVML cannot say who uses this one, and it has the "
               f"most free memory ({devices.gib(gpu.memory_free)} GiB) of those")
    else:
        gpu = max(busy, key=free)
        why = ("every GPU is busy with other processes; this one has the most free memory "
               f"({devices.gib(gpu.memory_free)} GiB)")
    skipped = [s for s in skipped if not s.startswith(f"GPU {gpu.index}:")]
    skipped_text = f"; skipped {'; '.join(skipped)}" if skipped else ""
    within = (" within the allocation" if machine.allocation is not None and not force else "")
    return _with_mig(gpu, f"auto chose GPU {gpu.index} ({gpu.name}){within}: {why}"
                          f"{skipped_text}.", force)


def auto_choice(machine: Machine | None = None, *, force: bool = False) -> Choice:
    """The device `pin("auto")` would choose now, and why (the picker shows it before pinning).

    Raises TargetError when no GPU can be chosen (none, none allowed, none readable).
    """
    base_env = _base_environ(_environ if _environ is not None else os.environ)
    machine = devices.read_machine(base_env) if machine is None else machine.with_ordinals(base_env)
    if not machine.gpus:
        raise TargetError(f"'auto' asks for a GPU, but this machine has none ({machine.reason})")
    return _auto(machine, force)


def machine_view(machine: Machine | None = None,
                 environ: MutableMapping[str, str] | None = None) -> Machine:
    """The machine as this kernel sees it: CUDA ordinals under the current environment, and
    the allocation (`in_allocation`) under the environment from before our pin.

    machine: annotate this one instead of reading NVML (or SINGLECARD_NB_MACHINE).
    """
    environ = pinned_environ() if environ is None else environ
    base = _base_environ(environ)
    if machine is not None:
        return machine.with_ordinals(environ, allocation_environ=base)
    return devices.read_machine(environ, allocation_environ=base)


def _outside_allocation(choice: Choice, machine: Machine, text: str) -> TargetError:
    in_code = text if text.isdigit() else repr(text)
    # Name what the user named: the GPU, unless a MIG device of an allowed GPU was asked for.
    device = choice.gpu.label() if choice.mig is None or not choice.gpu.in_allocation else (
        f"MIG device {choice.gpu.index}/{choice.mig.index} ({choice.mig.name}, {choice.mig.uuid})")
    return TargetError(
        f"{device} is outside this kernel's allocation: {machine.allocation_text()} (its value "
        "before singlecard_nb pinned anything, as a scheduler such as Slurm or a device plugin "
        "set it). Nothing was changed. To use that GPU anyway, deliberately (it may be someone "
        f"else's): `%singlecard {text} --force`, singlecard_nb.pin({in_code}, force=True), or at "
        f"kernel start SINGLECARD_NB_DEVICE='{text} --force'.")


def _by_uuid(text: str, machine: Machine, accepted: str, force: bool) -> Choice:
    wanted = text.lower()
    matches: list[tuple[GpuInfo, MigInfo | None]] = []
    for gpu in machine.gpus:
        for mig in (None, *gpu.mig):
            uuid = (gpu.uuid if mig is None else mig.uuid).lower()
            bare = re.sub(r"^(gpu|mig)-", "", uuid)
            if uuid and (uuid.startswith(wanted) or bare.startswith(wanted)):
                matches.append((gpu, mig))
    if not matches:
        raise TargetError(f"no GPU or MIG device has a UUID starting with {text!r}; "
                          f"accepted: {accepted}")
    if len(matches) > 1:
        names = ", ".join(
            f"GPU {g.index} {g.uuid}" if m is None else f"MIG {g.index}/{m.index} {m.uuid}"
            for g, m in matches
        )
        raise TargetError(f"UUID prefix {text!r} is ambiguous: it matches {names}; "
                          "give more characters")
    gpu, mig = matches[0]
    return _with_mig(gpu, "", force) if mig is None else Choice(gpu, mig, "")


def _resolve(text: str, machine: Machine, force: bool = False) -> Choice:
    """The device `text` names, checked against the allocation and readability."""
    choice = _name_to_device(text, machine, force)
    if choice.gpu is None:
        return choice
    device = choice.mig or choice.gpu
    if device.unusable is not None:
        what = (f"GPU {choice.gpu.index}" if choice.mig is None
                else f"MIG device {choice.gpu.index}/{choice.mig.index}")
        raise TargetError(f"{what} cannot be pinned: {device.unusable}. Pin another device "
                          "(`%singlecard list` says which can be)")
    if not force and not device.in_allocation:
        raise _outside_allocation(choice, machine, text)
    return choice


def _name_to_device(text: str, machine: Machine, force: bool) -> Choice:
    accepted = _accepted(machine)
    word = text.lower()
    if word == "cpu":
        return Choice(None, None, "")
    if not machine.gpus:
        raise TargetError(f"{text!r} asks for a GPU, but this machine has none "
                          f"({machine.reason}); accepted here: 'cpu'")
    if word == "auto":
        return _auto(machine, force)
    if text.isdigit():
        gpu = machine.by_index(int(text))
        if gpu is None:
            raise TargetError(f"there is no GPU with index {text}; accepted: {accepted}")
        return _with_mig(gpu, "", force)
    if re.fullmatch(r"(?i)((gpu|mig)-)*[0-9a-f][0-9a-f/-]*|(gpu|mig)-", text):
        return _by_uuid(text, machine, accepted, force)
    raise TargetError(f"{text!r} is not a pin target; accepted: {accepted}")


# --- the torch side (only ever reached once the driver has started, or for cpu) ---------------

def _normal_uuid(uuid: str) -> str:
    return re.sub(r"^(gpu|mig)-", "", str(uuid).strip().lower())


def _torch_ordinal_for_uuid(uuid: str) -> int | None:
    """The torch ordinal of the device with this UUID. Only call after the driver started."""
    import torch

    if not torch.backends.cuda.is_built():
        raise TargetError(f"this torch ({torch.__version__}) is built without CUDA, so it cannot "
                          f"use {uuid}; install a CUDA build of torch")
    for ordinal in range(torch.cuda.device_count()):
        if _normal_uuid(str(torch.cuda.get_device_properties(ordinal).uuid)) == _normal_uuid(uuid):
            return ordinal
    return None


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def own(function: Any) -> Any:
    """`function` without singlecard_nb's own wrappers (single-card mode's patches keep
    `__wrapped__`): torch's function, never a patch that sends devices to the old pin."""
    def ours(f: Any) -> bool:
        code = getattr(f, "__code__", None)
        return code is not None and os.path.abspath(code.co_filename).startswith(_PACKAGE)

    return inspect.unwrap(function, stop=lambda f: not ours(f))


def _select_current_device(ordinal: int, owner: borrow.Borrowed) -> None:
    """Make `cuda:ordinal` torch's current device, restoring the previous one on release."""
    import torch

    set_device = own(torch.cuda.set_device)
    previous = own(torch.cuda.current_device)()
    set_device(ordinal)
    owner.on_restore(lambda: set_device(previous), "torch.cuda current device")


def _set_default_device(device: torch.device, owner: borrow.Borrowed) -> None:
    import torch

    # The public getter resolves an index-less device by allocating a tensor, which could start
    # CUDA, so read the global context torch.set_default_device itself keeps.
    context = getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)
    previous = None if context is None else context.device
    set_default = own(torch.set_default_device)
    set_default(device)
    owner.on_restore(lambda: set_default(previous), "torch default device")


def _no_cuda_torch_note() -> str:
    import torch

    if torch.backends.cuda.is_built():
        return ""
    return (f" Note: this torch ({torch.__version__}) is built without CUDA, so torch itself "
            "cannot use the GPU; install a CUDA build of torch.")


# --- pin / release --------------------------------------------------------------------------

def _env_values(environ: MutableMapping[str, str]) -> dict[str, str | None]:
    return {name: environ.get(name) for name in ENV_VARS}


def _base_environ(environ: MutableMapping[str, str]) -> dict[str, str]:
    """`environ` as it was before our current pin (what a re-pin resolves against)."""
    base = dict(environ)
    if _state is not None and environ is _environ:
        for name, value in _state.env_before.items():
            if value is None:
                base.pop(name, None)
            else:
                base[name] = value
    return base


def _too_late(how: str) -> str:
    return (f"The CUDA driver had already started in this process ({how}), so "
            "CUDA_VISIBLE_DEVICES can no longer take effect.")


def _restart_hint(target: str) -> str:
    return (f"For a hard pin, restart the kernel and run `%singlecard {target}` before any CUDA "
            f"code, or start the kernel with SINGLECARD_NB_DEVICE={target}.")


def _clear_state_of(owner: borrow.Borrowed) -> None:
    """Forget the pin when its owner is given back by `borrow.restore_all()` (unload)."""
    global _state, _env_owner, _torch_owner, _environ
    if _torch_owner is owner:
        _state = _env_owner = _torch_owner = _environ = None


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
    global _state, _env_owner, _torch_owner, _environ
    environ = os.environ if environ is None else environ
    text = _normalise(target)
    base_env = _base_environ(environ)
    machine = devices.read_machine(base_env) if machine is None else machine.with_ordinals(base_env)
    choice = _resolve(text, machine, force)
    driver = driver_probe.driver_state() if driver is None else driver

    # Decide everything that can fail before touching anything.
    previous = _state if environ is _environ else None
    # Hard-pinned and CUDA has started since: the process's device set is fixed for good, so the
    # variables that made it stay (they keep describing this process and its children).
    keep_env = driver.started and previous is not None and previous.hard
    soft_ordinal: int | None = None
    if driver.started and choice.gpu is not None:
        if keep_env and choice.uuid != previous.uuid:
            raise TargetError(
                f"this kernel is hard-pinned to {previous.describe_device()} and CUDA has "
                f"started, so no other device exists in this process; restart the kernel to "
                f"pin {text!r}")
        if not keep_env:
            soft_ordinal = _torch_ordinal_for_uuid(choice.uuid)
            if soft_ordinal is None:
                raise TargetError(
                    f"{text!r} ({choice.uuid}) is not visible to torch in this process. "
                    f"{_too_late(driver.how)} It started with CUDA_VISIBLE_DEVICES="
                    f"{base_env.get('CUDA_VISIBLE_DEVICES')!r}. " + _restart_hint(text))

    env_before = dict(previous.env_before) if previous is not None else _env_values(environ)
    kept_env_owner = _env_owner if keep_env else None
    if keep_env:
        _env_owner = None  # release() below must not give back the hard pin we keep
    release()

    import torch

    env_owner = kept_env_owner or borrow.Borrowed("singlecard pin: environment")
    torch_owner = borrow.Borrowed("singlecard pin: torch")
    torch_owner.on_restore(lambda: _clear_state_of(torch_owner), "pin state")
    note = f"{choice.note} " if choice.note else ""
    committed = False
    try:
        if choice.gpu is None:
            mode, device = "cpu", torch.device("cpu")
            if keep_env:
                hard = previous.mode == "cpu"  # CUDA started with no GPU visible
            else:
                hard = not driver.started
                if hard:
                    env_owner.set_env("CUDA_VISIBLE_DEVICES", "", environ)
            if hard:
                reason = "CUDA_VISIBLE_DEVICES is empty, so torch in this process sees no GPU."
            else:
                reason = (f"{_too_late(driver.how)} The GPUs stay visible to this process; "
                          "device() returns cpu. " + _restart_hint(text))
        elif soft_ordinal is not None:
            mode, hard = "soft", False
            device = torch.device("cuda", soft_ordinal)
            _select_current_device(soft_ordinal, torch_owner)
            reason = (f"{note}SOFT pin. {_too_late(driver.how)} {choice.gpu.name} is now "
                      f"torch's current device ({device}), but the other GPUs stay visible to "
                      "this process and code that names another device (e.g. cuda:0) still "
                      "reaches them. " + _restart_hint(text))
        else:
            mode, hard = "hard", True
            device = torch.device("cuda", 0)
            if not keep_env:
                env_owner.set_env("CUDA_DEVICE_ORDER", "PCI_BUS_ID", environ)
                env_owner.set_env("CUDA_VISIBLE_DEVICES", choice.uuid, environ)
            reason = (f"{note}CUDA_VISIBLE_DEVICES={choice.uuid} (with "
                      "CUDA_DEVICE_ORDER=PCI_BUS_ID) was set before CUDA started, so this "
                      "process sees only this device, as cuda:0.")
            if not (choice.mig or choice.gpu).in_allocation:
                reason += (f" Forced outside this kernel's allocation ({machine.allocation_text()})"
                           "; it may be someone else's GPU.")
            if choice.gpu.other_processes():
                reason += f" Note: GPU {choice.gpu.index} is also {_busy_text(choice.gpu)}."
            reason += _no_cuda_torch_note()
        if set_default:
            _set_default_device(device, torch_owner)
        state = PinState(
            mode=mode, target=text, gpu=choice.gpu, mig=choice.mig, torch_device=device,
            reason=reason, hard=hard, env_before=env_before, env_after=_env_values(environ),
            default_device=set_default, driver=driver,
        )
        _state, _env_owner, _torch_owner, _environ = state, env_owner, torch_owner, environ
        committed = True
    finally:
        if not committed:
            # Half a pin is worse than none: give back whatever this attempt changed.
            release()
            torch_owner.restore()
            env_owner.restore()
    return state


def release() -> None:
    """Undo the pin: torch defaults and environment variables restored."""
    global _state, _env_owner, _torch_owner, _environ
    env_owner, torch_owner = _env_owner, _torch_owner
    _state = _env_owner = _torch_owner = _environ = None
    try:
        if torch_owner is not None:
            torch_owner.restore()
    finally:
        if env_owner is not None:
            env_owner.restore()


def current() -> PinState | None:
    """The active pin, or None."""
    return _state


def device() -> torch.device:
    """The pinned device; unpinned: `cuda` where torch has CUDA and a GPU is visible, else cpu."""
    import torch

    if _state is not None:
        return _state.torch_device
    visible = any(g.cuda_ordinal is not None for g in devices.read_machine().gpus)
    return torch.device("cuda" if visible and torch.backends.cuda.is_built() else "cpu")


def pinned_environ() -> MutableMapping[str, str]:
    """The environment the pin changed (os.environ when nothing is pinned)."""
    return _environ if _environ is not None else os.environ
