"""Device picker and live inspection view: set widget values, click, check what a user sees."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
from conftest import as_torch_build, torch_builds
from IPython.core.interactiveshell import InteractiveShell
from torch import nn

import singlecard_nb as scn
from singlecard_nb import borrow, session
from singlecard_nb.inspection.views import live
from singlecard_nb.notebook import picker
from singlecard_nb.pinning import devices, pinning

MACHINE_FILE = Path(__file__).with_name("browser_machine.json")
GPU2 = "GPU-c3a85d27-9f10-4e6b-a7d3-2c3d4e5f6a72"
MIG30 = "MIG-5c3b8e21-7a4d-5f0e-9b12-4e5f6a7b8c94"


@pytest.fixture
def machine():
    return devices.Machine.from_dict(json.loads(MACHINE_FILE.read_text()), source="described: test")


@pytest.fixture(autouse=True)
def unpinned():
    before = {k: os.environ.get(k) for k in pinning.ENV_VARS}
    yield
    session.release()
    assert {k: os.environ.get(k) for k in pinning.ENV_VARS} == before


class RecordingShell:
    def __init__(self):
        self.tracebacks = 0

    def showtraceback(self):
        self.tracebacks += 1


# --- picker ---------------------------------------------------------------------------------


def test_picker_lists_gpus_mig_devices_and_the_cpu(machine):
    import ipywidgets

    panel = scn.picker(machine)
    assert isinstance(panel, ipywidgets.Box)
    table = panel.table.value
    assert table.count("class='singlecard-gpu'") == 4
    assert table.count("class='singlecard-mig'") == 2
    for text in ("GPU-2f6d2c1a", "NVIDIA A100-SXM4-80GB", "97%", "1 process: alice",
                 "2 processes: bob, carol", "60.0 / 80.0 GiB", "idle"):
        assert text in table
    values = [value for _, value in panel.choice.options]
    assert values[-1] == "cpu" and MIG30 in values and len(values) == 7
    # auto prefers the idle GPU with the most free memory (GPU 1): marked and preselected
    auto_label = next(label for label, value in panel.choice.options if "★ auto" in label)
    assert auto_label.startswith("GPU 1 ")
    assert panel.choice.value == machine.gpus[1].uuid
    assert "auto chose GPU 1" in table
    assert "Not pinned" in panel.header.value


def test_choosing_a_gpu_and_pressing_pin_sets_cuda_visible_devices(machine):
    panel = picker.picker(machine)
    panel.choice.value = GPU2
    panel.pin_button.click()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == GPU2
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "Pinned (hard)" in panel.status.value and "GPU 2" in panel.status.value
    assert "GPU 2" in panel.header.value and "cuda:0" in panel.header.value  # shows the pin
    assert "● pinned" in panel.table.value
    assert not panel.pin_button.disabled

    panel.choice.value = MIG30
    panel.pin_button.click()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == MIG30

    panel.release_button.click()
    assert "CUDA_VISIBLE_DEVICES" not in os.environ or os.environ["CUDA_VISIBLE_DEVICES"] != MIG30
    assert pinning.current() is None and "Unpinned" in panel.status.value


def test_a_machine_without_gpus_says_why_and_offers_the_cpu():
    panel = picker.picker(devices.Machine.from_dict({"gpus": [], "reason": "NVML library not found"}))
    assert "No GPUs: NVML library not found" in panel.table.value
    assert [value for _, value in panel.choice.options] == ["cpu"]
    panel.pin_button.click()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    assert "Pinned to CPU" in panel.status.value


def test_gpus_outside_the_allocation_are_marked_and_not_offered(machine, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # what a scheduler gave this kernel
    panel = picker.picker(machine)
    gpu0, gpu1 = machine.gpus[0].uuid, machine.gpus[1].uuid
    values = [value for _, value in panel.choice.options]
    assert gpu0 not in values and gpu1 not in values and GPU2 in values and "cpu" in values
    assert panel.table.value.count("outside allocation") == 2
    assert "Allocation: CUDA_VISIBLE_DEVICES=&#x27;2,3&#x27; allows GPU 2, GPU 3" in panel.header.value
    # auto is GPU 3's MIG device: GPU 2 is busy (bob, carol), GPU 1 is idle but outside
    assert panel.choice.value == MIG30 and "within the allocation" in panel.table.value
    assert panel.show_outside.layout.display is None  # the way to offer them is shown

    panel.show_outside.value = True  # deliberately: offer them, marked
    labels = dict((value, label) for label, value in panel.choice.options)
    assert "outside allocation: forced" in labels[gpu1]
    panel.choice.value = gpu1
    panel.pin_button.click()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == gpu1
    assert "Forced outside this kernel" in panel.status.value
    panel.release_button.click()  # before monkeypatch puts the environment back
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_an_empty_allocation_offers_only_the_cpu(machine, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    panel = picker.picker(machine)
    assert [value for _, value in panel.choice.options] == ["cpu"]
    assert "allows no GPU" in panel.table.value and "★" not in panel.table.value
    panel.pin_button.click()
    assert "Pinned to CPU" in panel.status.value
    session.release()  # before monkeypatch puts the environment back


def test_without_an_allocation_nothing_is_marked(machine):
    panel = picker.picker(machine)
    assert "outside allocation" not in panel.table.value
    assert panel.show_outside.layout.display == "none"


@pytest.mark.torch_build
@torch_builds
def test_too_late_shows_the_whole_explanation(machine, monkeypatch, cuda_built):
    from singlecard_nb.pinning import driver

    # Depends on how torch was built (None: the torch installed here; False/True stand in for
    # the other build). torch counts no GPUs, as on this GPU-less machine, without starting CUDA.
    cuda_built = as_torch_build(monkeypatch, cuda_built)
    started = driver.DriverState(True, "cuDeviceGetCount succeeds: cuInit has already run")
    monkeypatch.setattr(driver, "driver_state", lambda: started)
    panel = picker.picker(machine)
    panel.choice.value = "cpu"
    panel.pin_button.click()
    status = panel.status.value
    assert "can no longer take effect" in status and "cuInit has already run" in status
    assert "restart the kernel" in status.lower()
    # a GPU cannot be soft-pinned by a CPU-only torch, nor by a CUDA torch that cannot see it:
    # said, not hidden
    panel.choice.value = GPU2
    panel.pin_button.click()
    refusal = "not visible to torch" if cuda_built else "without CUDA"
    assert "Not pinned:" in panel.status.value and refusal in panel.status.value


def test_errors_in_callbacks_are_shown_and_controls_come_back(machine, monkeypatch):
    shell = RecordingShell()
    panel = picker.Picker(machine=machine, shell=shell)

    def broken(*args, **kwargs):
        raise RuntimeError("NVML went away")

    monkeypatch.setattr(pinning, "pin", broken)
    panel.pin_button.click()
    assert "RuntimeError: NVML went away" in panel.status.value
    assert shell.tracebacks == 1  # the traceback went to the shell's display, inside the panel
    assert not panel.pin_button.disabled and not panel.choice.disabled

    def refused(*args, **kwargs):
        raise pinning.TargetError("GPU 9 does not exist")

    monkeypatch.setattr(pinning, "pin", refused)
    panel.pin_button.click()
    assert "Not pinned: GPU 9 does not exist" in panel.status.value
    assert shell.tracebacks == 1  # a refused target is the user's input: no traceback


def test_refresh_reads_again_and_keeps_the_choice(machine):
    data = json.loads(MACHINE_FILE.read_text())
    reads = []

    def reader():
        reads.append(1)
        if len(reads) > 1:  # GPU 1 got busy meanwhile: auto moves elsewhere
            data["gpus"][1]["processes"] = [{"pid": 1, "user": "dave"}]
        return devices.Machine.from_dict(data)

    panel = picker.Picker(reader=reader)
    panel.choice.value = GPU2
    panel.refresh_button.click()
    assert len(reads) == 2
    assert "1 process: dave" in panel.table.value
    assert panel.choice.value == GPU2
    auto_label = next(label for label, _ in panel.choice.options if "★ auto" in label)
    assert not auto_label.startswith("GPU 1 ")


def test_auto_refresh_stops_on_close_and_on_unload(machine):
    reads = []

    def reader():
        reads.append(time.monotonic())
        return machine

    def refreshing_panel():
        panel = picker.Picker(reader=reader)
        panel.AUTO_REFRESH_S = 0.02
        panel.auto_refresh.value = True
        deadline = time.monotonic() + 5
        start = len(reads)
        while len(reads) < start + 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(reads) >= start + 3, "auto-refresh did not run"
        return panel

    def stays_stopped():
        count = len(reads)
        time.sleep(0.1)
        return len(reads) == count

    panel = refreshing_panel()
    panel.close()
    assert stays_stopped()

    panel = refreshing_panel()
    borrow.restore_all()  # %unload_ext
    assert stays_stopped() and panel.auto_refresh.value is False


def test_the_panel_follows_a_pin_made_in_another_cell(machine):
    shell = InteractiveShell.instance()
    panel = picker.Picker(machine=machine, shell=shell)
    shell.user_ns["session"] = session
    shell.user_ns["machine"] = machine
    shell.run_cell(f"session.pin({GPU2!r}, machine=machine)").raise_error()
    assert "GPU 2" in panel.header.value and "● pinned" in panel.table.value
    callbacks = list(shell.events.callbacks["post_run_cell"])
    panel.close()
    assert len(shell.events.callbacks["post_run_cell"]) == len(callbacks) - 1


def test_live_view_in_a_script_prints_the_final_table(monkeypatch, capsys):
    monkeypatch.setattr(live, "_current_shell", lambda: None)
    model = _model()
    with scn.inspect(model) as insp:
        insp.live()
        for _ in range(3):
            model(torch.randn(5, 8))
    out = capsys.readouterr().out
    assert out.startswith("live inspection · step 2 · 4 modules") and out.count("5×16") == 2


def test_helpers():
    assert picker.short_uuid("GPU-2f6d2c1a-8a1e-4b8e") == "GPU-2f6d2c1a"
    assert "width:50.0%" in picker.memory_bar(40, 80)
    assert live.sparkline([0, 1, 2, float("nan"), float("inf")]) == "▁▅█·!"
    assert live.sparkline([3, 3]) == "▁▁"


# --- live view ------------------------------------------------------------------------------


class FakeHandle:
    display_id = "live-1"

    def __init__(self, bundle):
        self.bundles = [bundle]

    def update(self, bundle, raw=False):
        assert raw
        self.bundles.append(bundle)


@pytest.fixture
def shown(monkeypatch):
    InteractiveShell.instance()  # the view displays only where IPython runs
    handles: list[FakeHandle] = []

    def fake_display(obj, raw=False, display_id=None):
        assert raw and display_id is True, "the live view is one output, updated in place"
        handles.append(FakeHandle(obj))
        return handles[-1]

    monkeypatch.setattr(live, "display", fake_display)
    return handles


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_live_view_updates_one_output_throttled_and_keeps_the_last_state(shown):
    model = _model()
    with scn.inspect(model) as insp:
        live.live_view(insp, max_rate=4.0)
        started = time.perf_counter()
        for step in range(60):
            x = torch.randn(5, 8)
            if step == 55:
                x[0, 0] = float("nan")
            model(x)
            time.sleep(0.005)
        elapsed = time.perf_counter() - started
    (handle,) = shown
    # at most ~4 updates per second of loop, plus the first drawing and the final one
    assert len(handle.bundles) <= 2 + 4 * elapsed + 1
    assert len(handle.bundles) >= 3
    final = handle.bundles[-1]
    assert "step 59" in final["text/html"] and "stopped" in final["text/html"]
    assert "step 59" in final["text/plain"]
    # three modules, and the model's input, whose NaN at step 55 is where it entered
    assert final["text/html"].count("<tr class='singlecard-live-row") == 4
    assert "held NaN ×1 Inf ×0 at step 55 (finite again at step 59)" in final["text/html"]
    assert ">16<" not in final["text/html"] and ">5×16<" in final["text/html"]
    # the NaN of step 55 is gone by step 59, but its history shows in the sparkline ("·")
    assert "·" in final["text/html"]
    assert insp._store.listeners == []  # the listener went away with the inspector


def test_a_draw_slowed_by_a_busy_machine_does_not_freeze_the_live_view(shown, monkeypatch):
    """The back-off counts the kernel's own drawing, not time lost to other processes: a draw
    that waited 0.4 s once (another job on the cores) must not hold the view for 10 s."""
    model = _model()
    slow_once: list[bool] = []
    real_text = live.LiveView._text

    def waiting_text(self, rows=None):
        if slow_once:
            slow_once.pop()
            time.sleep(0.4)  # waiting, as for a core another process holds
        return real_text(self, rows)

    monkeypatch.setattr(live.LiveView, "_text", waiting_text)
    with scn.inspect(model) as insp:
        view = live.live_view(insp, max_rate=4.0)
        slow_once.append(True)  # the first update after the view is shown
        started = time.perf_counter()
        while time.perf_counter() - started < 2.0:
            model(torch.randn(5, 8))
            time.sleep(0.01)
        drawn_while_training = view.renders
    assert not slow_once
    # the first drawing, the slow one, then about 4 a second for 2 s (8); 10 s of back-off,
    # the wait counted as drawing, leaves the first two only
    assert drawn_while_training >= 4, drawn_while_training


def test_live_view_highlights_nan_modules(shown):
    model = _model()
    insp = scn.inspect(model)
    live.live_view(insp)
    model(torch.randn(5, 8))
    with torch.no_grad():
        model[2].weight[0, 0] = float("nan")
    model(torch.randn(5, 8))
    insp.stop()
    final = shown[0].bundles[-1]["text/html"]
    assert "NaN/Inf in 2 module(s)" in final  # layer 2 and the model's own output
    assert "singlecard-live-row scn-t0" in final
    assert final.index("<code>2</code>") < final.index("<code>(root)</code>")


def test_live_view_in_a_shell_draws_the_final_state_when_the_cell_ends(shown):
    shell = InteractiveShell.instance()
    shell.user_ns.update(scn=scn, model=_model(), torch=torch)
    before = list(shell.events.callbacks["post_run_cell"])
    result = shell.run_cell(
        "insp = scn.inspect(model)\n"
        "view = insp.live()\n"
        "for _ in range(30):\n"
        "    model(torch.randn(5, 8))\n"
    )
    result.raise_error()
    view = shell.user_ns["view"]
    assert shell.events.callbacks["post_run_cell"][: len(before)] == before
    # still recording across cells: the cell's last step was drawn when the cell ended
    assert "step 29" in shown[0].bundles[-1]["text/html"]
    shell.run_cell("insp.stop()")
    assert shell.events.callbacks["post_run_cell"] == before
    assert "stopped" in shown[0].bundles[-1]["text/html"]
    assert view.renders == len(shown[0].bundles)
