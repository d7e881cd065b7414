"""NVML as it really fails, through the magics: a fake pynvml (tests/fake_nvml.py) that fails
per GPU and per call, GPUs that vanish between `%singlecard list` and a pin."""

from __future__ import annotations

import os

import pytest
from conftest import magic_error
from fake_nvml import GPU_IS_LOST, NO_PERMISSION, FakeNVML, NVMLError, gpu
from IPython.core.interactiveshell import InteractiveShell

from singlecard_nb.notebook import picker
from singlecard_nb.pinning import devices, pinning

GIB = 1024**3


def three_gpus() -> list[dict]:
    return [gpu("GPU-aaaa0000", used=10 * GIB), gpu("GPU-bbbb1111", used=GIB),
            gpu("GPU-cccc2222", used=5 * GIB)]


@pytest.fixture
def nvml(monkeypatch, shown):
    """The fake NVML every read asks; the extension loaded in a real shell."""
    for name in ("SINGLECARD_NB_DEVICE", "SINGLECARD_NB_MACHINE", "CUDA_VISIBLE_DEVICES",
                 "CUDA_DEVICE_ORDER"):
        monkeypatch.delenv(name, raising=False)
    fake = FakeNVML(three_gpus())
    devices.use_nvml(fake)
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "singlecard_nb")
    fake.shell = shell
    yield fake
    if "singlecard_nb" in shell.extension_manager.loaded:
        shell.run_line_magic("unload_ext", "singlecard_nb")
    devices.use_nvml(None)


def listed(nvml, shown):
    assert magic_error(nvml.shell, "%singlecard list") is None
    return shown[-1]


# --- one GPU, one field -------------------------------------------------------------------------

def test_a_lost_gpu_is_listed_as_unusable_and_the_others_pin(nvml, shown, capsys):
    nvml.fail(0, "nvmlDeviceGetUUID", GPU_IS_LOST)
    nvml.fail(1, "nvmlDeviceGetMemoryInfo", NO_PERMISSION)
    machine = listed(nvml, shown)
    text = repr(machine)
    assert "3 GPU(s)" in text
    assert ("GPU 0 cannot be pinned: its UUID cannot be read (nvmlDeviceGetUUID: "
            "NVMLError_GpuIsLost: GPU is lost)") in text
    assert ("GPU 1: memory unknown (nvmlDeviceGetMemoryInfo: NVMLError_NoPermission: "
            "Insufficient Permissions)") in text
    error = magic_error(nvml.shell, "%singlecard 0")
    assert "GPU 0 cannot be pinned: its UUID cannot be read" in str(error)
    assert pinning.current() is None and "CUDA_VISIBLE_DEVICES" not in os.environ
    assert magic_error(nvml.shell, "%singlecard 1") is None  # memory unknown: still pinnable
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "GPU-bbbb1111"
    magic_error(nvml.shell, "%singlecard status")
    row = next(line for line in repr(shown[-1]).splitlines() if "memory (NVML)" in line)
    assert row.endswith("unknown: nvmlDeviceGetMemoryInfo: NVMLError_NoPermission: "
                        "Insufficient Permissions")


def test_auto_skips_an_unusable_gpu_and_says_so(nvml, capsys):
    nvml.fail(1, "nvmlDeviceGetHandleByIndex", GPU_IS_LOST)
    assert magic_error(nvml.shell, "%singlecard auto") is None
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "GPU-cccc2222"  # GPU 1 had the most free memory
    assert "GPU 1: cannot be pinned (NVML cannot open it" in capsys.readouterr().out


def test_unknown_memory_ranks_below_known_memory_for_auto(nvml):
    nvml.fail(1, "nvmlDeviceGetMemoryInfo", NO_PERMISSION)
    magic_error(nvml.shell, "%singlecard auto")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "GPU-cccc2222"


def test_an_old_nvidia_ml_py_without_mig_and_process_calls(nvml, shown, capsys):
    nvml.remove("nvmlDeviceGetMigMode", "nvmlDeviceGetComputeRunningProcesses",
                "nvmlDeviceGetGraphicsRunningProcesses")
    text = repr(listed(nvml, shown))
    assert "has no nvmlDeviceGetMigMode: it is too old; `pip install -U nvidia-ml-py`" in text
    assert magic_error(nvml.shell, "%singlecard auto") is None
    out = capsys.readouterr().out
    assert "auto chose GPU 1" in out and "NVML cannot say who uses this one" in out


def test_a_name_that_is_not_utf8(nvml, shown):
    nvml.fail(2, "nvmlDeviceGetName",
              UnicodeDecodeError("utf-8", b"NVIDIA \xff", 7, 8, "invalid start byte"))
    machine = listed(nvml, shown)
    assert machine.gpus[2].name == "?" and "UnicodeDecodeError" in repr(machine)
    assert magic_error(nvml.shell, "%singlecard 2") is None
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "GPU-cccc2222"


def test_nvml_that_cannot_load_is_a_machine_without_gpus(nvml, shown):
    nvml.init_error = OSError("libnvidia-ml.so.1: cannot open shared object file")
    machine = listed(nvml, shown)
    assert "No GPUs (nvml): the NVML library could not be loaded: libnvidia-ml.so.1" in repr(machine)
    assert "accepted here: 'cpu'" in str(magic_error(nvml.shell, "%singlecard 0"))
    assert magic_error(nvml.shell, "%singlecard cpu") is None and pinning.current().mode == "cpu"


# --- a GPU vanishes between the listing and the pin -------------------------------------------

def test_an_index_that_now_names_another_card_is_refused(nvml, shown):
    listed(nvml, shown)
    del nvml.gpus[1]  # GPU-bbbb fell off the bus: GPU-cccc is now GPU 1
    error = magic_error(nvml.shell, "%singlecard 1")
    for words in ("the GPUs changed since `%singlecard list` showed GPU 1 as GPU-bbbb1111",
                  "GPU 1 is now GPU 1 (NVIDIA A100-SXM4-80GB, GPU-cccc2222)",
                  "that card is no longer on this machine", "Nothing was changed",
                  "pin by UUID"):
        assert words in str(error)
    assert "CUDA_VISIBLE_DEVICES" not in os.environ and pinning.current() is None
    error = magic_error(nvml.shell, "%singlecard 2")
    assert "there is no GPU 2, and that card is now GPU 1" in str(error)
    assert magic_error(nvml.shell, "%singlecard GPU-cccc") is None  # a UUID never moves
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "GPU-cccc2222"
    listed(nvml, shown)  # a fresh listing: indices mean what it showed
    assert magic_error(nvml.shell, "%singlecard 1") is None


def test_a_gpu_reset_to_an_unreadable_uuid_after_listing(nvml, shown):
    listed(nvml, shown)
    nvml.fail(2, "nvmlDeviceGetUUID", GPU_IS_LOST)
    error = magic_error(nvml.shell, "%singlecard 2")
    assert "GPU 2 is now GPU 2 (NVIDIA A100-SXM4-80GB, UUID unknown)" in str(error)


def test_without_a_listing_an_index_is_read_fresh(nvml):
    del nvml.gpus[0]
    assert magic_error(nvml.shell, "%singlecard 0") is None
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "GPU-bbbb1111"


def test_the_picker_resolves_its_choice_by_uuid_at_pin_time(nvml):
    panel = picker.Picker()
    panel.choice.value = "GPU-cccc2222"  # drawn as GPU 2
    del nvml.gpus[1]  # now it is GPU 1
    panel.pin_button.click()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "GPU-cccc2222"
    assert "GPU 1 (NVIDIA A100-SXM4-80GB, GPU-cccc2222)" in panel.status.value
    panel.close()


def test_the_picker_refuses_a_gpu_that_vanished_and_redraws(nvml):
    panel = picker.Picker()
    panel.choice.value = "GPU-cccc2222"
    del nvml.gpus[2]
    panel.pin_button.click()
    assert pinning.current() is None and "CUDA_VISIBLE_DEVICES" not in os.environ
    status = panel.status.value
    assert "Not pinned: GPU 2 (GPU-cccc2222) is no longer on this machine" in status
    assert "GPU-cccc" not in panel.table.value  # the panel shows the GPUs as they are now
    assert "GPU-cccc2222" not in [value for _, value in panel.choice.options]
    panel.close()


def test_the_picker_never_offers_an_unusable_gpu(nvml):
    nvml.fail(0, "nvmlDeviceGetUUID", NVMLError(NO_PERMISSION))
    panel = picker.Picker()
    assert [value for _, value in panel.choice.options] == ["GPU-bbbb1111", "GPU-cccc2222", "cpu"]
    assert "unusable" in panel.table.value
    assert "GPU 0 cannot be pinned: its UUID cannot be read" in panel.table.value
    panel.close()
