"""Statistics on a real GPU: float64 sums on the device, for small (batched) and large tensors,
the precision cases of issue 9 included, with nothing read before the step ends."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import singlecard_nb as scn

pytestmark = pytest.mark.gpu


def frame_row(x: torch.Tensor, **kwargs):
    model = nn.Sequential(nn.Identity())
    with scn.inspect(model, **kwargs) as insp:
        model(x)
    return insp.frame().query("module == '0' and io == 'output'").iloc[0]


@pytest.mark.parametrize("n", [1000, 300_000])  # batched small tensors, and a large one
@pytest.mark.parametrize("case", ["1e20", "mean 1e4", "bf16 mean 100", "tiny", "constant fp16"])
def test_gpu_statistics_match_float64(n, case):
    torch.manual_seed(0)
    x = {"1e20": lambda: torch.randn(n) * 1e20,
         "mean 1e4": lambda: torch.randn(n) + 1e4,
         "bf16 mean 100": lambda: (torch.randn(n) + 100).bfloat16(),
         "tiny": lambda: torch.randn(n) * 1e-25,
         "constant fp16": lambda: torch.full((n,), 7.1, dtype=torch.float16)}[case]().cuda()
    d = x.double()
    for trap in (False, True):
        row = frame_row(x, trap=trap)
        assert row["mean"] == pytest.approx(d.mean().item(), rel=1e-6, abs=0)
        assert row["std"] == pytest.approx(d.std().item(), rel=1e-6, abs=0)
        assert row["min"] == d.min().item() and row["max"] == d.max().item()
