"""`%load_ext singlecard_nb` and `%singlecard`, driven through a real IPython shell."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import run_fresh_python
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from singlecard_nb import borrow, session
from singlecard_nb.notebook import picker, watch
from singlecard_nb.pinning import devices, pinning
from singlecard_nb.pinning.devices import Machine
from singlecard_nb.pinning.report import Status

MACHINES = Path(__file__).parent / "machines"
FOUR_GPUS = MACHINES / "four_gpus.json"
ROOT = Path(__file__).parent.parent

GPU1 = "GPU-2f6e9b7d-1c2d-4e3f-9a0b-c1d2e3f4a5b6"
GPU2 = "GPU-8a1b0c9d-7e6f-4a5b-8c7d-6e5f4a3b2c1d"
MIG_BIG = "MIG-5c3c7d8e-1f2a-5b3c-8d4e-5f6a7b8c9d0e"


@pytest.fixture
def ip(monkeypatch, shown):
    """A shell with the extension loaded on the described 4-GPU machine; unloaded afterwards."""
    monkeypatch.delenv("SINGLECARD_NB_DEVICE", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    devices.use_machine(Machine.from_dict(json.loads(FOUR_GPUS.read_text())))
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "singlecard_nb")
    yield shell
    if "singlecard_nb" in shell.extension_manager.loaded:
        shell.run_line_magic("unload_ext", "singlecard_nb")
    devices.use_machine(None)


def run(shell, line: str):
    result = shell.run_cell(line)
    if result.error_in_exec is not None and not isinstance(result.error_in_exec, UsageError):
        raise result.error_in_exec
    return result


def line_magics(shell) -> dict:
    return shell.magics_manager.magics["line"]


# --- lifecycle ----------------------------------------------------------------------------

def test_load_unload_reload(ip):
    assert "singlecard" in line_magics(ip)
    ip.run_line_magic("unload_ext", "singlecard_nb")
    assert "singlecard" not in line_magics(ip)
    assert "SingleCardMagics" not in ip.magics_manager.registry
    ip.run_line_magic("load_ext", "singlecard_nb")
    ip.run_line_magic("reload_ext", "singlecard_nb")
    assert "singlecard" in line_magics(ip)
    run(ip, "%singlecard 1")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == GPU1


def test_unload_gives_everything_back(ip):
    ip.run_line_magic("unload_ext", "singlecard_nb")
    environ_before, owners_before = dict(os.environ), borrow.active_owners()
    ip.run_line_magic("load_ext", "singlecard_nb")
    run(ip, "%singlecard 2 --default-device")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == GPU2 and session.single_card()
    assert torch.get_default_device() == torch.device("cuda", 0)
    ip.run_line_magic("unload_ext", "singlecard_nb")
    assert dict(os.environ) == environ_before
    assert borrow.active_owners() == owners_before
    assert pinning.current() is None and not session.single_card()
    assert torch.get_default_device() == torch.device("cpu")
    assert "singlecard" not in line_magics(ip)


# --- targets --------------------------------------------------------------------------------

@pytest.mark.parametrize("line, visible", [
    ("%singlecard 1", GPU1),
    ("%singlecard GPU-2f6e", GPU1),
    ("%singlecard 8a1b", GPU2),
    ("%singlecard MIG-5c3c", MIG_BIG),
    ("%singlecard 3", MIG_BIG),
    ("%singlecard auto", GPU2),
    ("%singlecard cpu", ""),
])
def test_each_target_form(ip, capsys, line, visible):
    result = run(ip, line)
    assert result.error_in_exec is None
    assert os.environ["CUDA_VISIBLE_DEVICES"] == visible
    assert "Pinned" in capsys.readouterr().out


def test_options(ip):
    run(ip, "%singlecard 0 --no-single-card")
    assert session.status().single_card is False and not session.single_card()
    assert torch.get_default_device() == torch.device("cpu")
    run(ip, "%singlecard 0 --default-device")
    assert session.single_card() and torch.get_default_device() == torch.device("cuda", 0)
    run(ip, "%singlecard off")
    assert torch.get_default_device() == torch.device("cpu")


@pytest.mark.parametrize("line, words", [
    ("%singlecard 9", ["9", "accepted"]),
    ("%singlecard 0 1", ["'0 1'", "one TARGET"]),
    ("%singlecard bogus", ["'bogus'", "accepted"]),
    ("%singlecard GPU-2f6", ["ambiguous", "GPU-2f6d2c1a", GPU1]),
    ("%singlecard --frobnicate", ["--frobnicate"]),
    ("%singlecard off now", ["'now'"]),
    ("%singlecard status --default-device", ["TARGET only"]),
    ("%singlecard watch sideways", ["'sideways'", "'on' or 'off'"]),
    ("%singlecard single-card maybe", ["'maybe'", "'on' or 'off'"]),
])
def test_bad_input_is_a_usage_error_that_changes_nothing(ip, shown, line, words):
    run(ip, "%singlecard 0")
    state, environ = pinning.current(), dict(os.environ)
    error = run(ip, line).error_in_exec
    assert isinstance(error, UsageError)
    for word in words:
        assert word in str(error)
    assert pinning.current() is state and dict(os.environ) == environ and shown == []


# --- commands -------------------------------------------------------------------------------

def test_status_displays_a_status_object(ip, shown):
    assert run(ip, "%singlecard status").result is None  # nothing kept alive in Out
    run(ip, "%singlecard 1")
    run(ip, "%singlecard")  # no argument: status
    assert [type(s) for s in shown] == [Status, Status]
    assert shown[0].mode == "none"
    assert shown[1].mode == "hard" and shown[1].gpu_uuid == GPU1


def test_list_displays_the_gpu_table(ip, shown):
    run(ip, "%singlecard list")
    (machine,) = shown
    assert isinstance(machine, Machine) and len(machine.gpus) == 4
    assert "alice" in repr(machine)


def test_off_unpins(ip, capsys):
    before = dict(os.environ)
    run(ip, "%singlecard 1")
    run(ip, "%singlecard off")
    assert dict(os.environ) == before and pinning.current() is None
    run(ip, "%singlecard off")
    out = capsys.readouterr().out
    assert "Unpinned" in out and "Nothing was pinned." in out


def test_picker_is_displayed(ip, shown, monkeypatch):
    made = object()
    monkeypatch.setattr(picker, "picker", lambda: made)
    run(ip, "%singlecard picker")
    assert shown == [made]


def test_watch_on_off(ip, monkeypatch):
    calls = []
    monkeypatch.setattr(watch, "start", lambda shell: calls.append(("start", shell)))
    monkeypatch.setattr(watch, "stop", lambda shell: calls.append(("stop", shell)))
    run(ip, "%singlecard watch")
    run(ip, "%singlecard watch on")
    run(ip, "%singlecard watch off")
    assert calls == [("start", ip), ("start", ip), ("stop", ip)]


def test_single_card_switch(ip):
    error = run(ip, "%singlecard single-card on").error_in_exec
    assert isinstance(error, UsageError) and "nothing is pinned" in str(error)
    run(ip, "%singlecard 2 --no-single-card")
    run(ip, "%singlecard single-card on")
    assert session.single_card() and pinning.current() is not None
    run(ip, "%singlecard single-card off")
    assert not session.single_card() and pinning.current() is not None


def test_help_is_real(ip):
    doc = line_magics(ip)["singlecard"].__doc__
    for words in ("%singlecard [--default-device] [--no-single-card] [--force] [--ranks N]",
                  "[--hang-after SECONDS]", "[TARGET ...]", "auto", "'off'", "too late",
                  "--default-device", "docs/ranks.md"):
        assert words in " ".join(doc.split()) or words in doc


# --- pin at kernel start ------------------------------------------------------------------

def test_singlecard_nb_device_pins_at_load(ip, monkeypatch, capsys):
    ip.run_line_magic("unload_ext", "singlecard_nb")
    monkeypatch.setenv("SINGLECARD_NB_DEVICE", "2")
    ip.run_line_magic("load_ext", "singlecard_nb")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == GPU2
    assert "SINGLECARD_NB_DEVICE=2" in capsys.readouterr().out


def test_bad_singlecard_nb_device_does_not_break_loading(ip, monkeypatch, capsys):
    ip.run_line_magic("unload_ext", "singlecard_nb")
    monkeypatch.setenv("SINGLECARD_NB_DEVICE", "nonsense")
    ip.run_line_magic("load_ext", "singlecard_nb")
    assert "singlecard" in line_magics(ip)
    assert pinning.current() is None and "CUDA_VISIBLE_DEVICES" not in os.environ
    err = capsys.readouterr().err
    assert "'nonsense' was NOT pinned" in err and "accepted" in err


def test_kernel_start_pin_in_a_fresh_process():
    code = textwrap.dedent("""
        import json, os
        from IPython.core.interactiveshell import InteractiveShell
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "singlecard_nb")
        pinned = os.environ.get("CUDA_VISIBLE_DEVICES")
        ip.run_line_magic("unload_ext", "singlecard_nb")
        print(json.dumps({"pinned": pinned, "after": os.environ.get("CUDA_VISIBLE_DEVICES")}))
    """)
    out, printed = run_fresh_python(code, SINGLECARD_NB_MACHINE=str(FOUR_GPUS),
                                    SINGLECARD_NB_DEVICE="GPU-2f6e")
    assert out == {"pinned": GPU1, "after": None}
    assert "Pinned (hard): GPU 1" in printed
