"""Inspection on a real GPU: statistics stay on the device and cross to the host once per step."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import singlecard_nb as scn

pytestmark = pytest.mark.gpu


def count_synchronisations(fn) -> int:
    """How many device->host synchronisations `fn` made (torch's sync debug mode warns on each)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def test_one_synchronisation_per_inspected_step():
    model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(8)]).cuda()
    big = nn.Sequential(nn.Linear(256, 4096), nn.GELU()).cuda()
    x = torch.randn(64, 256, device="cuda")
    both = nn.Sequential(model, big)
    with scn.inspect(both) as insp:
        both(x)  # step 0
        # step 1 records everything and moves step 0's statistics to the host
        syncs = count_synchronisations(lambda: both(x))
    assert syncs == 1, f"{syncs} synchronisations for one inspected step"
    df = insp.frame()
    assert set(df.device) == {"cuda:0"} and df["mean"].notna().all()


def test_gpu_statistics_match_torch():
    x = torch.randn(512, 1024, device="cuda") * 2 + 0.5
    x[0, :7] = 0
    model = nn.Sequential(nn.Identity())
    with scn.inspect(model) as insp:
        model(x)
    row = insp.frame().query("module == '0'").iloc[0]
    assert row["mean"] == pytest.approx(x.double().mean().item(), rel=1e-6)
    assert row["std"] == pytest.approx(x.double().std().item(), rel=1e-6)
    assert row["zeros"] == pytest.approx(7 / x.numel())


def test_trap_on_gpu_names_the_module():
    model = nn.Sequential(nn.Linear(4, 4), nn.LogSigmoid(), nn.Linear(4, 4)).cuda()
    with torch.no_grad():
        model[0].weight.fill_(float("nan"))
    with pytest.raises(scn.NonFiniteError) as info:
        with scn.inspect(model, trap=True):
            model(torch.randn(2, 4, device="cuda"))
    assert info.value.module == "0"
