"""The GPUs of this machine as NVML (`pynvml`) reports them.

NVML is a separate library from the CUDA driver: reading it never starts CUDA in this process,
so listing GPUs is safe before pinning. No NVML library, no driver or no GPU is a normal
machine with zero GPUs and a `reason`.

NVML fails piecemeal on real machines (a GPU fallen off the bus, a field a board does not
support, a container without permission, an old nvidia-ml-py without the MIG calls): each GPU
and each field is read on its own. A field that cannot be read is `None` and its reason is in
`unknown`; a GPU (or MIG device) whose UUID cannot be read cannot be pinned, and says why in
`unusable`; the rest of the machine stays usable.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from typing import Any

from .model import GpuInfo, Machine, MigInfo, ProcessInfo

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
