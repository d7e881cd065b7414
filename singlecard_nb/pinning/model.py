"""The machine model: a `Machine` of `GpuInfo`s, their `MigInfo`s and `ProcessInfo`s.

Plain frozen data, whatever it was read from (NVML: `nvml.py`; a described machine:
`machine_file.py`). A field that could not be read is `None` and its reason is in `unknown`;
a device whose UUID cannot be read cannot be pinned, and says why in `unusable`.
`Machine.with_ordinals` adds what depends on the environment: CUDA ordinals and the allocation.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from . import machine_file, render, visible

ALLOCATION_ENV = "CUDA_VISIBLE_DEVICES"

Unknown = machine_file.Unknown  # (field, why it could not be read)


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    user: str | None
    memory: int | None  # bytes on this GPU; None where NVML cannot say (e.g. in containers)
    name: str | None


@dataclass(frozen=True)
class MigInfo:
    index: int
    uuid: str  # "" when it cannot be read (then `unusable` says why)
    name: str
    memory_total: int | None
    memory_used: int | None
    unknown: Unknown = ()  # fields NVML could not read, and why
    unusable: str | None = None  # why it cannot be pinned (None: it can)
    in_allocation: bool = True  # allowed by the kernel's CUDA_VISIBLE_DEVICES (see Machine)

    @property
    def memory_free(self) -> int | None:
        if self.memory_total is None or self.memory_used is None:
            return None
        return max(self.memory_total - self.memory_used, 0)

    def why_unknown(self, name: str) -> str | None:
        """Why field `name` could not be read (None: it was read)."""
        return dict(self.unknown).get(name)


@dataclass(frozen=True)
class GpuInfo:
    index: int  # nvidia-smi numbering
    uuid: str  # "" when it cannot be read (then `unusable` says why)
    name: str
    pci_bus_id: str | None
    memory_total: int | None  # None: unknown (the reason is in `unknown`)
    memory_used: int | None
    memory_free: int | None
    utilization: int | None  # percent
    processes: tuple[ProcessInfo, ...]  # empty also when unknown: see `processes_known`
    mig: tuple[MigInfo, ...]
    cuda_ordinal: int | None  # under CUDA_DEVICE_ORDER=PCI_BUS_ID and the current CUDA_VISIBLE_DEVICES
    unknown: Unknown = ()  # fields NVML could not read, and why
    unusable: str | None = None  # why it cannot be pinned (None: it can)
    in_allocation: bool = True  # allowed by the kernel's CUDA_VISIBLE_DEVICES (see Machine)

    def other_processes(self, own_pid: int | None = None) -> tuple[ProcessInfo, ...]:
        """Processes on this GPU that are not this kernel (`own_pid`, default: this process)."""
        own_pid = os.getpid() if own_pid is None else own_pid
        return tuple(p for p in self.processes if p.pid != own_pid)

    @property
    def mig_enabled(self) -> bool:
        return bool(self.mig)

    @property
    def processes_known(self) -> bool:
        return self.why_unknown("processes") is None

    def why_unknown(self, name: str) -> str | None:
        """Why field `name` could not be read (None: it was read)."""
        return dict(self.unknown).get(name)

    def label(self) -> str:
        """`GPU 2 (NVIDIA A100, GPU-8a1b...)`: how messages name this GPU."""
        return f"GPU {self.index} ({self.name}, {self.uuid or 'UUID unknown'})"


def visible_uuid(gpu: GpuInfo | None, mig: MigInfo | None) -> str | None:
    """The UUID CUDA_VISIBLE_DEVICES is given for a pin to `gpu` (its MIG device `mig`'s when
    there is one); None for the CPU."""
    if mig is not None:
        return mig.uuid
    return None if gpu is None else gpu.uuid


@dataclass(frozen=True, repr=False)
class Machine:
    gpus: tuple[GpuInfo, ...]
    reason: str | None  # why there are no GPUs (None when there are some)
    driver_version: str | None
    source: str  # "nvml" | "described: <path>" | "described"
    # The kernel's allocation: the CUDA_VISIBLE_DEVICES that `in_allocation` was computed from
    # (None: unset, every GPU allowed). The pin passes the value from before its own change.
    allocation: str | None = None

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        source: str = "described",
        environ: Mapping[str, str] | None = None,
    ) -> Machine:
        """Build a described machine from the JSON format in docs/internals.md.

        Raises ValueError naming the entry and field that is wrong (e.g. `gpus[1].memory_total`).
        """
        return cls.from_checked(machine_file.check(data), source, environ)

    @classmethod
    def from_checked(cls, checked: Mapping[str, Any], source: str = "described",
                     environ: Mapping[str, str] | None = None) -> Machine:
        """Build a machine from fields `machine_file.check` (or `machine_file.read`) returned."""
        gpus = tuple(
            GpuInfo(**{**g, "processes": tuple(ProcessInfo(**p) for p in g["processes"]),
                       "mig": tuple(MigInfo(**m) for m in g["mig"]), "cuda_ordinal": None})
            for g in checked["gpus"]
        )
        return cls(gpus, checked["reason"], checked["driver_version"], source).with_ordinals(environ)

    def to_dict(self) -> dict[str, Any]:
        """The described-machine JSON form (round-trips through `from_dict`)."""
        gpus = []
        for gpu in self.gpus:
            entry = {k: getattr(gpu, k) for k in (
                "index", "uuid", "name", "pci_bus_id", "memory_total", "memory_used",
                "memory_free", "utilization")}
            entry = {k: v for k, v in entry.items() if v is not None or k == "pci_bus_id"}
            entry["processes"] = [_fields_dict(p) for p in gpu.processes]
            entry["mig"] = [_mig_dict(m) for m in gpu.mig]
            _add_problems(entry, gpu)
            gpus.append(entry)
        out: dict[str, Any] = {"gpus": gpus}
        if self.driver_version is not None:
            out["driver_version"] = self.driver_version
        if self.reason is not None:
            out["reason"] = self.reason
        return out

    def with_ordinals(
        self,
        environ: Mapping[str, str] | None = None,
        allocation_environ: Mapping[str, str] | None = None,
    ) -> Machine:
        """This machine with `cuda_ordinal` for `environ`'s CUDA_VISIBLE_DEVICES, and
        `in_allocation` for `allocation_environ`'s (default: the same `environ`)."""
        environ = os.environ if environ is None else environ
        allocation_environ = environ if allocation_environ is None else allocation_environ
        ordinals = visible.ordinals(self.gpus, environ.get(ALLOCATION_ENV))
        allocation = allocation_environ.get(ALLOCATION_ENV)
        allowed = visible.visible(self.gpus, allocation)

        def allows(device: GpuInfo | MigInfo, parent: GpuInfo | None = None) -> bool:
            if allowed is None:
                return True
            return any(d is device or d is parent for d in allowed) or (
                isinstance(device, GpuInfo) and any(d is m for d in allowed for m in device.mig))

        gpus = tuple(
            replace(g, cuda_ordinal=ordinal, in_allocation=allows(g),
                    mig=tuple(replace(m, in_allocation=allows(m, g)) for m in g.mig))
            for g, ordinal in zip(self.gpus, ordinals)
        )
        return replace(self, gpus=gpus, allocation=allocation)

    def by_index(self, index: int) -> GpuInfo | None:
        return next((g for g in self.gpus if g.index == index), None)

    def allocation_text(self) -> str:
        """What the kernel's CUDA_VISIBLE_DEVICES allows, in words (for messages and tables)."""
        if self.allocation is None:
            return f"{ALLOCATION_ENV} is unset: every GPU is allowed"
        allowed = _allowed_names(self.gpus)
        return f"{ALLOCATION_ENV}={self.allocation!r} allows {', '.join(allowed) or 'no GPU'}"

    def __repr__(self) -> str:
        return render.machine_text(self)

    def _repr_html_(self) -> str:
        return render.machine_html(self)


def _allowed_names(gpus: tuple[GpuInfo, ...]) -> list[str]:
    names = []
    for gpu in gpus:
        migs = [m for m in gpu.mig if m.in_allocation]
        if gpu.in_allocation and (not gpu.mig or len(migs) == len(gpu.mig)):
            names.append(f"GPU {gpu.index}")
        else:
            names += [render.mig_label(gpu.index, m.index) for m in migs]
    return names


def _fields_dict(obj: Any) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in obj.__dataclass_fields__}


def _add_problems(entry: dict[str, Any], device: GpuInfo | MigInfo) -> None:
    if device.unknown:
        entry["unknown"] = dict(device.unknown)
    if device.unusable is not None:
        entry["unusable"] = device.unusable


def _mig_dict(mig: MigInfo) -> dict[str, Any]:
    entry = {k: getattr(mig, k) for k in ("index", "uuid", "name", "memory_total", "memory_used")}
    entry = {k: v for k, v in entry.items() if v is not None}
    _add_problems(entry, mig)
    return entry
