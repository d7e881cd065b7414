"""The stated precision holds on the torch fallback too (no C compiler, or before the kernel is
built): float32 std of long strided views, values whose float32 squares overflow, and float64
at its largest value, whose step's rows were lost to an OverflowError."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
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


# --- the kernel and the torch fallback give equal tensors equal statistics --------------------
# Ranks of a job may read equal tensors on different paths (one whose kernel cache was cold
# starts with torch): compare_ranks must find them equal (rtol 1e-6; a mean against its std).
@pytest.fixture(scope="module")
def kernels():
    native.start()
    if not native.wait(timeout=180):
        pytest.skip(f"the one-pass kernel could not be built here: {native.status()}")
    return native.kernels()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("shape", [(16,), (64, 64), (128, 128), (4096, 8), (512, 512)])
def test_the_kernel_and_torch_give_the_same_statistics(kernels, dtype, shape):
    if dtype not in kernels:
        pytest.skip(f"no kernel for {dtype} here")
    for seed, (centre, spread) in enumerate([(0.0, 0.02), (0.5, 0.01), (1.0, 1e-3), (-3, 1)]):
        torch.manual_seed(seed)
        t = (torch.randn(shape, dtype=torch.float64) * spread + centre).to(dtype)
        a, b = values(t, kernels), values(t)  # the kernel's, torch's
        assert (a["min"], a["max"], a["absmax"], a["zeros"]) == (
            b["min"], b["max"], b["absmax"], b["zeros"])
        std = max(a["std"], b["std"])
        # compare_ranks' measure: 1e-6 of the larger std (and of |mean|); both paths sum in
        # float64, so they agree far closer (was 2.4e-6 to 5.3e-6 apart for bfloat16)
        assert abs(a["mean"] - b["mean"]) <= 1e-9 * max(std, abs(a["mean"])), (seed, a, b)
        assert abs(a["std"] - b["std"]) <= 1e-9 * std, (seed, a, b)


def test_compare_ranks_finds_equal_parameters_equal_whichever_path_read_them(kernels,
                                                                            monkeypatch):
    def run() -> pd.DataFrame:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 128), nn.Linear(128, 64)).to(torch.bfloat16)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.1).add_(0.5)  # weights away from zero: float32 sums lost digits
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        with scn.inspect(model, params=True) as insp:
            for _ in range(2):
                loss = model(torch.ones(4, 64, dtype=torch.bfloat16)).float().square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        return insp.frame()

    with_kernel = run()
    monkeypatch.setattr(native, "kernels", dict)  # a rank whose kernel is not loaded yet
    with_torch = run()
    frame = pd.concat([with_kernel.assign(rank=0), with_torch.assign(rank=1)],
                      ignore_index=True)
    found = scn.compare_ranks(frame)
    assert found.first is None, found.first
