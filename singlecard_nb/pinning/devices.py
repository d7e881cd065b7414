"""The GPUs of this machine, read through NVML (`pynvml`) or from a described machine.

NVML is a separate library from the CUDA driver: reading it never starts CUDA in this process,
so listing GPUs is safe before pinning. `SINGLECARD_NB_MACHINE=/path/machine.json` (or
`use_machine()`) replaces NVML with a described machine, which is how the tests and notebooks
show a 4-GPU box on a CPU-only runner. No NVML library, no driver or no GPU is a normal
machine with zero GPUs and a `reason`.
"""

from __future__ import annotations

import html
import json
import os
import pwd
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

MACHINE_ENV = "SINGLECARD_NB_MACHINE"

_GIB = 1024**3


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    user: str | None
    memory: int | None  # bytes on this GPU; None where NVML cannot say (e.g. in containers)
    name: str | None


@dataclass(frozen=True)
class MigInfo:
    index: int
    uuid: str
    name: str
    memory_total: int
    memory_used: int

    @property
    def memory_free(self) -> int:
        return max(self.memory_total - self.memory_used, 0)


@dataclass(frozen=True)
class GpuInfo:
    index: int  # nvidia-smi numbering
    uuid: str
    name: str
    pci_bus_id: str | None
    memory_total: int
    memory_used: int
    memory_free: int
    utilization: int | None  # percent
    processes: tuple[ProcessInfo, ...]
    mig: tuple[MigInfo, ...]
    cuda_ordinal: int | None  # under CUDA_DEVICE_ORDER=PCI_BUS_ID and the current CUDA_VISIBLE_DEVICES

    def other_processes(self, own_pid: int | None = None) -> tuple[ProcessInfo, ...]:
        """Processes on this GPU that are not this kernel (`own_pid`, default: this process)."""
        own_pid = os.getpid() if own_pid is None else own_pid
        return tuple(p for p in self.processes if p.pid != own_pid)

    @property
    def mig_enabled(self) -> bool:
        return bool(self.mig)


@dataclass(frozen=True, repr=False)
class Machine:
    gpus: tuple[GpuInfo, ...]
    reason: str | None  # why there are no GPUs (None when there are some)
    driver_version: str | None
    source: str  # "nvml" | "described: <path>" | "described"

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        source: str = "described",
        environ: Mapping[str, str] | None = None,
    ) -> Machine:
        """Build a described machine from the JSON format in docs/ARCHITECTURE.md."""
        if not isinstance(data, Mapping) or not isinstance(data.get("gpus", []), list):
            raise ValueError(f"described machine must be an object with a 'gpus' list, got {data!r}")
        gpus = tuple(_gpu_from_dict(g, position) for position, g in enumerate(data.get("gpus", [])))
        reason = data.get("reason")
        if not gpus and reason is None:
            reason = "the described machine has no GPUs"
        machine = cls(gpus, reason, data.get("driver_version"), source)
        return machine.with_ordinals(environ)

    def to_dict(self) -> dict[str, Any]:
        """The described-machine JSON form (round-trips through `from_dict`)."""
        gpus = []
        for gpu in self.gpus:
            entry = {k: getattr(gpu, k) for k in (
                "index", "uuid", "name", "pci_bus_id", "memory_total", "memory_used",
                "memory_free", "utilization")}
            entry["processes"] = [_fields_dict(p) for p in gpu.processes]
            entry["mig"] = [_fields_dict(m) for m in gpu.mig]
            gpus.append(entry)
        out: dict[str, Any] = {"gpus": gpus}
        if self.driver_version is not None:
            out["driver_version"] = self.driver_version
        if self.reason is not None:
            out["reason"] = self.reason
        return out

    def with_ordinals(self, environ: Mapping[str, str] | None = None) -> Machine:
        """This machine with `cuda_ordinal` computed for `environ`'s CUDA_VISIBLE_DEVICES."""
        environ = os.environ if environ is None else environ
        ordinals = cuda_ordinals(self.gpus, environ.get("CUDA_VISIBLE_DEVICES"))
        gpus = tuple(replace(g, cuda_ordinal=ordinals.get(g.uuid)) for g in self.gpus)
        return replace(self, gpus=gpus)

    def by_index(self, index: int) -> GpuInfo | None:
        return next((g for g in self.gpus if g.index == index), None)

    # --- rendering --------------------------------------------------------------------------
    def _title(self) -> str:
        driver = f", driver {self.driver_version}" if self.driver_version else ""
        if not self.gpus:
            return f"No GPUs ({self.source}{driver}): {self.reason}"
        return f"{len(self.gpus)} GPU(s) ({self.source}{driver})"

    def _rows(self) -> list[list[str]]:
        rows = []
        for gpu in self.gpus:
            rows.append([
                str(gpu.index),
                "-" if gpu.cuda_ordinal is None else str(gpu.cuda_ordinal),
                gpu.name,
                f"{gib(gpu.memory_used)} / {gib(gpu.memory_total)} GiB",
                f"{gib(gpu.memory_free)} GiB",
                "-" if gpu.utilization is None else f"{gpu.utilization}%",
                _processes_text(gpu.processes),
                gpu.uuid,
            ])
            for mig in gpu.mig:
                rows.append([
                    f"  MIG {gpu.index}/{mig.index}", "", mig.name,
                    f"{gib(mig.memory_used)} / {gib(mig.memory_total)} GiB",
                    f"{gib(mig.memory_free)} GiB", "", "", mig.uuid,
                ])
        return rows

    _HEADER = ["GPU", "CUDA", "name", "memory used / total", "free", "util", "processes", "UUID"]

    def __repr__(self) -> str:
        lines = [self._title()]
        if self.gpus:
            rows = [self._HEADER] + self._rows()
            widths = [max(len(r[c]) for r in rows) for c in range(len(self._HEADER))]
            for row in rows:
                lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
            lines.append("CUDA = ordinal under CUDA_DEVICE_ORDER=PCI_BUS_ID and the current "
                         "CUDA_VISIBLE_DEVICES ('-' = hidden)")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        title = f"<b>{html.escape(self._title())}</b>"
        if not self.gpus:
            return f"<div>{title}</div>"
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self._HEADER)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
            for row in self._rows()
        )
        return (f"<div>{title}<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
                "<small>CUDA = ordinal under CUDA_DEVICE_ORDER=PCI_BUS_ID and the current "
                "CUDA_VISIBLE_DEVICES ('-' = hidden)</small></div>")


def _fields_dict(obj: Any) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in obj.__dataclass_fields__}


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


# --- CUDA ordinals -------------------------------------------------------------------------

def cuda_ordinals(gpus: Iterable[GpuInfo], visible: str | None) -> dict[str, int]:
    """UUID -> CUDA ordinal under PCI-bus order, honouring a CUDA_VISIBLE_DEVICES value.

    Follows the driver's parsing (as torch.cuda does): entries are integers (PCI-order
    positions) or GPU-/MIG- UUID prefixes; the first invalid entry ends the list and a repeated
    device hides everything. A MIG entry makes no full GPU visible, so it adds no ordinal here.
    """
    in_bus_order = sorted(gpus, key=lambda g: (g.pci_bus_id or "", g.index))
    if visible is None:
        return {g.uuid: ordinal for ordinal, g in enumerate(in_bus_order)}
    chosen: list[GpuInfo | MigInfo] = []
    for entry in visible.split(","):
        entry = entry.strip()
        device = _visible_entry(entry, in_bus_order)
        if device is None:
            break
        if device in chosen:
            return {}
        chosen.append(device)
    return {d.uuid: ordinal for ordinal, d in enumerate(chosen) if isinstance(d, GpuInfo)}


def _visible_entry(entry: str, in_bus_order: list[GpuInfo]) -> GpuInfo | MigInfo | None:
    if entry.startswith(("GPU-", "MIG-")):
        candidates = [d for g in in_bus_order for d in (g, *g.mig) if d.uuid.startswith(entry)]
        return candidates[0] if len(candidates) == 1 else None
    digits = re.match(r"\+?\d+", entry)  # strtoul: "1gpu" means 1
    if digits is None:
        return None
    position = int(digits.group())
    return in_bus_order[position] if position < len(in_bus_order) else None


# --- described machines --------------------------------------------------------------------

def _gpu_from_dict(data: Mapping[str, Any], position: int) -> GpuInfo:
    missing = [k for k in ("index", "uuid", "name") if k not in data]
    if missing:
        raise ValueError(f"described GPU #{position} lacks {', '.join(missing)}: {dict(data)!r}")
    total = int(data.get("memory_total", 0))
    used = int(data.get("memory_used", 0))
    return GpuInfo(
        index=int(data["index"]),
        uuid=str(data["uuid"]),
        name=str(data["name"]),
        pci_bus_id=data.get("pci_bus_id"),
        memory_total=total,
        memory_used=used,
        memory_free=int(data.get("memory_free", max(total - used, 0))),
        utilization=data.get("utilization"),
        processes=tuple(
            ProcessInfo(int(p["pid"]), p.get("user"), p.get("memory"), p.get("name"))
            for p in data.get("processes", [])
        ),
        mig=tuple(
            MigInfo(int(m.get("index", i)), str(m["uuid"]), str(m.get("name", "MIG device")),
                    int(m.get("memory_total", 0)), int(m.get("memory_used", 0)))
            for i, m in enumerate(data.get("mig", []))
        ),
        cuda_ordinal=None,
    )


def _read_described(path: str, environ: Mapping[str, str]) -> Machine:
    source = f"described: {path}"
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return Machine.from_dict(data, source=source, environ=environ)
    except (OSError, ValueError) as e:
        # A broken description is shown as the reason rather than crashing %load_ext.
        return Machine((), f"could not read {MACHINE_ENV}={path}: {e}", None, source)


# --- NVML --------------------------------------------------------------------------------

def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _user_of(pid: int) -> str | None:
    # NVML gives pids only; the owner of /proc/<pid> is the user (None across pid namespaces).
    try:
        return pwd.getpwuid(os.stat(f"/proc/{pid}").st_uid).pw_name
    except (OSError, KeyError):
        return None


def _optional(nvml: Any, fn: Any, *args: Any) -> Any:
    """Call an NVML query that some GPUs do not support; None when it fails."""
    try:
        return fn(*args)
    except nvml.NVMLError:
        return None


def _read_processes(nvml: Any, handle: Any) -> tuple[ProcessInfo, ...]:
    seen: dict[int, ProcessInfo] = {}
    for query in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        fn = getattr(nvml, query, None)
        for proc in (_optional(nvml, fn, handle) if fn else None) or []:
            if proc.pid in seen:
                continue
            name = _optional(nvml, nvml.nvmlSystemGetProcessName, proc.pid)
            memory = getattr(proc, "usedGpuMemory", None)
            seen[proc.pid] = ProcessInfo(
                pid=int(proc.pid),
                user=_user_of(proc.pid),
                memory=None if memory is None else int(memory),
                name=None if name is None else os.path.basename(_text(name)),
            )
    return tuple(seen.values())


def _read_mig(nvml: Any, handle: Any) -> tuple[MigInfo, ...]:
    mode = _optional(nvml, nvml.nvmlDeviceGetMigMode, handle)
    if not mode or mode[0] != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
        return ()
    migs = []
    for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        mig = _optional(nvml, nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, i)
        if mig is None:  # slots without a MIG instance raise NotFound
            continue
        memory = nvml.nvmlDeviceGetMemoryInfo(mig)
        migs.append(MigInfo(i, _text(nvml.nvmlDeviceGetUUID(mig)), _text(nvml.nvmlDeviceGetName(mig)),
                            int(memory.total), int(memory.used)))
    return tuple(migs)


def _read_gpu(nvml: Any, index: int) -> GpuInfo:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    pci = _optional(nvml, nvml.nvmlDeviceGetPciInfo, handle)
    utilization = _optional(nvml, nvml.nvmlDeviceGetUtilizationRates, handle)
    return GpuInfo(
        index=index,
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        name=_text(nvml.nvmlDeviceGetName(handle)),
        pci_bus_id=None if pci is None else _text(pci.busId),
        memory_total=int(memory.total),
        memory_used=int(memory.used),
        memory_free=int(memory.free),
        utilization=None if utilization is None else int(utilization.gpu),
        processes=_read_processes(nvml, handle),
        mig=_read_mig(nvml, handle),
        cuda_ordinal=None,
    )


def _init_failure(nvml: Any, error: Exception) -> str:
    value = getattr(error, "value", None)
    if value == getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", 12):
        return "NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver on this machine"
    if value == getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", 9):
        return "the NVIDIA kernel driver is not loaded"
    return f"NVML could not start: {error}"


def read_nvml(nvml: Any = None, environ: Mapping[str, str] | None = None) -> Machine:
    """Ask NVML for every GPU. `nvml` is the pynvml module (injectable for tests)."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return Machine((), "the nvidia-ml-py package (module pynvml) is not installed",
                           None, "nvml")
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        return Machine((), _init_failure(nvml, e), None, "nvml")
    try:
        driver = _optional(nvml, nvml.nvmlSystemGetDriverVersion)
        driver = None if driver is None else _text(driver)
        try:
            gpus = tuple(_read_gpu(nvml, i) for i in range(nvml.nvmlDeviceGetCount()))
        except nvml.NVMLError as e:
            return Machine((), f"NVML error while reading GPUs: {e}", driver, "nvml")
        reason = None if gpus else "NVML reports no GPUs"
        return Machine(gpus, reason, driver, "nvml").with_ordinals(environ)
    finally:
        _optional(nvml, nvml.nvmlShutdown)


# --- the process-wide reader ----------------------------------------------------------------

_injected: Machine | None = None


def use_machine(machine: Machine | None) -> None:
    """Make `read_machine()` return `machine` (tests, demos); None goes back to NVML."""
    global _injected
    _injected = machine


def read_machine(environ: Mapping[str, str] | None = None) -> Machine:
    """The GPUs of this machine: injected, described by SINGLECARD_NB_MACHINE, or from NVML.

    Never raises for "no GPU"; never starts the CUDA driver. `cuda_ordinal` is computed for
    `environ` (default `os.environ`).
    """
    environ = os.environ if environ is None else environ
    if _injected is not None:
        return _injected.with_ordinals(environ)
    path = environ.get(MACHINE_ENV)
    if path:
        return _read_described(path, environ)
    return read_nvml(environ=environ)


def gpus() -> Machine:
    """The GPUs of this machine, as a table (`singlecard_nb.gpus()`)."""
    return read_machine()
