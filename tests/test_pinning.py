"""Pinning: each target form, auto, cpu, bad input, hard vs soft (too late), status, restore."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import as_torch_build, torch_builds

from singlecard_nb import borrow, session
from singlecard_nb.parallel import single_card as parallel
from singlecard_nb.pinning import devices, pinning, torch_side
from singlecard_nb.pinning import driver as driver_probe
from singlecard_nb.pinning.devices import Machine
from singlecard_nb.pinning.driver import DriverState
from singlecard_nb.pinning.pinning import TargetError

MACHINES = Path(__file__).parent / "machines"
FOUR_GPUS = MACHINES / "four_gpus.json"
NO_GPUS = MACHINES / "no_gpus.json"
ROOT = Path(__file__).parent.parent

NOT_STARTED = DriverState(False, "test: cuInit has not run")
STARTED = DriverState(True, "test: cuInit has run")

GPU0 = "GPU-2f6d2c1a-3b4c-4d5e-8f90-1a2b3c4d5e6f"
GPU1 = "GPU-2f6e9b7d-1c2d-4e3f-9a0b-c1d2e3f4a5b6"
GPU2 = "GPU-8a1b0c9d-7e6f-4a5b-8c7d-6e5f4a3b2c1d"
MIG_SMALL = "MIG-5c3b1a2d-9e8f-5a6b-9c0d-1e2f3a4b5c6d"
MIG_BIG = "MIG-5c3c7d8e-1f2a-5b3c-8d4e-5f6a7b8c9d0e"


def load(path: Path) -> Machine:
    return Machine.from_dict(json.loads(path.read_text()))


@pytest.fixture(autouse=True)
def described_machine():
    """Every test sees the 4-GPU machine and leaves nothing pinned behind."""
    devices.use_machine(load(FOUR_GPUS))
    yield
    session.release()
    devices.use_machine(None)


@pytest.fixture
def env() -> dict[str, str]:
    return {"HOME": "/home/me", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}


def pin(target, env, **kwargs):
    kwargs.setdefault("driver", NOT_STARTED)
    kwargs.setdefault("single_card", False)
    return session.pin(target, environ=env, **kwargs)


# --- hard pins: every target form ------------------------------------------------------------

@pytest.mark.parametrize("target, uuid, index", [
    (1, GPU1, 1),
    ("1", GPU1, 1),
    (" 2 ", GPU2, 2),
    (GPU2, GPU2, 2),
    ("GPU-8a1b", GPU2, 2),  # unique prefix
    ("8A1B0C9D", GPU2, 2),  # without GPU-, any case
    (MIG_SMALL, MIG_SMALL, 3),  # MIG UUID
    ("5c3b", MIG_SMALL, 3),  # MIG prefix without MIG-
    ("3", MIG_BIG, 3),  # a GPU in MIG mode: its MIG device with the most free memory
    ("GPU-c3d4", MIG_BIG, 3),
])
def test_hard_pin_hides_other_gpus_behind_the_uuid(env, target, uuid, index):
    state = pin(target, env)
    assert env["CUDA_VISIBLE_DEVICES"] == uuid
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert (state.mode, state.hard, state.uuid, state.gpu.index) == ("hard", True, uuid, index)
    assert state.torch_device == torch.device("cuda", 0)
    assert pinning.device() == torch.device("cuda", 0)
    assert pinning.current() is state
    assert "sees only this device, as cuda:0" in state.reason


def test_mig_parent_pin_says_which_mig_device_and_why(env):
    state = pin(3, env)
    assert state.mig.uuid == MIG_BIG
    assert "MIG mode" in state.reason and MIG_BIG in state.reason


def test_pin_on_a_busy_gpu_says_who_else_uses_it(env):
    assert "busy with pid 4190001 alice python" in pin(1, env).reason


def test_release_restores_the_environment_exactly(env):
    env["CUDA_VISIBLE_DEVICES"] = "0,1"
    before = dict(env)
    pin(3, env, force=True)  # outside the allocation: only when forced
    assert env != before
    session.release()
    assert env == before
    assert pinning.current() is None
    session.release()  # twice is harmless
    assert env == before


def test_release_removes_variables_that_did_not_exist(env):
    del env["CUDA_DEVICE_ORDER"]
    pin(0, env)
    session.release()
    assert env == {"HOME": "/home/me"}


def test_pinning_again_replaces_the_previous_pin(env):
    before = dict(env)
    pin(0, env)
    state = pin(2, env)
    assert env["CUDA_VISIBLE_DEVICES"] == GPU2
    assert state.env_before == {"CUDA_VISIBLE_DEVICES": None, "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    assert [o.name for o in borrow.active_owners()].count("singlecard pin: environment") == 1
    session.release()
    assert env == before


def test_cpu_hides_every_gpu(env):
    state = pin("CPU", env)
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert (state.mode, state.hard, state.gpu) == ("cpu", True, None)
    assert pinning.device() == torch.device("cpu")


# --- auto ----------------------------------------------------------------------------------

def test_auto_skips_busy_and_mig_gpus_and_says_why(env):
    state = pin("auto", env)
    # GPU 1 has more free memory but alice's process runs there; GPU 3 is in MIG mode
    assert state.gpu.index == 2 and env["CUDA_VISIBLE_DEVICES"] == GPU2
    assert "auto chose GPU 2" in state.reason and "most free memory" in state.reason
    assert "GPU 1: busy with pid 4190001 alice" in state.reason
    assert "GPU 3: in MIG mode" in state.reason


def test_auto_respects_an_existing_cuda_visible_devices(env):
    env["CUDA_VISIBLE_DEVICES"] = "0,1"
    state = pin("auto", env)
    assert state.gpu.index == 0
    assert "GPU 2: outside the allocation" in state.reason
    assert "within the allocation" in state.reason


def test_auto_after_a_pin_resolves_against_the_original_environment(env):
    pin(0, env)  # CUDA_VISIBLE_DEVICES now names GPU 0 only
    assert pin("auto", env).gpu.index == 2


def test_auto_when_every_gpu_is_busy_picks_the_most_free_and_says_so(env):
    data = json.loads(FOUR_GPUS.read_text())
    data["gpus"] = data["gpus"][:3]
    for gpu in data["gpus"]:
        gpu["processes"] = [{"pid": 4190002, "user": "bob"}]
    state = pin("auto", env, machine=Machine.from_dict(data))
    assert state.gpu.index == 1 and "every GPU is busy" in state.reason


def test_auto_choice_matches_pin_auto(env):
    assert pinning.auto_choice().uuid == pin("auto", env).uuid == GPU2


# --- bad input changes nothing --------------------------------------------------------------

@pytest.mark.parametrize("bad, words", [
    (7, ["index 7", "accepted", "0, 1, 2, 3"]),
    ("9", ["index 9", "accepted"]),
    (-1, ["-1"]),
    (True, ["True"]),
    (1.5, ["1.5"]),
    (None, ["None"]),
    (["0"], ["['0']"]),
    ("0 1", ["'0 1'", "more than one device"]),
    ("0,2", ["'0,2'", "more than one device"]),
    ("", ["empty"]),
    ("GPU-2f6", ["'GPU-2f6' is ambiguous", GPU0, GPU1]),
    ("MIG-5c3", ["ambiguous", MIG_SMALL, MIG_BIG]),
    ("GPU-ffff", ["'GPU-ffff'", "accepted"]),
    ("banana", ["'banana'", "accepted", "'auto'", "'cpu'"]),
])
def test_bad_targets_raise_and_change_nothing(env, bad, words):
    pinned = pin(0, env)
    before = dict(env)
    with pytest.raises(TargetError) as caught:
        pin(bad, env)
    for word in words:
        assert word in str(caught.value)
    assert env == before and pinning.current() is pinned


@pytest.mark.parametrize("target", [0, "auto", "GPU-2f6d"])
def test_gpu_targets_on_a_machine_without_gpus(env, target):
    before = dict(env)
    with pytest.raises(TargetError, match=r"has none.*NVML library.*accepted here: 'cpu'"):
        pin(target, env, machine=load(NO_GPUS))
    assert env == before and pinning.current() is None
    assert pin("cpu", env, machine=load(NO_GPUS)).mode == "cpu"


# --- too late: the driver already started --------------------------------------------------

@pytest.fixture
def torch_sees_four_gpus(monkeypatch):
    """Stand in for a CUDA torch whose driver started with all four GPUs (in PCI order)."""
    selected = []
    ordinals = {GPU0: 0, GPU1: 1, GPU2: 2}
    monkeypatch.setattr(torch_side, "torch_ordinal_for_uuid", ordinals.get)

    def select(ordinal, owner):
        selected.append(ordinal)
        owner.on_restore(lambda: selected.append(("restored", ordinal)), "current device")

    monkeypatch.setattr(torch_side, "select_current_device", select)
    return selected


def test_too_late_gives_an_honest_soft_pin(env, torch_sees_four_gpus):
    before = dict(env)
    state = pin(2, env, driver=STARTED)
    assert (state.mode, state.hard) == ("soft", False)
    assert state.torch_device == torch.device("cuda", 2)
    assert torch_sees_four_gpus == [2]
    assert env == before  # nothing pretends to hide GPUs
    for words in ("SOFT pin", "test: cuInit has run", "other GPUs stay visible",
                  "restart the kernel and run `%singlecard 2`", "SINGLECARD_NB_DEVICE=2"):
        assert words in state.reason
    assert state.summary().startswith("Pinned (SOFT)") and "(hard)" not in state.summary()
    session.release()
    assert torch_sees_four_gpus == [2, ("restored", 2)]


def test_soft_status_says_soft(env, torch_sees_four_gpus, monkeypatch):
    monkeypatch.setattr(driver_probe, "driver_state", lambda: STARTED)
    pin(GPU1, env, driver=None)  # asks the (patched) probe
    status = session.status()
    assert status.mode == "soft" and status.driver_started and not status.hard
    assert "SOFT" in repr(status) and "stay visible" in repr(status)


def test_too_late_for_a_gpu_torch_cannot_see(env, torch_sees_four_gpus):
    before = dict(env)
    with pytest.raises(TargetError, match="not visible to torch in this process.*restart"):
        pin(MIG_BIG, env, driver=STARTED)
    assert env == before and pinning.current() is None and torch_sees_four_gpus == []


@pytest.mark.torch_build
@torch_builds
def test_too_late_with_a_torch_without_cuda_fails_clearly(env, monkeypatch, cuda_built):
    # Depends on how torch was built. A CPU-only torch cannot have started the driver itself:
    # the pin refuses, saying the build lacks CUDA. A CUDA build that sees none of the described
    # GPUs (this GPU-less machine) refuses as "not visible". Neither crashes or claims a pin.
    # None checks the torch installed here; False/True stand in for the other build. No test
    # here asks torch to count real GPUs: that would start CUDA in the test process.
    cuda_built = as_torch_build(monkeypatch, cuda_built)
    before = dict(env)
    refusal = "not visible to torch in this process.*restart" if cuda_built else "built without CUDA"
    with pytest.raises(TargetError, match=refusal):
        pin(0, env, driver=STARTED)
    assert env == before and pinning.current() is None


def test_too_late_cpu_does_not_claim_to_hide_gpus(env):
    before = dict(env)
    state = pin("cpu", env, driver=STARTED)
    assert (state.mode, state.hard) == ("cpu", False)
    assert env == before and "stay visible" in state.reason


def test_hard_pin_survives_when_cuda_started_afterwards(env):
    pin(1, env)
    pinned_env = dict(env)
    # CUDA started under the pin: this process now has only GPU 1, for good.
    same = pin("1", env, driver=STARTED)
    assert (same.mode, same.hard) == ("hard", True) and env == pinned_env
    with pytest.raises(TargetError, match="hard-pinned to GPU 1.*restart the kernel"):
        pin(2, env, driver=STARTED)
    assert env == pinned_env and pinning.current() is same
    cpu = pin("cpu", env, driver=STARTED)
    assert (cpu.mode, cpu.hard) == ("cpu", False) and env == pinned_env
    session.release()
    assert env == {"HOME": "/home/me", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}


# --- options, single-card mode, unload ------------------------------------------------------

def test_set_default_device_is_restored(env):
    assert torch.get_default_device() == torch.device("cpu")
    had_context = hasattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context")
    pin(0, env, set_default=True)
    try:
        assert torch.get_default_device() == torch.device("cuda", 0)
    finally:
        session.release()
    assert torch.get_default_device() == torch.device("cpu")
    # exactly as before: torch 2.6-2.7's get_default_device() fails on a context left as None
    assert hasattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context") == had_context


def test_single_card_mode_follows_the_pin(env):
    pin(2, env, single_card=True)
    assert session.single_card() and parallel.report()["device"] == "cuda:0"
    session.release()
    assert not session.single_card()
    pin(2, env, single_card=False)
    assert not session.single_card()


def test_restore_all_forgets_the_pin(env):
    before = dict(env)
    pin(0, env, set_default=True, single_card=True)
    borrow.restore_all()
    assert pinning.current() is None and env == before
    assert torch.get_default_device() == torch.device("cpu") and not session.single_card()


@pytest.mark.torch_build
def test_device_when_not_pinned(monkeypatch):
    # Depends on how torch was built: unpinned on a machine with GPUs, `cuda` only where torch
    # has CUDA. is_built() reads how torch was compiled; it does not start CUDA.
    this_torch = "cuda" if torch.backends.cuda.is_built() else "cpu"
    assert pinning.device() == torch.device(this_torch)
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    assert pinning.device() == torch.device("cpu")
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    assert pinning.device() == torch.device("cuda")
    devices.use_machine(load(NO_GPUS))
    assert pinning.device() == torch.device("cpu")


# --- status -------------------------------------------------------------------------------

def test_status_when_not_pinned():
    status = session.status()
    assert status.mode == "none" and status.memory is None
    assert "not pinned" in repr(status) and "not pinned" in status._repr_html_()


def test_status_of_a_hard_pin(env):
    pin(1, env, single_card=True)
    status = session.status()
    assert (status.mode, status.gpu_index, status.gpu_uuid, status.torch_device) == (
        "hard", 1, GPU1, "cuda:0")
    assert status.env_before == {"CUDA_VISIBLE_DEVICES": None, "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    assert status.env_after == {"CUDA_VISIBLE_DEVICES": GPU1, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert not status.driver_started  # no libcuda here; a real probe
    assert status.memory == {"total": 80 * 1024**3, "used": 104857600,
                             "free": 80 * 1024**3 - 104857600}
    assert ("singlecard pin: environment", ["$CUDA_DEVICE_ORDER", "$CUDA_VISIBLE_DEVICES"]) in status.active
    assert status.parallel["enabled"]
    text, page = repr(status), status._repr_html_()
    for needle in (GPU1, "FASTEST_FIRST -> PCI_BUS_ID", "(unset) -> " + GPU1, "not started",
                   "0.1 / 80.0 GiB used", "$CUDA_VISIBLE_DEVICES", "single-card mode"):
        assert needle in text and needle.replace(">", "&gt;").replace("$", "&#36;") in page


def test_status_of_a_mig_pin_reports_the_mig_memory(env):
    pin(MIG_SMALL, env)
    status = session.status()
    assert status.mig_uuid == MIG_SMALL and status.memory["total"] == 10 * 1024**3


# --- the driver probe -------------------------------------------------------------------------

class FakeLibcuda:
    def __init__(self, code: int, count: int = 0):
        self.code, self.count, self.calls = code, count, []

    def cuDeviceGetCount(self, pointer):
        self.calls.append("cuDeviceGetCount")
        ctypes.cast(pointer, ctypes.POINTER(ctypes.c_int))[0] = self.count
        return self.code

    def cuInit(self, flags):  # the probe must never call this
        self.calls.append("cuInit")
        return 0


@pytest.mark.parametrize("code, started, words", [
    (3, False, "CUDA_ERROR_NOT_INITIALIZED"),
    (0, True, "2 device(s) visible"),
    (4, True, "error 4"),
])
def test_driver_probe_reads_cu_device_get_count(code, started, words):
    lib = FakeLibcuda(code, count=2)
    state = driver_probe.probe_libcuda(lib)
    assert state.started is started and words in state.how
    assert lib.calls == ["cuDeviceGetCount"]


def test_driver_state_without_libcuda_and_with_torch_initialised(monkeypatch):
    monkeypatch.setattr(driver_probe, "_load_libcuda", lambda: None)
    state = driver_probe.driver_state()
    assert not state.started and "libcuda cannot be loaded" in state.how
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert driver_probe.driver_state() == DriverState(True, "torch.cuda.is_initialized() is True")


# --- fresh processes -----------------------------------------------------------------------

def _run(code: str, **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "SINGLECARD_NB_DEVICE")}
    environ.update(env)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environ, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.torch_build
def test_pin_in_a_fresh_process_on_a_described_machine():
    out = _run("""
        import json, os
        import singlecard_nb
        state = singlecard_nb.pin("auto")
        pinned = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
        status = singlecard_nb.status()
        singlecard_nb.release()
        after = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
        print(json.dumps({"mode": state.mode, "device": str(singlecard_nb.device()),
                          "pinned": pinned, "after": after, "status": status.mode,
                          "pinned_device": str(state.torch_device)}))
    """, SINGLECARD_NB_MACHINE=str(FOUR_GPUS))
    assert out["mode"] == "hard" and out["status"] == "hard" and out["pinned_device"] == "cuda:0"
    assert out["pinned"] == {"CUDA_VISIBLE_DEVICES": GPU2, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert out["after"] == {"CUDA_VISIBLE_DEVICES": None, "CUDA_DEVICE_ORDER": None}
    # depends on how torch was built: unpinned on the described 4-GPU machine, `cuda` only where
    # torch has CUDA
    assert out["device"] == ("cuda" if torch.backends.cuda.is_built() else "cpu")


def test_old_style_mig_uuid(env):
    data = {"gpus": [{"index": 0, "uuid": "GPU-aaaa1111", "name": "A100", "mig": [
        {"index": 0, "uuid": "MIG-GPU-aaaa1111/1/0", "name": "1g.5gb"},
        {"index": 1, "uuid": "MIG-GPU-aaaa1111/2/0", "name": "1g.5gb"}]}]}
    state = pin("MIG-GPU-aaaa1111/2", env, machine=Machine.from_dict(data))
    assert env["CUDA_VISIBLE_DEVICES"] == "MIG-GPU-aaaa1111/2/0" and state.mig.index == 1


# --- real GPU ---------------------------------------------------------------------------------

def _first_gpu() -> tuple[int, str]:
    machine = devices.read_nvml()
    gpu = next(g for g in machine.gpus if not g.mig_enabled)
    return gpu.index, gpu.uuid


@pytest.mark.gpu
def test_hard_pin_on_a_real_gpu_leaves_torch_one_device():
    devices.use_machine(None)
    index, uuid = _first_gpu()
    out = _run(f"""
        import json, torch, singlecard_nb
        state = singlecard_nb.pin({index})
        x = torch.ones(1, device=singlecard_nb.device())
        print(json.dumps({{"mode": state.mode, "count": torch.cuda.device_count(),
                          "uuid": str(torch.cuda.get_device_properties(0).uuid),
                          "on": str(x.device)}}))
    """)
    assert out["mode"] == "hard" and out["count"] == 1 and out["on"] == "cuda:0"
    assert out["uuid"].lower().removeprefix("gpu-") == uuid.lower().removeprefix("gpu-")


@pytest.mark.gpu
def test_too_late_on_a_real_gpu_is_soft_and_selects_the_device():
    devices.use_machine(None)
    index, uuid = _first_gpu()
    out = _run(f"""
        import json, torch, singlecard_nb
        from singlecard_nb.pinning import driver
        torch.cuda.is_available()  # starts the driver while torch stays "not initialised"
        started = driver.driver_state().started
        state = singlecard_nb.pin({index})
        print(json.dumps({{"started": started, "mode": state.mode,
                          "current": torch.cuda.current_device(),
                          "device": str(state.torch_device), "count": torch.cuda.device_count(),
                          "uuid": str(torch.cuda.get_device_properties(state.torch_device).uuid)}}))
    """)
    assert out["started"] and out["mode"] == "soft"
    assert out["device"] == f"cuda:{out['current']}"
    assert out["uuid"].lower().removeprefix("gpu-") == uuid.lower().removeprefix("gpu-")


# --- soft pins through torch itself (no pinning internals replaced) ---------------------------

class FakeCudaTorch:
    """torch.cuda of a started 3-GPU process, faked at torch's own functions: what the real
    pin and single-card mode end up calling. Installed before single-card mode patches any."""

    def __init__(self, monkeypatch, uuids=(GPU0, GPU1, GPU2)):
        self.current, self.uuids = 0, uuids
        monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(self.uuids))
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda ordinal: type("Properties", (), {"uuid": self.uuids[ordinal]}))
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(torch.cuda, "set_device", self.set_device)

    def set_device(self, device):
        self.current = device if isinstance(device, int) else torch.device(device).index


@pytest.mark.parametrize("single_card", [True, False])
def test_a_soft_re_pin_gives_back_the_device_current_before_the_first_pin(env, monkeypatch,
                                                                          single_card):
    cuda = FakeCudaTorch(monkeypatch)
    try:
        first = session.pin(1, environ=env, driver=STARTED, single_card=single_card)
        assert (first.mode, first.torch_device, cuda.current) == ("soft", torch.device("cuda", 1), 1)
        second = session.pin(2, environ=env, driver=STARTED, single_card=single_card)
        assert (second.torch_device, cuda.current) == (torch.device("cuda", 2), 2)
    finally:
        session.release()
    assert cuda.current == 0  # torch's current device before the first pin


def test_a_soft_re_pin_with_the_default_device_sets_the_new_one(env, monkeypatch):
    FakeCudaTorch(monkeypatch)
    try:
        session.pin(1, environ=env, driver=STARTED, set_default=True)
        session.pin(2, environ=env, driver=STARTED, set_default=True)
        assert torch.get_default_device() == torch.device("cuda", 2)
    finally:
        session.release()
    assert torch.get_default_device() == torch.device("cpu")
