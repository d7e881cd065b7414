"""GPU discovery: NVML reading (through a fake pynvml), described machines, CUDA ordinals, tables."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

import pytest

from singlecard_nb.pinning import devices
from singlecard_nb.pinning.devices import GpuInfo, Machine, MigInfo, ProcessInfo

MACHINES = Path(__file__).parent / "machines"
FOUR_GPUS = MACHINES / "four_gpus.json"
NO_GPUS = MACHINES / "no_gpus.json"
GIB = 1024**3
NO_SUCH_PID = 2**22 + 17  # above Linux's largest pid_max: never a live process


def four_gpus(environ: dict[str, str] | None = None) -> Machine:
    return Machine.from_dict(json.loads(FOUR_GPUS.read_text()), environ=environ or {})


# --- a fake pynvml ---------------------------------------------------------------------------

class _Memory:
    def __init__(self, total: int, used: int):
        self.total, self.used, self.free = total, used, total - used


class _Proc:
    def __init__(self, pid: int, memory: int | None):
        self.pid, self.usedGpuMemory = pid, memory


class FakeNVML:
    """Just enough of pynvml's surface, driven by a list of GPU dicts."""

    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NOT_FOUND = 6
    NVML_DEVICE_MIG_ENABLE = 1

    class NVMLError(Exception):
        def __init__(self, value: int):
            super().__init__(f"NVML error {value}")
            self.value = value

    def __init__(self, gpus: list[dict], init_error: int | None = None, fail_on: str | None = None):
        self.gpus, self.init_error, self.fail_on = gpus, init_error, fail_on
        self.inits = self.shutdowns = 0

    def nvmlInit(self):
        if self.init_error is not None:
            raise self.NVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self):
        return b"550.54.15"  # older pynvml returns bytes

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        if self.fail_on == "handle":
            raise self.NVMLError(999)
        return ("gpu", i)

    def _spec(self, handle):
        gpu = self.gpus[handle[1]]
        return gpu if handle[0] == "gpu" else gpu["mig"][handle[2]]

    def nvmlDeviceGetUUID(self, handle):
        return self._spec(handle)["uuid"]

    def nvmlDeviceGetName(self, handle):
        return self._spec(handle)["name"]

    def nvmlDeviceGetMemoryInfo(self, handle):
        spec = self._spec(handle)
        return _Memory(spec["total"], spec["used"])

    def nvmlDeviceGetPciInfo(self, handle):
        return type("Pci", (), {"busId": self._spec(handle)["pci"]})()

    def nvmlDeviceGetUtilizationRates(self, handle):
        util = self._spec(handle).get("util")
        if util is None:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return type("Util", (), {"gpu": util})()

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [_Proc(pid, mem) for pid, mem in self._spec(handle).get("procs", [])]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        return [_Proc(pid, mem) for pid, mem in self._spec(handle).get("procs", [])[:1]]

    def nvmlSystemGetProcessName(self, pid):
        if pid == NO_SUCH_PID:
            raise self.NVMLError(self.NVML_ERROR_NOT_FOUND)
        return "/usr/bin/python3"

    def nvmlDeviceGetMigMode(self, handle):
        if "mig" not in self._spec(handle):
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return [self.NVML_DEVICE_MIG_ENABLE, self.NVML_DEVICE_MIG_ENABLE]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index):
        if self._spec(handle)["mig"].get(index) is None:
            raise self.NVMLError(self.NVML_ERROR_NOT_FOUND)
        return ("mig", handle[1], index)


def _fake_gpus() -> list[dict]:
    return [
        {"uuid": "GPU-aaaa", "name": "NVIDIA H100", "pci": "00000000:47:00.0", "total": 80 * GIB,
         "used": 3 * GIB, "util": 41,
         "procs": [(os.getpid(), 2 * GIB), (NO_SUCH_PID, None)]},
        {"uuid": b"GPU-bbbb", "name": b"NVIDIA A100", "pci": "00000000:07:00.0",
         "total": 40 * GIB, "used": GIB, "util": None,
         "mig": {0: {"uuid": "MIG-1111", "name": "NVIDIA A100 MIG 1g.5gb", "total": 5 * GIB,
                     "used": 0},
                 3: {"uuid": "MIG-4444", "name": "NVIDIA A100 MIG 3g.20gb", "total": 20 * GIB,
                     "used": GIB}}},
    ]


# --- NVML ------------------------------------------------------------------------------------

def test_nvml_reader_reads_every_field():
    nvml = FakeNVML(_fake_gpus())
    machine = devices.read_nvml(nvml, environ={})
    assert machine.source == "nvml" and machine.reason is None
    assert machine.driver_version == "550.54.15"
    h100, a100 = machine.gpus
    assert (h100.index, h100.uuid, h100.name) == (0, "GPU-aaaa", "NVIDIA H100")
    assert (h100.memory_total, h100.memory_used, h100.memory_free) == (80 * GIB, 3 * GIB, 77 * GIB)
    assert h100.utilization == 41 and a100.utilization is None  # NotSupported -> None
    assert a100.uuid == "GPU-bbbb" and a100.name == "NVIDIA A100"  # bytes decoded
    # compute + graphics lists are merged by pid
    me = pwd.getpwuid(os.getuid()).pw_name
    assert h100.processes == (
        ProcessInfo(os.getpid(), me, 2 * GIB, "python3"),
        ProcessInfo(NO_SUCH_PID, None, None, None),
    )
    # our own process is not "another" process on the GPU
    assert h100.other_processes() == (ProcessInfo(NO_SUCH_PID, None, None, None),)
    # MIG: empty slots skipped, indices kept
    assert a100.mig == (
        MigInfo(0, "MIG-1111", "NVIDIA A100 MIG 1g.5gb", 5 * GIB, 0),
        MigInfo(3, "MIG-4444", "NVIDIA A100 MIG 3g.20gb", 20 * GIB, GIB),
    )
    assert h100.mig == ()
    # PCI-bus order puts the A100 (bus 07) first
    assert (a100.cuda_ordinal, h100.cuda_ordinal) == (0, 1)
    assert nvml.inits == 1 and nvml.shutdowns == 1


def test_nvml_missing_library_is_a_machine_with_no_gpus():
    nvml = FakeNVML([], init_error=FakeNVML.NVML_ERROR_LIBRARY_NOT_FOUND)
    machine = devices.read_nvml(nvml)
    assert machine.gpus == ()
    assert "not found" in machine.reason
    assert nvml.shutdowns == 0  # never shut down what did not start


def test_nvml_without_gpus_and_with_errors_gives_reasons():
    empty = FakeNVML([])
    assert devices.read_nvml(empty).reason == "NVML reports no GPUs"
    assert empty.shutdowns == 1
    broken = FakeNVML(_fake_gpus(), fail_on="handle")
    machine = devices.read_nvml(broken)
    assert machine.gpus == () and "NVML error while reading GPUs" in machine.reason
    assert broken.shutdowns == 1


def test_real_nvml_never_raises_here():
    machine = devices.read_nvml(environ={})
    assert machine.source == "nvml"
    assert machine.gpus or machine.reason  # no GPU is a normal machine with a reason


# --- described machines ---------------------------------------------------------------------

def test_described_machine_from_environment():
    machine = devices.read_machine({"SINGLECARD_NB_MACHINE": str(FOUR_GPUS)})
    assert machine.source == f"described: {FOUR_GPUS}"
    assert [g.index for g in machine.gpus] == [0, 1, 2, 3]
    busy = machine.by_index(1)
    assert busy.processes[0].user == "alice" and busy.other_processes()
    assert busy.memory_free == busy.memory_total - busy.memory_used  # derived when not given
    assert [m.name for m in machine.by_index(3).mig] == ["1g.10gb", "3g.40gb"]
    assert machine.by_index(3).mig_enabled and not machine.by_index(0).mig_enabled


def test_described_machine_without_gpus_keeps_its_reason():
    machine = devices.read_machine({"SINGLECARD_NB_MACHINE": str(NO_GPUS)})
    assert machine.gpus == () and "not found" in machine.reason


def test_broken_description_becomes_the_reason(tmp_path):
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    machine = devices.read_machine({"SINGLECARD_NB_MACHINE": str(bad_json)})
    assert machine.gpus == () and "could not read SINGLECARD_NB_MACHINE" in machine.reason
    no_uuid = tmp_path / "no_uuid.json"
    no_uuid.write_text(json.dumps({"gpus": [{"index": 0, "name": "x"}]}))
    assert "lacks uuid" in devices.read_machine({"SINGLECARD_NB_MACHINE": str(no_uuid)}).reason
    missing = devices.read_machine({"SINGLECARD_NB_MACHINE": str(tmp_path / "nope.json")})
    assert missing.gpus == () and "nope.json" in missing.reason


def test_use_machine_overrides_and_resets():
    described = four_gpus()
    devices.use_machine(described)
    try:
        seen = devices.read_machine({"SINGLECARD_NB_MACHINE": str(NO_GPUS)})
        assert [g.uuid for g in seen.gpus] == [g.uuid for g in described.gpus]
    finally:
        devices.use_machine(None)
    assert devices.read_machine({"SINGLECARD_NB_MACHINE": str(NO_GPUS)}).gpus == ()


def test_to_dict_round_trips():
    machine = four_gpus()
    assert Machine.from_dict(machine.to_dict(), environ={}) == machine


# --- CUDA ordinals -------------------------------------------------------------------------

def _ordinals(visible: str | None) -> dict[int, int | None]:
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    return {g.index: g.cuda_ordinal for g in four_gpus(env).gpus}


@pytest.mark.parametrize("visible, expected", [
    (None, {0: 0, 1: 1, 2: 2, 3: 3}),
    ("2,0", {0: 1, 1: None, 2: 0, 3: None}),
    ("GPU-8a1b", {0: None, 1: None, 2: 0, 3: None}),  # UUID prefix
    ("GPU-2f6", {0: None, 1: None, 2: None, 3: None}),  # ambiguous prefix ends the list
    ("1,bogus,2", {0: None, 1: 0, 2: None, 3: None}),  # first invalid entry ends the list
    ("1,1", {0: None, 1: None, 2: None, 3: None}),  # a repeated device hides everything
    ("3,9", {0: None, 1: None, 2: None, 3: 0}),
    ("", {0: None, 1: None, 2: None, 3: None}),
    ("MIG-5c3b1a2d-9e8f-5a6b-9c0d-1e2f3a4b5c6d", {0: None, 1: None, 2: None, 3: None}),
])
def test_cuda_ordinals_follow_cuda_visible_devices(visible, expected):
    assert _ordinals(visible) == expected


def test_cuda_ordinals_use_pci_bus_order_not_nvidia_smi_index():
    data = {"gpus": [
        {"index": 0, "uuid": "GPU-a", "name": "x", "pci_bus_id": "00000000:81:00.0"},
        {"index": 1, "uuid": "GPU-b", "name": "x", "pci_bus_id": "00000000:01:00.0"},
    ]}
    machine = Machine.from_dict(data, environ={"CUDA_VISIBLE_DEVICES": "0"})
    assert [g.cuda_ordinal for g in machine.gpus] == [None, 0]


# --- rendering -----------------------------------------------------------------------------

def test_text_and_html_tables_show_every_gpu_process_and_mig_device():
    machine = four_gpus()
    text, page = repr(machine), machine._repr_html_()
    for gpu in machine.gpus:
        assert gpu.uuid in text and gpu.uuid in page
    for needle in ("alice", "MIG 3/1", "3g.40gb", "MIG-5c3c7d8e", "97%", "driver 550.54.15"):
        assert needle in text and needle in page
    assert page.count("<tr>") == 1 + 4 + 2  # header, GPUs, MIG devices


def test_html_escapes_names_and_no_gpu_machine_shows_reason():
    gpu = GpuInfo(0, "GPU-x", "<script>evil</script>", None, GIB, 0, GIB, None, (), (), 0)
    page = Machine((gpu,), None, None, "described")._repr_html_()
    assert "<script>" not in page and "&lt;script&gt;" in page
    empty = Machine((), "NVML library not found", None, "nvml")
    assert "NVML library not found" in repr(empty) and "NVML library not found" in empty._repr_html_()
