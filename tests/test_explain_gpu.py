"""`singlecard_nb.explain` on a real GPU: device mismatches and device-side asserts."""

from __future__ import annotations

import textwrap

import pytest
import torch
from conftest import run_fresh_python
from torch import nn

import singlecard_nb as scn

pytestmark = pytest.mark.gpu


def explained(fn, *args):
    try:
        fn(*args)
    except Exception as e:
        return scn.explain(e)
    pytest.fail("raised nothing")


@pytest.mark.parametrize("layer, x", [
    (lambda: nn.Linear(8, 4), torch.randn(2, 8)),
    (lambda: nn.Conv2d(3, 4, 3), torch.randn(2, 3, 8, 8)),
    (lambda: nn.LSTM(8, 4), torch.randn(5, 2, 8)),
])
def test_model_on_the_gpu_input_on_the_cpu(layer, x):
    model = nn.Sequential(layer()).cuda()
    exp = explained(model, x)
    assert exp.module == "0" and exp.inputs[0][3] == "cpu" and exp.params[0][3] == "cuda:0"
    assert "has its parameters on cuda:0; its input [0] is on cpu" in exp.hint


def test_a_tensor_made_on_the_cpu_inside_forward():
    class Learned(nn.Module):
        def __init__(self):
            super().__init__()
            self.pos = nn.Parameter(torch.zeros(16, 8))

        def forward(self, x):
            index = torch.arange(x.shape[1])  # the bug: on the CPU
            return x + self.pos.index_select(0, index)

    exp = explained(Learned().cuda(), torch.randn(2, 10, 8, device="cuda"))
    assert "all on cuda:0" in exp.hint and "device=x.device" in exp.hint


def test_a_device_side_assert_from_an_embedding_is_explained():
    # the assert leaves the CUDA context unusable: a fresh process, launches made synchronous
    code = textwrap.dedent("""
        import json, torch
        from torch import nn
        import singlecard_nb as scn
        model = nn.Sequential(nn.Embedding(100, 8)).cuda()
        try:
            model(torch.tensor([[1, 2, 150]], device="cuda"))
        except Exception as e:
            exp = scn.explain(e)
            print(json.dumps({"module": exp.module, "hint": exp.hint}))
    """)
    result, _ = run_fresh_python(code, CUDA_LAUNCH_BLOCKING="1")
    assert result["module"] == "0"
    assert "index outside 0..99" in result["hint"] and "restart the kernel" in result["hint"]
