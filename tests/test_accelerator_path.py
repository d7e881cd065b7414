"""The path a GPU's tensors take, run on CPU tensors where there is no GPU (`stats.
CPU_AS_ACCELERATOR`, the kernels off): torch reductions left where they are, small tensors
staged and read together, the step's rows made at its end and moved to the host in one
transfer. It must record what the CPU's own path records: the same rows, the same extremes and
counts, mean and std to ~1e-9, the trap at the same module, a step flushed midway whole."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import singlecard_nb as scn
from singlecard_nb.errors import NonFiniteError
from singlecard_nb.inspection.kernel import native, reductions, stats

EXACT = ["min", "max", "absmax", "nan", "inf", "zeros"]
CLOSE = ["mean", "std"]


class Breaks(nn.Module):
    """Once `on`: +Inf above 0.5, NaN below -0.1 (GELU's outputs reach both)."""

    def __init__(self):
        super().__init__()
        self.on = False

    def forward(self, h):
        if not self.on:
            return h
        h = torch.where(h > 0.5, torch.full((), math.inf), h)
        return torch.where(h < -0.1, torch.full((), math.nan), h)


class Net(nn.Module):
    """Outputs above stats.SMALL_NUMEL (read on the device one by one) and below it (staged)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(64, 256)
        self.act = nn.GELU()
        self.breaks = Breaks()
        self.norm = nn.LayerNorm(256)
        self.head = nn.Linear(256, 8)

    def forward(self, x):
        return self.head(self.norm(self.breaks(self.act(self.inp(x)))))


def train(steps: int = 3, broken_from: int | None = None, **options):
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(96, 64), torch.randn(96, 8)  # 96 × 256: 24 576 values, read on the device
    insp = scn.inspect(model, **options)
    try:
        for step in range(steps):
            model.breaks.on = broken_from is not None and step >= broken_from
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    finally:
        insp.stop()
    return insp.frame()


@pytest.fixture
def accelerator_path(monkeypatch):
    """Turns the path on; returns the tensors read one by one on the "device" so far."""
    read: list[tuple] = []
    add = reductions.DeviceRows.add

    def counted(self, v, n, slot):
        read.append(tuple(v.shape))
        return add(self, v, n, slot)

    def turn_on():
        monkeypatch.setattr(native, "kernels", lambda: {})  # an accelerator's path has none
        monkeypatch.setattr(stats, "CPU_AS_ACCELERATOR", True)
        monkeypatch.setattr(reductions.DeviceRows, "add", counted)
        return read
    return turn_on


def assert_same_rows(cpu, accelerator):
    described = [c for c in cpu.columns if c not in EXACT + CLOSE]
    assert len(cpu) == len(accelerator) > 0
    assert cpu[described].astype(str).equals(accelerator[described].astype(str))
    for column in EXACT:  # NaN where NaN
        got, want = accelerator[column].to_numpy(float), cpu[column].to_numpy(float)
        assert np.array_equal(got, want, equal_nan=True), column
    for column in CLOSE:
        got, want = accelerator[column].to_numpy(float), cpu[column].to_numpy(float)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12, equal_nan=True,
                                   err_msg=column)


@pytest.mark.parametrize("options", [{}, {"grads": True, "params": True}, {"exact_std": True}],
                         ids=["outputs", "grads-params", "exact-std"])
def test_the_accelerator_path_records_what_the_cpu_path_records(accelerator_path, options):
    cpu = train(**options)
    read = accelerator_path()
    accelerator = train(**options)
    assert_same_rows(cpu, accelerator)
    # the large outputs (inp, act, norm: three a step, and their gradients) were read one by
    # one on the "device"; the head's 96 × 8 were staged
    assert read.count((96, 256)) >= 9 and (96, 8) not in read


def test_nan_and_inf_counted_on_the_accelerator_path_as_on_the_cpu(accelerator_path):
    cpu = train(broken_from=1)
    accelerator_path()
    accelerator = train(broken_from=1)
    assert_same_rows(cpu, accelerator)
    broken = accelerator[(accelerator.step == 1) & (accelerator.module == "breaks")].iloc[0]
    assert broken["nan"] > 0 and broken["inf"] > 0 and math.isnan(broken["mean"])


def test_the_trap_names_the_module_on_the_accelerator_path(accelerator_path):
    accelerator_path()
    with pytest.raises(NonFiniteError) as trapped:
        train(broken_from=1, trap=True)
    assert trapped.value.module == "breaks" and trapped.value.step == 1


def test_a_step_flushed_midway_keeps_its_rows_on_the_accelerator_path(accelerator_path):
    # max_rows below a step's rows: the pending step reaches the host in parts, each one
    # transfer, and the ring buffer keeps the last rows, as on the CPU
    cpu = train(grads=True, max_rows=7)
    accelerator_path()
    accelerator = train(grads=True, max_rows=7)
    assert len(accelerator) == 7
    assert_same_rows(cpu, accelerator)
