"""GPU discovery: NVML reading (through a fake pynvml), described machines, CUDA ordinals, tables."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

import pytest
from fake_nvml import (
    GPU_IS_LOST,
    LIBRARY_NOT_FOUND,
    NO_PERMISSION,
    NOT_SUPPORTED,
    UNKNOWN,
    FakeNVML,
    NVMLError,
)

from singlecard_nb.pinning import devices
from singlecard_nb.pinning.devices import GpuInfo, Machine, MachineFileError, MigInfo, ProcessInfo

MACHINES = Path(__file__).parent / "machines"
FOUR_GPUS = MACHINES / "four_gpus.json"
NO_GPUS = MACHINES / "no_gpus.json"
GIB = 1024**3
NO_SUCH_PID = 2**22 + 17  # above Linux's largest pid_max: never a live process


def four_gpus(environ: dict[str, str] | None = None) -> Machine:
    return Machine.from_dict(json.loads(FOUR_GPUS.read_text()), environ=environ or {})


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

def _fake(**kwargs) -> FakeNVML:
    return FakeNVML(_fake_gpus(), process_names={os.getpid(): "/usr/bin/python3"}, **kwargs)


def test_nvml_reader_reads_every_field():
    nvml = _fake()
    machine = devices.read_nvml(nvml, environ={})
    assert machine.source == "nvml" and machine.reason is None
    assert machine.driver_version == "550.54.15"
    h100, a100 = machine.gpus
    assert (h100.index, h100.uuid, h100.name) == (0, "GPU-aaaa", "NVIDIA H100")
    assert (h100.memory_total, h100.memory_used, h100.memory_free) == (80 * GIB, 3 * GIB, 77 * GIB)
    assert h100.utilization == 41 and a100.utilization is None  # NotSupported -> None
    assert "NotSupported" in a100.why_unknown("utilization") and h100.unknown == ()
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
    nvml = FakeNVML([], init_error=NVMLError(LIBRARY_NOT_FOUND))
    machine = devices.read_nvml(nvml)
    assert machine.gpus == ()
    assert "not found" in machine.reason
    assert nvml.shutdowns == 0  # never shut down what did not start


@pytest.mark.parametrize("error, words", [
    (OSError("libnvidia-ml.so.1: cannot open shared object file"),
     "the NVML library could not be loaded: libnvidia-ml.so.1: cannot open"),
    (NVMLError(9), "the NVIDIA kernel driver is not loaded"),
    (NVMLError(NO_PERMISSION), "NVML could not start: NVMLError_NoPermission: Insufficient"),
])
def test_nvml_that_cannot_start_is_a_reason_not_a_traceback(error, words):
    machine = devices.read_nvml(FakeNVML([], init_error=error), environ={})
    assert machine.gpus == () and words in machine.reason


def test_nvml_without_gpus_and_without_a_count_gives_reasons():
    empty = FakeNVML([])
    assert devices.read_nvml(empty).reason == "NVML reports no GPUs"
    assert empty.shutdowns == 1
    uncountable = _fake().fail(None, "nvmlDeviceGetCount", UNKNOWN)
    machine = devices.read_nvml(uncountable)
    assert machine.gpus == () and machine.reason == (
        "NVML cannot count the GPUs (nvmlDeviceGetCount: NVMLError_Unknown: Unknown Error)")
    assert uncountable.shutdowns == 1


# --- NVML failing piecemeal: each GPU and each field on its own -------------------------------

def test_a_gpu_that_cannot_be_opened_is_unusable_and_the_rest_stays():
    nvml = _fake().fail(0, "nvmlDeviceGetHandleByIndex", GPU_IS_LOST)
    lost, a100 = devices.read_nvml(nvml, environ={}).gpus
    assert lost.index == 0 and lost.uuid == "" and lost.name == "?"
    assert lost.unusable == ("NVML cannot open it (nvmlDeviceGetHandleByIndex: "
                             "NVMLError_GpuIsLost: GPU is lost)")
    assert a100.unusable is None and a100.uuid == "GPU-bbbb" and len(a100.mig) == 2
    assert nvml.shutdowns == 1


@pytest.mark.parametrize("call, field", [
    ("nvmlDeviceGetMemoryInfo", "memory"),
    ("nvmlDeviceGetUtilizationRates", "utilization"),
    ("nvmlDeviceGetComputeRunningProcesses", "processes"),
    ("nvmlDeviceGetName", "name"),
    ("nvmlDeviceGetMigMode", "mig"),
])
@pytest.mark.parametrize("error, words", [
    (NVMLError(NO_PERMISSION), "NVMLError_NoPermission: Insufficient Permissions"),
    (NVMLError(GPU_IS_LOST), "NVMLError_GpuIsLost: GPU is lost"),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "UnicodeDecodeError"),
])
def test_one_field_failing_on_one_gpu_is_unknown_with_its_reason(call, field, error, words):
    nvml = _fake().fail(1, call, error)
    h100, a100 = devices.read_nvml(nvml, environ={}).gpus
    assert h100.unknown == () or set(dict(h100.unknown)) == {"utilization"}  # untouched
    assert h100.memory_total == 80 * GIB and h100.processes
    reason = a100.why_unknown(field)
    assert reason == f"{call}: {words}" or (reason.startswith(f"{call}: ") and words in reason)
    assert a100.unusable is None and a100.uuid == "GPU-bbbb"  # still pinnable
    if field == "memory":
        assert (a100.memory_total, a100.memory_used, a100.memory_free) == (None, None, None)
    if field == "mig":
        assert a100.mig == ()
    if field == "processes":
        assert not a100.processes_known and a100.other_processes() == ()


def test_a_gpu_whose_uuid_cannot_be_read_is_unusable_with_the_reason():
    nvml = _fake().fail(0, "nvmlDeviceGetUUID", NVMLError(NO_PERMISSION))
    h100, a100 = devices.read_nvml(nvml, environ={}).gpus
    assert h100.uuid == "" and h100.unusable == (
        "its UUID cannot be read (nvmlDeviceGetUUID: NVMLError_NoPermission: "
        "Insufficient Permissions)")
    assert h100.memory_total == 80 * GIB  # what could be read is still shown
    assert a100.unusable is None


def test_mig_devices_fail_on_their_own():
    nvml = _fake().fail("1/0", "nvmlDeviceGetUUID", GPU_IS_LOST)
    nvml.fail("1/3", "nvmlDeviceGetMemoryInfo", NOT_SUPPORTED)
    small, big = devices.read_nvml(nvml, environ={}).gpus[1].mig
    assert small.uuid == "" and "GpuIsLost" in small.unusable
    assert big.uuid == "MIG-4444" and big.memory_total is None and big.memory_free is None
    assert dict(big.unknown) == {
        "memory": "nvmlDeviceGetMemoryInfo: NVMLError_NotSupported: Not Supported"}


def test_an_old_nvidia_ml_py_without_mig_or_process_calls():
    nvml = _fake().remove("nvmlDeviceGetMigMode", "nvmlDeviceGetComputeRunningProcesses",
                          "nvmlDeviceGetGraphicsRunningProcesses")
    h100, a100 = devices.read_nvml(nvml, environ={}).gpus
    for gpu in (h100, a100):
        assert gpu.mig == () and not gpu.processes_known and gpu.unusable is None
        assert "has no nvmlDeviceGetMigMode: it is too old" in gpu.why_unknown("mig")
        assert "pip install -U nvidia-ml-py" in gpu.why_unknown("processes")


def test_graphics_processes_not_supported_is_not_a_problem():
    nvml = _fake().fail(None, "nvmlDeviceGetGraphicsRunningProcesses", NOT_SUPPORTED)
    h100 = devices.read_nvml(nvml, environ={}).gpus[0]
    assert h100.processes_known and len(h100.processes) == 2


def test_problems_are_listed_under_the_table():
    nvml = _fake().fail(0, "nvmlDeviceGetUUID", GPU_IS_LOST)
    nvml.fail(1, "nvmlDeviceGetMemoryInfo", NO_PERMISSION)
    machine = devices.read_nvml(nvml, environ={})
    text, page = repr(machine), machine._repr_html_()
    for needle in ("GPU 0 cannot be pinned: its UUID cannot be read (nvmlDeviceGetUUID: "
                   "NVMLError_GpuIsLost: GPU is lost)",
                   "GPU 1: memory unknown (nvmlDeviceGetMemoryInfo: NVMLError_NoPermission: "
                   "Insufficient Permissions); utilization unknown "
                   "(nvmlDeviceGetUtilizationRates: NVMLError_NotSupported: Not Supported)",
                   "no: unusable", "? / ? GiB"):
        assert needle in text and needle in page


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


def _gpu_entry(**fields) -> dict:
    entry = {"index": 0, "uuid": "GPU-aaaa", "name": "A100", "memory_total": GIB}
    entry.update(fields)
    return {k: v for k, v in entry.items() if v is not _DROP}


_DROP = object()

MALFORMED = [
    ('{"gpus": [1]}', "gpus[0]: expected an object, got 1"),
    ({"gpus": [_gpu_entry(memory_total=None)]},
     "gpus[0].memory_total: expected a whole number ≥ 0, got null"),
    ('{"gpus": [{"index": 0, "uuid": "GPU-a", "name": "x", "memory_total": Infinity}]}',
     "gpus[0].memory_total: expected a whole number ≥ 0, got Infinity"),
    ({"gpus": [_gpu_entry(memory_used=-5)]}, "gpus[0].memory_used: expected a whole number ≥ 0, got -5"),
    ({"gpus": [_gpu_entry(memory_total=1.5)]}, "gpus[0].memory_total: expected a whole number ≥ 0, got 1.5"),
    ({"gpus": [_gpu_entry(processes=[{"user": "alice"}])]},
     "gpus[0].processes[0].pid: missing (expected a whole number ≥ 0)"),
    ({"gpus": [_gpu_entry(mig=[{"name": "1g.10gb"}])]},
     "gpus[0].mig[0].uuid: missing (expected a MIG UUID string)"),
    ({"gpus": [_gpu_entry(name=5)]}, "gpus[0].name: expected a string, got 5"),
    ({"gpus": [_gpu_entry(uuid=["GPU-a"])]}, 'gpus[0].uuid: expected a GPU UUID string, got ["GPU-a"]'),
    ({"gpus": [_gpu_entry(uuid=_DROP)]}, "gpus[0].uuid: missing (expected a GPU UUID string)"),
    ({"gpus": [_gpu_entry(uuid="")]}, "gpus[0].uuid: empty (expected a GPU UUID string;"),
    ({"gpus": [_gpu_entry(index=True)]}, "gpus[0].index: expected a whole number ≥ 0, got true"),
    ({"gpus": [_gpu_entry(utilization=140)]},
     "gpus[0].utilization: expected a whole number ≥ 0 and ≤ 100 or null, got 140"),
    ({"gpus": [_gpu_entry(processes=[{"pid": 1, "user": 7}])]},
     "gpus[0].processes[0].user: expected a string or null, got 7"),
    ({"gpus": [_gpu_entry(memory_totl=5)]}, "gpus[0]: unknown field 'memory_totl'"),
    ({"gpus": [_gpu_entry(), _gpu_entry(uuid="GPU-b")]},
     "gpus[1].index: 0 is already gpus[0]'s index"),
    ({"gpus": {"0": {}}}, "the machine.gpus: expected a list of GPU objects"),
    ("[]", "the machine: expected an object, got []"),
    ('{"gpus": [', "not valid JSON: Expecting value at line 1 column 11"),
]


@pytest.mark.parametrize("content, words", MALFORMED)
def test_a_malformed_machine_file_is_one_line_naming_file_entry_and_field(tmp_path, content, words):
    path = tmp_path / "machine.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(MachineFileError) as caught:
        devices.read_machine({"SINGLECARD_NB_MACHINE": str(path)})
    message = str(caught.value)
    assert message.startswith(f"SINGLECARD_NB_MACHINE={path}: ")
    assert words in message and "\n" not in message
    assert isinstance(caught.value, ValueError)  # magics turn it into a UsageError


def test_a_missing_machine_file_says_so(tmp_path):
    path = tmp_path / "nope.json"
    with pytest.raises(MachineFileError, match=r"nope.json: cannot read the file: No such file"):
        devices.read_machine({"SINGLECARD_NB_MACHINE": str(path)})


def test_comments_and_whole_floats_are_accepted():
    machine = Machine.from_dict({"_comment": "a test box", "gpus": [
        _gpu_entry(memory_total=8.589934592e10, _note="JSON from JavaScript writes floats")]})
    assert machine.gpus[0].memory_total == 80 * GIB


def test_described_unknown_fields_and_unusable_gpus_round_trip():
    data = {"gpus": [
        _gpu_entry(unknown={"memory": "nvmlDeviceGetMemoryInfo: NVMLError_GpuIsLost"},
                   memory_total=_DROP),
        {"index": 1, "name": "?", "unusable": "its UUID cannot be read (NoPermission)"},
    ]}
    machine = Machine.from_dict(data, environ={})
    readable, unusable = machine.gpus
    assert readable.memory_total is None and "GpuIsLost" in readable.why_unknown("memory")
    assert unusable.uuid == "" and unusable.unusable.startswith("its UUID cannot be read")
    assert Machine.from_dict(machine.to_dict(), environ={}) == machine


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


MIG_SMALL = "MIG-5c3b1a2d-9e8f-5a6b-9c0d-1e2f3a4b5c6d"


@pytest.mark.parametrize("visible, gpus_allowed, migs_allowed, words", [
    (None, {0, 1, 2, 3}, {0, 1}, "CUDA_VISIBLE_DEVICES is unset: every GPU is allowed"),
    ("2,3", {2, 3}, {0, 1}, "CUDA_VISIBLE_DEVICES='2,3' allows GPU 2, GPU 3"),
    ("GPU-8a1b,GPU-2f6e", {1, 2}, set(), "allows GPU 1, GPU 2"),  # UUID lists (Kubernetes)
    (MIG_SMALL, {3}, {0}, "allows MIG 3/0"),  # a MIG slice of GPU 3, not the other one
    ("", set(), set(), "CUDA_VISIBLE_DEVICES='' allows no GPU"),
    ("-1", set(), set(), "CUDA_VISIBLE_DEVICES='-1' allows no GPU"),
    ("NoDevFiles", set(), set(), "allows no GPU"),  # what Slurm sets for a job without GPUs
])
def test_the_allocation_is_what_cuda_visible_devices_allows(visible, gpus_allowed, migs_allowed,
                                                           words):
    machine = four_gpus({} if visible is None else {"CUDA_VISIBLE_DEVICES": visible})
    assert {g.index for g in machine.gpus if g.in_allocation} == gpus_allowed
    assert {m.index for m in machine.by_index(3).mig if m.in_allocation} == migs_allowed
    assert machine.allocation == visible and words in machine.allocation_text()


def test_ordinals_and_allocation_can_come_from_different_environments():
    # pinned to GPU 2 (the current environment) inside an allocation of GPUs 1 and 2
    machine = four_gpus().with_ordinals({"CUDA_VISIBLE_DEVICES": "GPU-8a1b"},
                                        allocation_environ={"CUDA_VISIBLE_DEVICES": "1,2"})
    assert [g.cuda_ordinal for g in machine.gpus] == [None, None, 0, None]
    assert [g.in_allocation for g in machine.gpus] == [False, True, True, False]
    text = repr(machine)
    assert "Allocation: CUDA_VISIBLE_DEVICES='1,2' allows GPU 1, GPU 2" in text
    assert text.count("outside allocation") == 4  # GPUs 0 and 3, and GPU 3's two MIG devices


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
