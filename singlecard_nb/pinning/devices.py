"""The GPUs of this machine, read through NVML (`pynvml`) or from a described machine.

NVML is a separate library from the CUDA driver: reading it never starts CUDA in this process,
so listing GPUs is safe before pinning. `SINGLECARD_NB_MACHINE=/path/machine.json` (or
`use_machine()`) replaces NVML with a described machine, which is how the tests and notebooks
show a 4-GPU box on a CPU-only runner. No NVML library, no driver or no GPU is a normal
machine with zero GPUs and a `reason`.

NVML fails piecemeal on real machines (a GPU fallen off the bus, a field a board does not
support, a container without permission, an old nvidia-ml-py without the MIG calls): each GPU
and each field is read on its own. A field that cannot be read is `None` and its reason is in
`unknown`; a GPU (or MIG device) whose UUID cannot be read cannot be pinned, and says why in
`unusable`; the rest of the machine stays usable.
"""

from __future__ import annotations

import html
import json
import math
import os
import pwd
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

MACHINE_ENV = "SINGLECARD_NB_MACHINE"
ALLOCATION_ENV = "CUDA_VISIBLE_DEVICES"

_GIB = 1024**3

Unknown = tuple[tuple[str, str], ...]  # (field, why it could not be read)


class MachineFileError(ValueError):
    """A SINGLECARD_NB_MACHINE file that is missing, not JSON, or not a described machine."""


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


def _allowed_names(gpus: tuple[GpuInfo, ...]) -> list[str]:
    names = []
    for gpu in gpus:
        migs = [m for m in gpu.mig if m.in_allocation]
        if gpu.in_allocation and (not gpu.mig or len(migs) == len(gpu.mig)):
            names.append(f"GPU {gpu.index}")
        else:
            names += [f"MIG {gpu.index}/{m.index}" for m in migs]
    return names


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
        """Build a described machine from the JSON format in docs/ARCHITECTURE.md.

        Raises ValueError naming the entry and field that is wrong (e.g. `gpus[1].memory_total`).
        """
        data = _object(data, "the machine", _MACHINE_KEYS)
        entries = _typed(data, "gpus", list, "a list of GPU objects", "the machine", [])
        gpus = tuple(_gpu_from_dict(g, f"gpus[{position}]") for position, g in enumerate(entries))
        _unique(gpus)
        reason = _typed(data, "reason", str, "a string", "the machine", None)
        if not gpus and reason is None:
            reason = "the described machine has no GPUs"
        driver = _typed(data, "driver_version", str, "a string", "the machine", None)
        return cls(gpus, reason, driver, source).with_ordinals(environ)

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
            if gpu.unknown:
                entry["unknown"] = dict(gpu.unknown)
            if gpu.unusable is not None:
                entry["unusable"] = gpu.unusable
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
        ordinals = _ordinals(self.gpus, environ.get(ALLOCATION_ENV))
        allocation = allocation_environ.get(ALLOCATION_ENV)
        allowed = _visible(self.gpus, allocation)

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

    # --- rendering --------------------------------------------------------------------------
    def _title(self) -> str:
        driver = f", driver {self.driver_version}" if self.driver_version else ""
        if not self.gpus:
            return f"No GPUs ({self.source}{driver}): {self.reason}"
        return f"{len(self.gpus)} GPU(s) ({self.source}{driver})"

    def _rows(self) -> list[list[str]]:
        rows = []
        for gpu in self.gpus:
            processes = (_processes_text(gpu.processes) if gpu.processes_known else "?")
            rows.append([
                str(gpu.index),
                "-" if gpu.cuda_ordinal is None else str(gpu.cuda_ordinal),
                gpu.name,
                f"{gib(gpu.memory_used)} / {gib(gpu.memory_total)} GiB",
                f"{gib(gpu.memory_free)} GiB",
                ("?" if gpu.why_unknown("utilization") else "-") if gpu.utilization is None
                else f"{gpu.utilization}%",
                processes,
                _can_pin(gpu.unusable, gpu.in_allocation),
                gpu.uuid or "?",
            ])
            for mig in gpu.mig:
                rows.append([
                    f"  MIG {gpu.index}/{mig.index}", "", mig.name,
                    f"{gib(mig.memory_used)} / {gib(mig.memory_total)} GiB",
                    f"{gib(mig.memory_free)} GiB", "", "",
                    _can_pin(mig.unusable, mig.in_allocation), mig.uuid or "?",
                ])
        return rows

    _HEADER = ["GPU", "CUDA", "name", "memory used / total", "free", "util", "processes",
               "can pin", "UUID"]

    def notes(self) -> list[str]:
        """Lines under the table: the allocation, what each column means, what could not be read."""
        lines = []
        if self.allocation is not None:
            lines.append(f"Allocation: {self.allocation_text()}; GPUs outside it are not "
                         "offered (pin one anyway with --force, or force=True).")
        lines.append(f"CUDA = ordinal under CUDA_DEVICE_ORDER=PCI_BUS_ID and the current "
                     f"{ALLOCATION_ENV} ('-' = hidden)")
        lines += problems(self)
        return lines

    def __repr__(self) -> str:
        lines = [self._title()]
        if self.gpus:
            rows = [self._HEADER] + self._rows()
            widths = [max(len(r[c]) for r in rows) for c in range(len(self._HEADER))]
            for row in rows:
                lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
            lines += self.notes()
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        title = f"<b>{html.escape(self._title())}</b>"
        if not self.gpus:
            return f"<div>{title}</div>"
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self._HEADER)
        body = "".join(
            ("<tr style='color:#999'>" if row[7] != "yes" else "<tr>")
            + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
            for row in self._rows()
        )
        notes = "<br>".join(html.escape(line) for line in self.notes())
        return (f"<div>{title}<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
                f"<small>{notes}</small></div>")


def _can_pin(unusable: str | None, in_allocation: bool) -> str:
    if unusable is not None:
        return "no: unusable"
    return "yes" if in_allocation else "outside allocation"


def problems(machine: Machine) -> list[str]:
    """One line per GPU or MIG device that is unusable or has fields NVML could not read."""
    lines = []
    for gpu in machine.gpus:
        if gpu.unusable is not None:
            lines.append(f"GPU {gpu.index} cannot be pinned: {gpu.unusable}")
        if gpu.unknown:
            lines.append(f"GPU {gpu.index}: " + _unknown_text(gpu.unknown))
        for mig in gpu.mig:
            if mig.unusable is not None:
                lines.append(f"MIG {gpu.index}/{mig.index} cannot be pinned: {mig.unusable}")
            if mig.unknown:
                lines.append(f"MIG {gpu.index}/{mig.index}: " + _unknown_text(mig.unknown))
    return lines


def _unknown_text(unknown: Unknown) -> str:
    return "; ".join(f"{name} unknown ({why})" for name, why in unknown)


def _fields_dict(obj: Any) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in obj.__dataclass_fields__}


def _mig_dict(mig: MigInfo) -> dict[str, Any]:
    entry = {k: getattr(mig, k) for k in ("index", "uuid", "name", "memory_total", "memory_used")}
    entry = {k: v for k, v in entry.items() if v is not None}
    if mig.unknown:
        entry["unknown"] = dict(mig.unknown)
    if mig.unusable is not None:
        entry["unusable"] = mig.unusable
    return entry


def gib(n: int | None) -> str:
    """Bytes as GiB with one decimal ("?" when unknown): every GPU memory figure shown."""
    return "?" if n is None else f"{n / _GIB:.1f}"


def _processes_text(processes: Iterable[ProcessInfo]) -> str:
    parts = []
    for p in processes:
        who = " ".join(x for x in (p.user, p.name) if x)
        memory = "" if p.memory is None else f" {gib(p.memory)} GiB"
        parts.append(f"{p.pid}{' ' + who if who else ''}{memory}")
    return ", ".join(parts) or "-"


# --- CUDA ordinals and the allocation ---------------------------------------------------------

def _visible(gpus: tuple[GpuInfo, ...], visible: str | None) -> list[GpuInfo | MigInfo] | None:
    """The devices a CUDA_VISIBLE_DEVICES value makes visible, in CUDA order (None: unset, all).

    Follows the driver's parsing (as torch.cuda does): entries are integers (PCI-order
    positions) or GPU-/MIG- UUID prefixes; the first invalid entry ends the list (so `""`,
    `-1` and Slurm's `NoDevFiles` allow nothing) and a repeated device hides everything.
    """
    if visible is None:
        return None
    in_bus_order = sorted(gpus, key=lambda g: (g.pci_bus_id or "", g.index))
    chosen: list[GpuInfo | MigInfo] = []
    for entry in visible.split(","):
        device = _visible_entry(entry.strip(), in_bus_order)
        if device is None:
            break
        if any(device is d for d in chosen):
            return []
        chosen.append(device)
    return chosen


def _ordinals(gpus: tuple[GpuInfo, ...], visible: str | None) -> list[int | None]:
    """Each GPU's CUDA ordinal under PCI-bus order and a CUDA_VISIBLE_DEVICES value.

    A MIG entry makes no full GPU visible, so it adds no ordinal here.
    """
    chosen = _visible(gpus, visible)
    if chosen is None:
        chosen = sorted(gpus, key=lambda g: (g.pci_bus_id or "", g.index))
    whole = [d for d in chosen if isinstance(d, GpuInfo)]
    return [next((o for o, d in enumerate(whole) if d is g), None) for g in gpus]


def _visible_entry(entry: str, in_bus_order: list[GpuInfo]) -> GpuInfo | MigInfo | None:
    if entry.startswith(("GPU-", "MIG-")):
        candidates = [d for g in in_bus_order for d in (g, *g.mig)
                      if d.uuid and d.uuid.startswith(entry)]
        return candidates[0] if len(candidates) == 1 else None
    digits = re.match(r"\+?\d+", entry)  # strtoul: "1gpu" means 1
    if digits is None:
        return None
    position = int(digits.group())
    return in_bus_order[position] if position < len(in_bus_order) else None


# --- described machines --------------------------------------------------------------------

_MACHINE_KEYS = {"gpus", "reason", "driver_version"}
_GPU_KEYS = {"index", "uuid", "name", "pci_bus_id", "memory_total", "memory_used", "memory_free",
             "utilization", "processes", "mig", "unknown", "unusable"}
_PROCESS_KEYS = {"pid", "user", "memory", "name"}
_MIG_KEYS = {"index", "uuid", "name", "memory_total", "memory_used", "unknown", "unusable"}
_ABSENT = object()


def _shown(value: Any) -> str:
    """A JSON value as the file spells it (null, Infinity, "text")."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _object(data: Any, where: str, known: set[str]) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected an object, got {_shown(data)}")
    # Keys starting with "_" are comments; any other unknown key is most likely a typo.
    unknown = sorted(k for k in data if not (isinstance(k, str) and k.startswith("_"))
                     and k not in known)
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(known))})")
    return data


def _typed(data: Mapping[str, Any], key: str, kind: type, words: str, where: str,
           default: Any = _ABSENT) -> Any:
    value = data.get(key, _ABSENT)
    if value is _ABSENT:
        if default is _ABSENT:
            raise ValueError(f"{where}.{key}: missing (expected {words})")
        return default
    if value is None and default is None:
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{where}.{key}: expected {words}, got {_shown(value)}")
    return value


def _whole(data: Mapping[str, Any], key: str, where: str, default: Any = _ABSENT, *,
           nullable: bool = False, at_most: int | None = None) -> Any:
    """A non-negative whole number (bytes, pids, indices); a JSON 8.5e10 that is whole is fine."""
    words = "a whole number ≥ 0" + ("" if at_most is None else f" and ≤ {at_most}")
    words += " or null" if nullable else ""
    value = data.get(key, _ABSENT)
    if value is _ABSENT:
        if default is _ABSENT:
            raise ValueError(f"{where}.{key}: missing (expected {words})")
        return default
    if value is None and nullable:
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if (not isinstance(value, int) or isinstance(value, bool) or value < 0
            or (at_most is not None and value > at_most)):
        raise ValueError(f"{where}.{key}: expected {words}, got {_shown(value)}")
    return value


def _unknown_from(data: Mapping[str, Any], where: str) -> Unknown:
    value = data.get("unknown", {})
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValueError(f"{where}.unknown: expected an object of field -> reason strings, "
                         f"got {_shown(value)}")
    return tuple(value.items())


def _memory_pair(data: Mapping[str, Any], where: str, unknown: Unknown) -> tuple[Any, Any]:
    # Memory a description marks unknown is None; otherwise absent means 0 (a bare example).
    default = None if "memory" in dict(unknown) else 0
    return (_whole(data, "memory_total", where, default),
            _whole(data, "memory_used", where, default))


def _mig_from_dict(data: Any, where: str, position: int) -> MigInfo:
    data = _object(data, where, _MIG_KEYS)
    unusable = _typed(data, "unusable", str, "a string", where, None)
    unknown = _unknown_from(data, where)
    total, used = _memory_pair(data, where, unknown)
    return MigInfo(
        index=_whole(data, "index", where, position),
        uuid=_uuid(data, where, "a MIG UUID string", unusable),
        name=_typed(data, "name", str, "a string", where, "MIG device"),
        memory_total=total, memory_used=used, unknown=unknown, unusable=unusable,
    )


def _process_from_dict(data: Any, where: str) -> ProcessInfo:
    data = _object(data, where, _PROCESS_KEYS)
    return ProcessInfo(
        pid=_whole(data, "pid", where),
        user=_typed(data, "user", str, "a string or null", where, None),
        memory=_whole(data, "memory", where, None, nullable=True),
        name=_typed(data, "name", str, "a string or null", where, None),
    )


def _uuid(data: Mapping[str, Any], where: str, words: str, unusable: str | None) -> str:
    uuid = _typed(data, "uuid", str, words, where, "" if unusable is not None else _ABSENT)
    if not uuid and unusable is None:
        raise ValueError(f"{where}.uuid: empty (expected {words}; a device whose UUID cannot "
                         "be read says why in 'unusable')")
    return uuid


def _gpu_from_dict(data: Any, where: str) -> GpuInfo:
    data = _object(data, where, _GPU_KEYS)
    unusable = _typed(data, "unusable", str, "a string", where, None)
    unknown = _unknown_from(data, where)
    total, used = _memory_pair(data, where, unknown)
    free_default = None if total is None or used is None else max(total - used, 0)
    processes = _typed(data, "processes", list, "a list of process objects", where, [])
    migs = _typed(data, "mig", list, "a list of MIG device objects", where, [])
    return GpuInfo(
        index=_whole(data, "index", where),
        uuid=_uuid(data, where, "a GPU UUID string", unusable),
        name=_typed(data, "name", str, "a string", where),
        pci_bus_id=_typed(data, "pci_bus_id", str, "a string or null", where, None),
        memory_total=total,
        memory_used=used,
        memory_free=_whole(data, "memory_free", where, free_default, nullable=True),
        utilization=_whole(data, "utilization", where, None, nullable=True, at_most=100),
        processes=tuple(_process_from_dict(p, f"{where}.processes[{i}]")
                        for i, p in enumerate(processes)),
        mig=tuple(_mig_from_dict(m, f"{where}.mig[{i}]", i) for i, m in enumerate(migs)),
        cuda_ordinal=None,
        unknown=unknown,
        unusable=unusable,
    )


def _unique(gpus: tuple[GpuInfo, ...]) -> None:
    seen_index: dict[int, int] = {}
    seen_uuid: dict[str, str] = {}
    for position, gpu in enumerate(gpus):
        if gpu.index in seen_index:
            raise ValueError(f"gpus[{position}].index: {gpu.index} is already "
                             f"gpus[{seen_index[gpu.index]}]'s index")
        seen_index[gpu.index] = position
        for where, uuid in ((f"gpus[{position}].uuid", gpu.uuid),
                            *((f"gpus[{position}].mig[{i}].uuid", m.uuid)
                              for i, m in enumerate(gpu.mig))):
            if uuid and uuid in seen_uuid:
                raise ValueError(f"{where}: {uuid!r} is already {seen_uuid[uuid]}")
            seen_uuid[uuid] = where


def _read_described(path: str, environ: Mapping[str, str]) -> Machine:
    source = f"described: {path}"
    where = f"{MACHINE_ENV}={path}"
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise MachineFileError(f"{where}: cannot read the file: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise MachineFileError(f"{where}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        data = json.loads(text)  # NaN / Infinity are read, then refused naming their field
    except json.JSONDecodeError as e:
        raise MachineFileError(f"{where}: not valid JSON: {e.msg} at line {e.lineno} "
                               f"column {e.colno}") from None
    try:
        return Machine.from_dict(data, source=source, environ=environ)
    except ValueError as e:
        raise MachineFileError(f"{where}: {e}") from None


# --- NVML --------------------------------------------------------------------------------
# Errors a single NVML call can raise on real machines besides NVMLError: an old binding's
# struct mismatch (TypeError), a name that is not UTF-8 (UnicodeDecodeError, a ValueError),
# a library that fails to load lazily (OSError).
_CALL_ERRORS: tuple[type[Exception], ...] = (OSError, TypeError, ValueError)
_NOT_SUPPORTED = 3
_NOT_FOUND = 6


class _NvmlReader:
    """Reads one NVML session's GPUs, each call on its own: failures become reasons."""

    def __init__(self, nvml: Any):
        self.nvml = nvml
        self.errors = (getattr(nvml, "NVMLError", OSError), *_CALL_ERRORS)
        self.not_supported = getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", _NOT_SUPPORTED)
        self.not_found = getattr(nvml, "NVML_ERROR_NOT_FOUND", _NOT_FOUND)

    def call(self, unknown: dict[str, str] | None, what: str, fn_name: str, *args: Any,
             quiet: tuple[int, ...] = ()) -> Any:
        """`nvml.fn_name(*args)`, or None with the reason recorded as `unknown[what]`.

        quiet: NVML error values that mean "there is none" (no reason recorded).
        """
        fn = getattr(self.nvml, fn_name, None)
        if fn is None:
            if unknown is not None:
                version = getattr(self.nvml, "__version__", None) or "installed"
                unknown.setdefault(what, f"this nvidia-ml-py ({version}) has no {fn_name}: it is "
                                         "too old; `pip install -U nvidia-ml-py`")
            return None
        try:
            return fn(*args)
        except self.errors as e:
            if getattr(e, "value", None) in quiet:
                return None
            if unknown is not None:
                unknown.setdefault(what, _error_text(fn_name, e))
            return None

    def text(self, unknown: dict[str, str], what: str, fn_name: str, *args: Any) -> str | None:
        value = self.call(unknown, what, fn_name, *args)
        if value is None:
            return None
        try:
            return _text(value)
        except UnicodeDecodeError as e:
            unknown.setdefault(what, _error_text(fn_name, e))
            return None

    def processes(self, handle: Any, unknown: dict[str, str]) -> tuple[ProcessInfo, ...]:
        seen: dict[int, ProcessInfo] = {}
        answered = 0
        reasons: dict[str, str] = {}
        for query in ("nvmlDeviceGetComputeRunningProcesses",
                      "nvmlDeviceGetGraphicsRunningProcesses"):
            found = self.call(reasons, query, query, handle)
            if found is None:
                continue
            answered += 1
            for proc in found:
                pid = int(proc.pid)
                if pid in seen:
                    continue
                name = self.call(None, "", "nvmlSystemGetProcessName", pid)
                memory = getattr(proc, "usedGpuMemory", None)
                seen[pid] = ProcessInfo(
                    pid=pid,
                    user=_user_of(pid),
                    memory=None if memory is None else int(memory),
                    name=None if name is None else os.path.basename(_text(name, "replace")),
                )
        # Compute processes are the ones that matter; a board that only lacks the graphics list
        # still tells us who computes on it.
        if "nvmlDeviceGetComputeRunningProcesses" in reasons:
            unknown["processes"] = reasons["nvmlDeviceGetComputeRunningProcesses"]
        elif not answered:
            unknown["processes"] = "; ".join(reasons.values())
        return tuple(seen.values())

    def migs(self, handle: Any, unknown: dict[str, str]) -> tuple[MigInfo, ...]:
        mode = self.call(unknown, "mig", "nvmlDeviceGetMigMode", handle,
                         quiet=(self.not_supported,))
        if not mode or mode[0] != getattr(self.nvml, "NVML_DEVICE_MIG_ENABLE", 1):
            return ()
        count = self.call(unknown, "mig", "nvmlDeviceGetMaxMigDeviceCount", handle)
        migs = []
        for i in range(count or 0):
            mig = self.call(unknown, "mig", "nvmlDeviceGetMigDeviceHandleByIndex", handle, i,
                            quiet=(self.not_found,))  # slots without a MIG instance
            if mig is None:
                continue
            own: dict[str, str] = {}
            uuid = self.text(own, "uuid", "nvmlDeviceGetUUID", mig)
            memory = self.call(own, "memory", "nvmlDeviceGetMemoryInfo", mig)
            name = self.text(own, "name", "nvmlDeviceGetName", mig)
            unusable = None if uuid else f"its UUID cannot be read ({own.pop('uuid')})"
            migs.append(MigInfo(
                i, uuid or "", name or "?",
                None if memory is None else int(memory.total),
                None if memory is None else int(memory.used),
                unknown=tuple(own.items()), unusable=unusable,
            ))
        return tuple(migs)

    def gpu(self, index: int) -> GpuInfo:
        unknown: dict[str, str] = {}
        handle = self.call(unknown, "handle", "nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            return GpuInfo(index, "", "?", None, None, None, None, None, (), (), None,
                           unusable=f"NVML cannot open it ({unknown['handle']})")
        uuid = self.text(unknown, "uuid", "nvmlDeviceGetUUID", handle)
        name = self.text(unknown, "name", "nvmlDeviceGetName", handle)
        memory = self.call(unknown, "memory", "nvmlDeviceGetMemoryInfo", handle)
        pci = self.call(None, "", "nvmlDeviceGetPciInfo", handle)
        utilization = self.call(unknown, "utilization", "nvmlDeviceGetUtilizationRates", handle)
        processes = self.processes(handle, unknown)
        migs = self.migs(handle, unknown)
        unusable = None if uuid else f"its UUID cannot be read ({unknown.pop('uuid')})"
        return GpuInfo(
            index=index,
            uuid=uuid or "",
            name=name or "?",
            pci_bus_id=None if pci is None else _text(pci.busId, "replace"),
            memory_total=None if memory is None else int(memory.total),
            memory_used=None if memory is None else int(memory.used),
            memory_free=None if memory is None else int(memory.free),
            utilization=None if utilization is None else int(utilization.gpu),
            processes=processes,
            mig=migs,
            cuda_ordinal=None,
            unknown=tuple(unknown.items()),
            unusable=unusable,
        )


def _error_text(fn_name: str, error: Exception) -> str:
    return f"{fn_name}: {type(error).__name__}: {error}"


def _text(value: Any, errors: str = "strict") -> str:
    return value.decode("utf-8", errors) if isinstance(value, bytes) else str(value)


def _user_of(pid: int) -> str | None:
    # NVML gives pids only; the owner of /proc/<pid> is the user (None across pid namespaces).
    try:
        return pwd.getpwuid(os.stat(f"/proc/{pid}").st_uid).pw_name
    except (OSError, KeyError):
        return None


def _init_failure(nvml: Any, error: Exception) -> str:
    value = getattr(error, "value", None)
    if value == getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", 12):
        return "NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver on this machine"
    if value == getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", 9):
        return "the NVIDIA kernel driver is not loaded"
    if isinstance(error, OSError):
        return f"the NVML library could not be loaded: {error}"
    return f"NVML could not start: {type(error).__name__}: {error}"


def read_nvml(nvml: Any = None, environ: Mapping[str, str] | None = None,
              allocation_environ: Mapping[str, str] | None = None) -> Machine:
    """Ask NVML for every GPU. `nvml` is the pynvml module (injectable for tests)."""
    return _ask_nvml(nvml).with_ordinals(environ, allocation_environ)


def _ask_nvml(nvml: Any) -> Machine:
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return Machine((), "the nvidia-ml-py package (module pynvml) is not installed",
                           None, "nvml")
    reader = _NvmlReader(nvml)
    try:
        nvml.nvmlInit()
    except (*reader.errors, AttributeError) as e:
        return Machine((), _init_failure(nvml, e), None, "nvml")
    try:
        driver = reader.text({}, "driver", "nvmlSystemGetDriverVersion")
        whole: dict[str, str] = {}
        count = reader.call(whole, "count", "nvmlDeviceGetCount")
        if count is None:
            return Machine((), f"NVML cannot count the GPUs ({whole['count']})", driver, "nvml")
        gpus = tuple(reader.gpu(i) for i in range(count))
        return Machine(gpus, None if gpus else "NVML reports no GPUs", driver, "nvml")
    finally:
        reader.call(None, "", "nvmlShutdown")


# --- the process-wide reader ----------------------------------------------------------------

_injected: Machine | None = None
_injected_nvml: Any = None


def use_machine(machine: Machine | None) -> None:
    """Make `read_machine()` return `machine` (tests, demos); None goes back to NVML."""
    global _injected
    _injected = machine


def use_nvml(nvml: Any) -> None:
    """Make `read_machine()` ask this pynvml-like module (tests: a fake NVML that fails on
    purpose); None goes back to the real pynvml."""
    global _injected_nvml
    _injected_nvml = nvml


def read_machine(
    environ: Mapping[str, str] | None = None,
    allocation_environ: Mapping[str, str] | None = None,
) -> Machine:
    """The GPUs of this machine: injected, described by SINGLECARD_NB_MACHINE, or from NVML.

    Never raises for "no GPU" or a failing NVML; never starts the CUDA driver. A broken
    SINGLECARD_NB_MACHINE file raises `MachineFileError` (one line naming file, entry, field).
    `cuda_ordinal` is computed for `environ` (default `os.environ`), `in_allocation` for
    `allocation_environ` (default: `environ`).
    """
    environ = os.environ if environ is None else environ
    if _injected is not None:
        return _injected.with_ordinals(environ, allocation_environ)
    path = environ.get(MACHINE_ENV)
    if path:
        machine = _read_described(path, environ)
        return machine.with_ordinals(environ, allocation_environ)
    return read_nvml(_injected_nvml, environ=environ, allocation_environ=allocation_environ)


def gpus() -> Machine:
    """The GPUs of this machine, as a table (`singlecard_nb.gpus()`)."""
    return read_machine()

