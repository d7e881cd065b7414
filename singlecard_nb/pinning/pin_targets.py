"""What a pin target names: an nvidia-smi index, a GPU or MIG UUID (or a unique prefix of
one), "auto" or "cpu", resolved on a machine and checked against its allocation.

Pure functions of the target and a `model.Machine`: nothing here changes anything. A target
that names no device (or more than one, or one that may not be pinned) raises `TargetError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .model import GpuInfo, Machine, MigInfo, visible_uuid
from .render import gib, mig_label, mig_number


class TargetError(ValueError):
    """A pin target that names no device (or more than one); nothing was changed."""


@dataclass(frozen=True)
class Choice:
    """A resolved target: the GPU (None for cpu), the MIG device if any, and why."""

    gpu: GpuInfo | None  # None: cpu
    mig: MigInfo | None
    note: str  # why this device (auto), or remarks about it

    @property
    def uuid(self) -> str | None:
        return visible_uuid(self.gpu, self.mig)


def _accepted(machine: Machine) -> str:
    if not machine.gpus:
        return "'cpu' (this machine has no GPU)"
    indices = ", ".join(str(g.index) for g in machine.gpus)
    return (f"a GPU index as nvidia-smi numbers them ({indices}), a GPU or MIG UUID or a unique "
            "prefix of one (e.g. 'GPU-2f6d' or '2f6d'), 'auto' (the idle GPU with the most free "
            "memory) or 'cpu' (hide all GPUs)")


class PinTarget(str):
    """A pin target checked and stripped: it names one device (an index, a UUID or a prefix of
    one, "auto" or "cpu"). `normalise` makes it once; who is handed one passes it on as it is."""

    @property
    def is_cpu(self) -> bool:
        return self.lower() == "cpu"


def normalise(target: Any) -> PinTarget:
    """`target` (an int or a string) as a PinTarget, or TargetError for what names no one
    device; a PinTarget is already normalised and comes back as it is."""
    if isinstance(target, PinTarget):
        return target
    # bool is an int subclass; `pin(True)` is a mistake, not GPU 1.
    if isinstance(target, bool) or not isinstance(target, (int, str)):
        raise TargetError(f"{target!r} is not a pin target: give one device as an int or a string")
    if isinstance(target, int):
        if target < 0:
            raise TargetError(f"{target!r} is not a GPU index: indices start at 0")
        return PinTarget(target)
    text = target.strip()
    if not text:
        raise TargetError("an empty string is not a pin target")
    if re.search(r"[\s,;]", text):
        raise TargetError(f"{text!r} names more than one device; pin exactly one")
    return PinTarget(text)


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
        reasons = "; ".join(f"{mig_label(gpu.index, m.index)}: {m.unusable}" for m in gpu.mig)
        raise TargetError(f"GPU {gpu.index} is in MIG mode, where CUDA can only use its MIG "
                          f"devices, and none of them can be pinned ({reasons})")
    mig = max(candidates, key=lambda m: (_known(m.memory_free), -m.index))
    note = (f"GPU {gpu.index} is in MIG mode, where CUDA can only use its MIG devices, so the "
            f"pin uses MIG device {mig_number(gpu.index, mig.index)} ({mig.name}, {mig.uuid}, the most free memory); "
            "pin a MIG UUID to choose another.")
    return Choice(gpu, mig, f"{how} {note}".strip())


def _known(n: int | None) -> int:
    return -1 if n is None else n  # unknown memory ranks below any known amount


def busy_text(gpu: GpuInfo) -> str:
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


def auto(machine: Machine, force: bool = False) -> Choice:
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
            skipped.append(f"GPU {gpu.index}: {busy_text(gpu)}")
        elif gpu.mig_enabled:
            idle_mig.append(gpu)
            skipped.append(f"GPU {gpu.index}: in MIG mode")
        else:
            idle.append(gpu)

    def free(g: GpuInfo) -> tuple[int, int]:
        return (_known(g.memory_free), -g.index)

    if idle:
        gpu = max(idle, key=free)
        why = f"the most free memory ({gib(gpu.memory_free)} GiB) among idle GPUs"
    elif idle_mig:
        gpu = max(idle_mig, key=lambda g: max(_known(m.memory_free) for m in g.mig
                                              if _usable(m, force)))
        why = "no whole GPU is idle; its MIG devices are"
    elif unknown:
        gpu = max(unknown, key=free)
        why = ("no GPU is known to be idle; NVML cannot say who uses this one, and it has the "
               f"most free memory ({gib(gpu.memory_free)} GiB) of those")
    else:
        gpu = max(busy, key=free)
        why = ("every GPU is busy with other processes; this one has the most free memory "
               f"({gib(gpu.memory_free)} GiB)")
    skipped = [s for s in skipped if not s.startswith(f"GPU {gpu.index}:")]
    skipped_text = f"; skipped {'; '.join(skipped)}" if skipped else ""
    within = (" within the allocation" if machine.allocation is not None and not force else "")
    return _with_mig(gpu, f"auto chose GPU {gpu.index} ({gpu.name}){within}: {why}"
                          f"{skipped_text}.", force)


def _outside_allocation(choice: Choice, machine: Machine, text: str) -> TargetError:
    in_code = text if text.isdigit() else repr(text)
    # Name what the user named: the GPU, unless a MIG device of an allowed GPU was asked for.
    device = choice.gpu.label() if choice.mig is None or not choice.gpu.in_allocation else (
        f"MIG device {mig_number(choice.gpu.index, choice.mig.index)} ({choice.mig.name}, "
        f"{choice.mig.uuid})")
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
            f"GPU {g.index} {g.uuid}" if m is None else f"{mig_label(g.index, m.index)} {m.uuid}"
            for g, m in matches
        )
        raise TargetError(f"UUID prefix {text!r} is ambiguous: it matches {names}; "
                          "give more characters")
    gpu, mig = matches[0]
    return _with_mig(gpu, "", force) if mig is None else Choice(gpu, mig, "")


def resolve(text: str, machine: Machine, force: bool = False) -> Choice:
    """The device `text` names, checked against the allocation and readability."""
    choice = _name_to_device(text, machine, force)
    if choice.gpu is None:
        return choice
    device = choice.mig or choice.gpu
    if device.unusable is not None:
        what = (f"GPU {choice.gpu.index}" if choice.mig is None
                else f"MIG device {mig_number(choice.gpu.index, choice.mig.index)}")
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
        return auto(machine, force)
    if text.isdigit():
        gpu = machine.by_index(int(text))
        if gpu is None:
            raise TargetError(f"there is no GPU with index {text}; accepted: {accepted}")
        return _with_mig(gpu, "", force)
    if re.fullmatch(r"(?i)((gpu|mig)-)*[0-9a-f][0-9a-f/-]*|(gpu|mig)-", text):
        return _by_uuid(text, machine, accepted, force)
    raise TargetError(f"{text!r} is not a pin target; accepted: {accepted}")
