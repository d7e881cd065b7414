"""The stated precision holds on the torch fallback too (no C compiler, or before the kernel is
built): float32 std of long strided views, values whose float32 squares overflow, and float64
at its largest value, whose step's rows were lost to an OverflowError."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import singlecard_nb as scn
from singlecard_nb.inspection.kernel import native
from singlecard_nb.inspection.kernel.stats import StepStats

F64_MAX = torch.finfo(torch.float64).max


def values(t: torch.Tensor, kernels=None) -> dict[str, float]:
    stats = StepStats(kernels={} if kernels is None else kernels)  # {}: torch reductions
    slot = stats.add(t, tuple(t.shape))
    return dict(zip(("mean", "std", "min", "max", "absmax", "nan", "inf", "zeros"),
                    stats.table([slot])[0]))


def exact(t: torch.Tensor) -> tuple[float, float]:
    a = t.detach().double().reshape(-1).numpy()
    scale = math.ldexp(1.0, math.frexp(float(np.abs(a).max()))[1] - 1)  # exact, finite
    return float((a / scale).mean() * scale), float((a / scale).std(ddof=1) * scale)


@pytest.mark.parametrize("view", ["every other value", "columns sliced off", "transposed slice"])
def test_float32_std_of_millions_of_strided_values_is_within_the_stated_1e_4(view):
    torch.manual_seed(0)
    base = torch.randn(2000, 4000) + 1.0
    t = {"every other value": base.view(-1)[::2], "columns sliced off": base[:, 1:],
         "transposed slice": base.t()[1:]}[view]
    assert t.numel() >= 4_000_000 and not t.is_contiguous()
    mean, std = exact(t)
    got = values(t)
    assert got["std"] == pytest.approx(std, rel=1e-4)  # was off by 1e-3 to 3e-3
    assert got["mean"] == pytest.approx(mean, abs=1e-5 * std)


@pytest.mark.parametrize("n", [4096, 16384, 200_000])
def test_float32_values_beyond_1e17_get_a_finite_std(n):
    torch.manual_seed(1)
    t = torch.randn(n) * 1.5e17  # squares fit float32, their sum does not
    mean, std = exact(t)
    got = values(t)
    assert got["std"] == pytest.approx(std, rel=1e-4)  # was NaN for small (batched) tensors
    assert got["mean"] == pytest.approx(mean, abs=1e-5 * std)


@pytest.mark.parametrize("contiguous", [True, False])
def test_float64_at_its_largest_value_is_reduced_without_overflow_error(contiguous):
    t = torch.full((2000,), F64_MAX, dtype=torch.float64)
    t[::2] = 1.0e308
    if not contiguous:
        t = t.view(-1, 1).expand(-1, 2)[:, 0]
    mean, std = exact(t)
    got = values(t)  # raised OverflowError (2.0 ** 1024)
    assert got["min"] == 1.0e308 and got["max"] == F64_MAX
    assert got["mean"] == pytest.approx(mean, rel=1e-12)
    assert got["std"] == pytest.approx(std, rel=1e-4)


class Huge(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones((), dtype=torch.float64))

    def forward(self, x):
        return x * self.scale


def test_a_step_with_float64_near_its_largest_value_keeps_its_rows():
    model = Huge()
    x = torch.full((64,), F64_MAX, dtype=torch.float64)
    x[0] = -F64_MAX
    native.start()
    with scn.inspect(model) as insp:
        model(x)
    frame = insp.frame()
    assert insp.errors == []
    out = frame[frame.io == "output"].iloc[0]
    assert out["max"] == F64_MAX and out["min"] == -F64_MAX
    assert math.isfinite(out["mean"]) and out["mean"] == pytest.approx(exact(x)[0], rel=1e-9)
