"""`plan_pin`: the whole decision of a pin on a described machine, made without changing
anything (no owner, no variable, no torch call); `apply` carries out only the plan in force."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from singlecard_nb import borrow, session
from singlecard_nb.parallel import single_card as parallel
from singlecard_nb.pinning import pinning, torch_side
from singlecard_nb.pinning.devices import Machine
from singlecard_nb.pinning.driver import DriverState
from singlecard_nb.pinning.pin_plan import plan_pin
from singlecard_nb.pinning.state import PinState

FOUR_GPUS = Path(__file__).parent / "machines" / "four_gpus.json"
NOT_STARTED = DriverState(False, "test: cuInit has not run")
STARTED = DriverState(True, "test: cuInit has run")
GPU0 = "GPU-2f6d2c1a-3b4c-4d5e-8f90-1a2b3c4d5e6f"
GPU1 = "GPU-2f6e9b7d-1c2d-4e3f-9a0b-c1d2e3f4a5b6"
GPU2 = "GPU-8a1b0c9d-7e6f-4a5b-8c7d-6e5f4a3b2c1d"
MIG_BIG = "MIG-5c3c7d8e-1f2a-5b3c-8d4e-5f6a7b8c9d0e"


@pytest.fixture
def machine() -> Machine:
    return Machine.from_dict(json.loads(FOUR_GPUS.read_text()))


@pytest.fixture
def env() -> dict[str, str]:
    return {"HOME": "/home/me", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}


@pytest.fixture(autouse=True)
def nothing_changes(env):
    """Planning must leave the environment, the owners and the pin exactly as they were."""
    before, owners = dict(env), borrow.active_owners()
    yield
    assert env == before and borrow.active_owners() == owners and pinning.current() is None


def no_torch(uuid: str) -> int | None:
    raise AssertionError("a hard pin must not ask torch anything")


def test_a_hard_pin_plans_the_two_variables(machine, env):
    plan = plan_pin(1, machine, env, NOT_STARTED, torch_ordinal=no_torch)
    assert (plan.mode, plan.hard, plan.uuid, plan.torch_device) == (
        "hard", True, GPU1, torch.device("cuda", 0))
    assert plan.env_changes == (("CUDA_DEVICE_ORDER", "PCI_BUS_ID"), ("CUDA_VISIBLE_DEVICES", GPU1))
    assert plan.env_before == {"CUDA_VISIBLE_DEVICES": None, "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    assert plan.select is None and not plan.keep_env
    assert "busy with pid 4190001 alice python" in plan.reason


def test_too_late_plans_a_soft_pin_on_the_torch_ordinal(machine, env):
    asked = []
    plan = plan_pin("GPU-8a1b", machine, env, STARTED,
                    torch_ordinal=lambda uuid: asked.append(uuid) or 2)
    assert asked == [GPU2]
    assert (plan.mode, plan.hard, plan.select, plan.env_changes) == ("soft", False, 2, ())
    assert plan.torch_device == torch.device("cuda", 2) and "SOFT pin" in plan.reason


def test_too_late_for_a_card_torch_cannot_see_is_refused(machine, env):
    with pytest.raises(pinning.TargetError, match="not visible to torch in this process"):
        plan_pin(MIG_BIG, machine, env, STARTED, torch_ordinal=lambda uuid: None)


@pytest.mark.parametrize("driver, hard, changes", [
    (NOT_STARTED, True, (("CUDA_VISIBLE_DEVICES", ""),)),
    (STARTED, False, ()),
])
def test_cpu_hides_the_gpus_only_before_cuda_starts(machine, env, driver, hard, changes):
    plan = plan_pin("cpu", machine, env, driver, torch_ordinal=no_torch)
    assert (plan.mode, plan.hard, plan.env_changes) == ("cpu", hard, changes)
    assert plan.torch_device == torch.device("cpu")


def test_outside_the_allocation_only_when_forced(machine, env):
    allocated = {**env, "CUDA_VISIBLE_DEVICES": "0,1"}
    with pytest.raises(pinning.TargetError, match="outside this kernel's allocation"):
        plan_pin(2, machine, allocated, NOT_STARTED)
    plan = plan_pin(2, machine, allocated, NOT_STARTED, force=True)
    assert plan.uuid == GPU2 and "Forced outside this kernel's allocation" in plan.reason
    assert allocated == {**env, "CUDA_VISIBLE_DEVICES": "0,1"}


def _hard_pin_of(gpu_index: int, machine: Machine) -> PinState:
    gpu = machine.by_index(gpu_index)
    return PinState(target=str(gpu_index), gpu=gpu, mig=None, torch_device=torch.device("cuda", 0),
                    reason="", hard=True,
                    env_before={"CUDA_VISIBLE_DEVICES": None, "CUDA_DEVICE_ORDER": "FASTEST_FIRST"})


def test_a_re_pin_resolves_against_the_environment_before_the_current_pin(machine, env):
    current = _hard_pin_of(0, machine)
    pinned = {**env, "CUDA_VISIBLE_DEVICES": GPU0, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    plan = plan_pin("auto", machine, pinned, NOT_STARTED, current=current)
    assert plan.uuid == GPU2 and plan.replaces is current
    assert plan.env_before == current.env_before


def test_a_hard_pin_cuda_started_under_is_kept(machine, env):
    current = _hard_pin_of(1, machine)
    pinned = {**env, "CUDA_VISIBLE_DEVICES": GPU1, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    same = plan_pin(1, machine, pinned, STARTED, current=current, torch_ordinal=no_torch)
    assert (same.mode, same.keep_env, same.env_changes) == ("hard", True, ())
    with pytest.raises(pinning.TargetError, match="hard-pinned to GPU 1.*restart the kernel"):
        plan_pin(2, machine, pinned, STARTED, current=current, torch_ordinal=no_torch)


def test_apply_carries_out_only_a_plan_made_against_the_pin_in_force(machine, env):
    plan = plan_pin(2, machine, env, NOT_STARTED)
    state = pinning.apply(plan)
    try:
        assert pinning.current() is state and env["CUDA_VISIBLE_DEVICES"] == GPU2
        with pytest.raises(RuntimeError, match="made against another pin"):
            pinning.apply(plan)  # planned when nothing was pinned
        assert pinning.current() is state
    finally:
        session.release()


def test_own_strips_single_card_patches_but_not_a_wrapper_of_someone_else():
    original = torch.cuda.set_device
    parallel.enable("cpu")
    try:
        assert torch.cuda.set_device is not original
        assert torch_side.own(torch.cuda.set_device) is original
    finally:
        parallel.disable()

    @functools.wraps(original)
    def theirs(device):
        return original(device)

    assert torch_side.own(theirs) is theirs and torch_side.own(original) is original
