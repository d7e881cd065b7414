"""On a GPU: scn.fit's peak against torch.cuda.max_memory_allocated, mem_peak in the frame, a
real OutOfMemoryError explained (run by scripts/gpu_check.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import singlecard_nb as scn

pytestmark = pytest.mark.gpu


def _model():
    return nn.Sequential(*(nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024))
                           for _ in range(6))).cuda()


def test_fit_peak_within_10_percent_of_max_memory_allocated():
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(2048, 1024, device="cuda")
    plan = scn.fit(model, x, optimizer=opt, device="cuda")
    model(x).sum().backward()  # first step: the optimizer's state
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    model(x).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    real = torch.cuda.max_memory_allocated()
    assert abs(plan.peak - real) <= 0.1 * real, (plan.peak, real)


def test_mem_peak_column_and_real_oom_explained():
    model = _model()
    with scn.inspect(model, memory=True) as insp:
        model(torch.randn(64, 1024, device="cuda")).sum().backward()
    assert (insp.frame()["mem_peak"].dropna() > 0).all()
    free, _ = torch.cuda.mem_get_info()
    with scn.inspect(model, memory=True):
        with pytest.raises(torch.OutOfMemoryError) as info:
            model(torch.randn(int(free // (4096 * 4)) * 2, 1024, device="cuda"))
        text = repr(scn.explain(info.value))
    assert "ran out of GPU memory trying to allocate" in text
    assert "micro-batch of at most" in text
