"""A fake `pynvml` that can fail per GPU and per call, the way real machines do.

Inject it with `devices.use_nvml(FakeNVML(gpus))` (every `read_machine()` then asks it, so a
test can change `fake.gpus` between a listing and a pin), or pass it to `devices.read_nvml`.

    fake = FakeNVML([gpu("GPU-aaaa", "H100"), gpu("GPU-bbbb", "A100")])
    fake.fail(1, "nvmlDeviceGetMemoryInfo", GPU_IS_LOST)   # GPU 1's memory cannot be read
    fake.fail(None, "nvmlDeviceGetUtilizationRates", NOT_SUPPORTED)   # on every GPU
    fake.remove("nvmlDeviceGetMigMode")                    # an nvidia-ml-py without MIG calls

Errors are raised as pynvml raises them: `NVMLError(value)` builds the subclass named after the
error (`NVMLError_GpuIsLost`), whose message is NVML's own text.
"""

from __future__ import annotations

from typing import Any

NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
LIBRARY_NOT_FOUND = 12
GPU_IS_LOST = 15
UNKNOWN = 999

_ERRORS = {
    NOT_SUPPORTED: ("NotSupported", "Not Supported"),
    NO_PERMISSION: ("NoPermission", "Insufficient Permissions"),
    NOT_FOUND: ("NotFound", "Not Found"),
    DRIVER_NOT_LOADED: ("DriverNotLoaded", "Driver Not Loaded"),
    LIBRARY_NOT_FOUND: ("LibraryNotFound", "NVML Shared Library Not Found"),
    GPU_IS_LOST: ("GpuIsLost", "GPU is lost"),
    UNKNOWN: ("Unknown", "Unknown Error"),
}


class NVMLError(Exception):
    """pynvml's base error: `NVMLError(15)` is an `NVMLError_GpuIsLost`."""

    _subclasses: dict[int, type] = {}

    def __new__(cls, value: int):
        if cls is NVMLError and value in NVMLError._subclasses:
            cls = NVMLError._subclasses[value]
        return Exception.__new__(cls)

    def __init__(self, value: int):
        self.value = value
        super().__init__(value)

    def __str__(self) -> str:
        return _ERRORS.get(self.value, ("", f"NVML error {self.value}"))[1]


for _value, (_name, _) in _ERRORS.items():
    NVMLError._subclasses[_value] = type(f"NVMLError_{_name}", (NVMLError,), {})


class _Memory:
    def __init__(self, total: int, used: int):
        self.total, self.used, self.free = total, used, total - used


class _Proc:
    def __init__(self, pid: int, memory: int | None):
        self.pid, self.usedGpuMemory = pid, memory


def gpu(uuid: str | bytes, name: str | bytes = "NVIDIA A100-SXM4-80GB", *, pci: str | None = None,
        total: int = 80 * 1024**3, used: int = 0, util: int | None = 0,
        procs: list[tuple[int, int | None]] | None = None,
        mig: dict[int, dict] | None = None) -> dict:
    """One GPU as the fake describes it (a MIG slot: {"uuid", "name", "total", "used"})."""
    spec: dict[str, Any] = {"uuid": uuid, "name": name, "pci": pci, "total": total, "used": used,
                            "util": util, "procs": procs or []}
    if mig is not None:
        spec["mig"] = mig
    return spec


class FakeNVML:
    """Just enough of pynvml's surface, driven by a list of GPU dicts (see `gpu()`)."""

    NVMLError = NVMLError
    NVML_ERROR_NOT_SUPPORTED = NOT_SUPPORTED
    NVML_ERROR_NOT_FOUND = NOT_FOUND
    NVML_ERROR_LIBRARY_NOT_FOUND = LIBRARY_NOT_FOUND
    NVML_ERROR_DRIVER_NOT_LOADED = DRIVER_NOT_LOADED
    NVML_DEVICE_MIG_ENABLE = 1
    __version__ = "fake-0"

    def __init__(self, gpus: list[dict], init_error: Exception | None = None,
                 process_names: dict[int, str] | None = None):
        self.gpus = gpus
        self.init_error = init_error
        self.process_names = process_names or {}
        self.failures: dict[tuple[int | str | None, str], Exception] = {}
        self.removed: set[str] = set()
        self.inits = self.shutdowns = 0

    # --- configuring failures -------------------------------------------------------------
    def fail(self, index: int | str | None, call: str, error: int | Exception) -> FakeNVML:
        """Make `call` raise for GPU `index` ("1/3": MIG device 3 of GPU 1; None: every
        device and the system calls); an int error is an NVML error value."""
        self.failures[(index, call)] = NVMLError(error) if isinstance(error, int) else error
        return self

    def remove(self, *calls: str) -> FakeNVML:
        """Make these functions absent, as in an older nvidia-ml-py (AttributeError)."""
        self.removed.update(calls)
        return self

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml") and name in object.__getattribute__(self, "removed"):
            raise AttributeError(f"module 'pynvml' has no attribute {name!r}")
        return object.__getattribute__(self, name)

    def _check(self, call: str, handle: Any = None) -> None:
        where = None if handle is None else (
            handle[1] if handle[0] == "gpu" else f"{handle[1]}/{handle[2]}")
        error = self.failures.get((where, call)) or self.failures.get((None, call))
        if error is not None:
            raise error

    def _spec(self, handle: Any) -> dict:
        spec = self.gpus[handle[1]]
        return spec if handle[0] == "gpu" else spec["mig"][handle[2]]

    # --- pynvml's functions -------------------------------------------------------------------
    def nvmlInit(self):
        if self.init_error is not None:
            raise self.init_error
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self):
        self._check("nvmlSystemGetDriverVersion")
        return b"550.54.15"  # older pynvml returns bytes

    def nvmlDeviceGetCount(self):
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        self._check("nvmlDeviceGetHandleByIndex", ("gpu", i))
        return ("gpu", i)

    def nvmlDeviceGetUUID(self, handle):
        self._check("nvmlDeviceGetUUID", handle)
        return self._spec(handle)["uuid"]

    def nvmlDeviceGetName(self, handle):
        self._check("nvmlDeviceGetName", handle)
        return self._spec(handle)["name"]

    def nvmlDeviceGetMemoryInfo(self, handle):
        self._check("nvmlDeviceGetMemoryInfo", handle)
        spec = self._spec(handle)
        return _Memory(spec["total"], spec["used"])

    def nvmlDeviceGetPciInfo(self, handle):
        self._check("nvmlDeviceGetPciInfo", handle)
        bus = self._spec(handle).get("pci") or f"00000000:{handle[1] + 1:02X}:00.0"
        return type("Pci", (), {"busId": bus})()

    def nvmlDeviceGetUtilizationRates(self, handle):
        self._check("nvmlDeviceGetUtilizationRates", handle)
        util = self._spec(handle).get("util")
        if util is None:
            raise NVMLError(NOT_SUPPORTED)
        return type("Util", (), {"gpu": util})()

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        self._check("nvmlDeviceGetComputeRunningProcesses", handle)
        return [_Proc(pid, mem) for pid, mem in self._spec(handle).get("procs", [])]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        self._check("nvmlDeviceGetGraphicsRunningProcesses", handle)
        return [_Proc(pid, mem) for pid, mem in self._spec(handle).get("procs", [])[:1]]

    def nvmlSystemGetProcessName(self, pid):
        if pid not in self.process_names:
            raise NVMLError(NOT_FOUND)
        return self.process_names[pid]

    def nvmlDeviceGetMigMode(self, handle):
        self._check("nvmlDeviceGetMigMode", handle)
        if "mig" not in self._spec(handle):
            raise NVMLError(NOT_SUPPORTED)
        return [self.NVML_DEVICE_MIG_ENABLE, self.NVML_DEVICE_MIG_ENABLE]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        self._check("nvmlDeviceGetMaxMigDeviceCount", handle)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index):
        self._check("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if self._spec(handle)["mig"].get(index) is None:
            raise NVMLError(NOT_FOUND)
        return ("mig", handle[1], index)
