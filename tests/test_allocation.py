"""Scheduler allocations: a kernel that starts with CUDA_VISIBLE_DEVICES set (Slurm, Kubernetes
device plugins, a login script) pins only inside it, through the magics of a real shell."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import magic_error, run_fresh_python
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from singlecard_nb.pinning import devices, pinning
from singlecard_nb.pinning.devices import Machine
from singlecard_nb.pinning.report import Status

FOUR_GPUS = Path(__file__).parent / "machines" / "four_gpus.json"

GPU0 = "GPU-2f6d2c1a-3b4c-4d5e-8f90-1a2b3c4d5e6f"
GPU2 = "GPU-8a1b0c9d-7e6f-4a5b-8c7d-6e5f4a3b2c1d"
MIG_SMALL = "MIG-5c3b1a2d-9e8f-5a6b-9c0d-1e2f3a4b5c6d"
MIG_BIG = "MIG-5c3c7d8e-1f2a-5b3c-8d4e-5f6a7b8c9d0e"


@pytest.fixture
def kernel(monkeypatch, shown):
    """Start a kernel: `kernel("2,3")` loads the extension in a shell whose environment has
    CUDA_VISIBLE_DEVICES=2,3 (None: unset), on the described 4-GPU machine."""
    for name in ("SINGLECARD_NB_DEVICE", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        monkeypatch.delenv(name, raising=False)
    devices.use_machine(Machine.from_dict(json.loads(FOUR_GPUS.read_text())))
    shell = InteractiveShell.instance()

    def start(allocation: str | None, device: str | None = None):
        if allocation is not None:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", allocation)
        if device is not None:
            monkeypatch.setenv("SINGLECARD_NB_DEVICE", device)
        shell.run_line_magic("load_ext", "singlecard_nb")
        return shell

    yield start
    if "singlecard_nb" in shell.extension_manager.loaded:
        shell.run_line_magic("unload_ext", "singlecard_nb")
    devices.use_machine(None)


def test_a_gpu_outside_the_allocation_is_refused_and_nothing_changes(kernel, shown):
    ip = kernel("2,3")
    error = magic_error(ip, "%singlecard 0")
    assert isinstance(error, UsageError)
    for words in ("GPU 0", GPU0, "outside this kernel's allocation",
                  "CUDA_VISIBLE_DEVICES='2,3' allows GPU 2, GPU 3", "Nothing was changed",
                  "`%singlecard 0 --force`", "singlecard_nb.pin(0, force=True)"):
        assert words in str(error)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3" and "CUDA_DEVICE_ORDER" not in os.environ
    assert pinning.current() is None and shown == []


def test_force_pins_outside_deliberately_and_off_gives_the_allocation_back(kernel, capsys):
    ip = kernel("2,3")
    assert magic_error(ip, "%singlecard 0 --force") is None
    assert os.environ["CUDA_VISIBLE_DEVICES"] == GPU0
    assert "Forced outside this kernel's allocation" in capsys.readouterr().out
    magic_error(ip, "%singlecard off")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_inside_the_allocation_pins_as_usual(kernel):
    ip = kernel("2,3")
    assert magic_error(ip, "%singlecard 2") is None
    assert os.environ["CUDA_VISIBLE_DEVICES"] == GPU2
    # a re-pin is judged against the allocation, not against the pin's own variable
    assert magic_error(ip, "%singlecard 3") is None and os.environ["CUDA_VISIBLE_DEVICES"] == MIG_BIG
    assert isinstance(magic_error(ip, "%singlecard 0"), UsageError)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == MIG_BIG


def test_auto_chooses_only_inside_the_allocation(kernel, capsys):
    # GPUs 0 and 2 are idle but outside; GPU 1 is busy (alice); GPU 3's MIG devices are idle
    ip = kernel("3,1")
    assert magic_error(ip, "%singlecard auto") is None
    assert os.environ["CUDA_VISIBLE_DEVICES"] == MIG_BIG
    out = capsys.readouterr().out
    assert "auto chose GPU 3" in out and "within the allocation" in out
    assert "GPU 0: outside the allocation" in out


@pytest.mark.parametrize("allocation", ["", "-1"])
def test_an_empty_allocation_means_no_gpu(kernel, allocation):
    ip = kernel(allocation)
    error = magic_error(ip, "%singlecard auto")
    assert isinstance(error, UsageError)
    for words in (f"CUDA_VISIBLE_DEVICES={allocation!r} allows no GPU",
                  "this kernel was given no GPU", "Pin 'cpu'", "--force"):
        assert words in str(error)
    assert isinstance(magic_error(ip, "%singlecard 1"), UsageError)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == allocation and pinning.current() is None
    assert magic_error(ip, "%singlecard cpu") is None and pinning.current().mode == "cpu"


def test_an_allocation_of_uuids(kernel):
    ip = kernel(f"{GPU2}")
    assert "allows GPU 2" in str(magic_error(ip, "%singlecard 1"))
    assert magic_error(ip, "%singlecard GPU-8a1b") is None and os.environ["CUDA_VISIBLE_DEVICES"] == GPU2


def test_an_allocation_of_one_mig_device(kernel):
    ip = kernel(MIG_SMALL)
    # GPU 3's other MIG device has more free memory, but only this one was allocated
    assert magic_error(ip, "%singlecard 3") is None and os.environ["CUDA_VISIBLE_DEVICES"] == MIG_SMALL
    error = magic_error(ip, "%singlecard MIG-5c3c")
    assert "MIG device 3/1" in str(error) and "allows MIG 3/0" in str(error)


def test_options_that_need_a_target(kernel):
    ip = kernel("2,3")
    assert "TARGET only" in str(magic_error(ip, "%singlecard list --force"))


def test_list_marks_gpus_outside_the_allocation_also_while_pinned(kernel, shown):
    ip = kernel("2,3")
    magic_error(ip, "%singlecard list")
    magic_error(ip, "%singlecard 2")
    magic_error(ip, "%singlecard list")
    for machine in shown:
        assert [g.in_allocation for g in machine.gpus] == [False, False, True, True]
        text = repr(machine)
        assert "Allocation: CUDA_VISIBLE_DEVICES='2,3' allows GPU 2, GPU 3" in text
        assert text.count("outside allocation") == 2
    assert [g.cuda_ordinal for g in shown[1].gpus] == [None, None, 0, None]  # the pin's view


def test_status_says_what_the_allocation_allows(kernel, shown):
    ip = kernel("2,3")
    magic_error(ip, "%singlecard 2")
    magic_error(ip, "%singlecard status")
    (status,) = shown
    assert isinstance(status, Status)
    assert status.allocation == "CUDA_VISIBLE_DEVICES='2,3' allows GPU 2, GPU 3"
    assert "allocation" in repr(status) and "allows GPU 2, GPU 3" in status._repr_html_()


def test_singlecard_nb_device_at_kernel_start_follows_the_same_rules(kernel, capsys):
    kernel("2,3", device="0")
    err = capsys.readouterr().err
    assert "SINGLECARD_NB_DEVICE='0' was NOT pinned" in err and "allows GPU 2, GPU 3" in err
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3" and pinning.current() is None


def test_singlecard_nb_device_takes_the_magic_options_to_force_a_gpu(kernel, capsys):
    kernel("2,3", device="0 --force")
    assert "SINGLECARD_NB_DEVICE=0 --force" in capsys.readouterr().out
    assert pinning.current() is not None and os.environ["CUDA_VISIBLE_DEVICES"] == GPU0


def test_a_refused_singlecard_nb_device_says_how_the_variable_forces(kernel, capsys):
    kernel("2,3", device="0")
    assert "SINGLECARD_NB_DEVICE='0 --force'" in capsys.readouterr().err


@pytest.mark.parametrize("value, words", [
    ("0 --forse", "unknown option '--forse'"),
    ("0 1", "2 targets"),
    ("--force", "no TARGET"),
])
def test_a_bad_singlecard_nb_device_line_is_printed_and_nothing_is_pinned(kernel, capsys,
                                                                          value, words):
    ip = kernel("2,3", device=value)
    err = capsys.readouterr().err
    assert f"SINGLECARD_NB_DEVICE={value!r} was NOT pinned" in err and words in err
    assert "--force, --default-device, --no-single-card" in err
    assert pinning.current() is None and os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert "singlecard" in ip.magics_manager.magics["line"]


def test_auto_at_kernel_start_with_no_gpu_allocated(kernel, capsys):
    ip = kernel("", device="auto")
    assert "allows no GPU" in capsys.readouterr().err
    assert "singlecard" in ip.magics_manager.magics["line"] and pinning.current() is None


@pytest.mark.slow
def test_kernel_start_inside_an_allocation_in_a_fresh_process():
    code = """
import json, os
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
ip.run_line_magic("load_ext", "singlecard_nb")
pinned = os.environ.get("CUDA_VISIBLE_DEVICES")
ip.run_line_magic("unload_ext", "singlecard_nb")
print(json.dumps({"pinned": pinned, "after": os.environ.get("CUDA_VISIBLE_DEVICES")}))
"""
    out, printed = run_fresh_python(code, SINGLECARD_NB_MACHINE=str(FOUR_GPUS),
                                    SINGLECARD_NB_DEVICE="auto", CUDA_VISIBLE_DEVICES="1,2")
    assert out == {"pinned": GPU2, "after": "1,2"}
    assert "auto chose GPU 2" in printed and "within the allocation" in printed
