"""scn.fit where users meet its edges: their hooks never see a fake tensor, their tensors are
never copied, and each input it cannot plan gets one line of fit's own."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn.modules import module as module_globals

import singlecard_nb as scn
from singlecard_nb.sizing.step import FakeStep


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def test_the_users_own_hooks_never_run_on_fake_tensors():
    model = _mlp()
    seen: list = []
    model[0].register_forward_hook(lambda m, i, out: seen.append(out))
    model[2].register_forward_pre_hook(lambda m, i: seen.append(i))
    everywhere = torch.nn.modules.module.register_module_forward_hook(
        lambda m, i, out: seen.append(out))
    try:
        plan = scn.fit(model, torch.ones(2, 4))
    finally:
        everywhere.remove()
    assert seen == [] and plan.peak > 0
    assert not module_globals._global_forward_hooks  # given back, then removed by its handle
    model(torch.ones(1, 4))  # still theirs on the real model
    assert len(seen) == 2 and not any(isinstance(t, FakeTensor) for t in seen)


def test_weight_norms_own_hook_still_runs_on_the_copy():
    model = nn.Sequential(nn.utils.parametrizations.weight_norm(nn.Linear(4, 8)), nn.ReLU(),
                          nn.utils.weight_norm(nn.Linear(8, 2)))
    assert scn.fit(model, torch.ones(2, 4)).peak > 0
    copy = FakeStep(model, None, lambda out: out.sum()).model
    assert len(copy[2]._forward_pre_hooks) == 1  # torch's WeightNorm computes the weight


def test_tensors_kept_as_plain_attributes_are_faked_and_counted_with_the_parameters():
    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, 64)
            self.mask = torch.ones(4096, 64)  # 1 MiB, not a buffer
            self.tables = [torch.zeros(2048, 64)]  # 0.5 MiB, in a list

        def forward(self, x):
            return self.fc(x) * self.mask[: x.shape[0]] + self.tables[0][: x.shape[0]]

    model = Masked()
    step = FakeStep(model, None, lambda out: out.sum())
    assert isinstance(step.model.mask, FakeTensor) and isinstance(step.model.tables[0], FakeTensor)
    assert step.model.mask is not model.mask
    plan = scn.fit(model, torch.ones(4, 64))
    attributes = (4096 + 2048) * 64 * 4
    params = sum(p.numel() * 4 for p in model.parameters())
    assert plan.by_kind["parameters"] == params + attributes
    assert plan.by_kind["activations"] < attributes  # not counted as what the forward made


@pytest.mark.parametrize("call, error, words", [
    (lambda: scn.fit(_mlp(), torch.empty(0, 4)), ValueError, "the batch holds 0 samples"),
    (lambda: scn.fit(lambda x: x, torch.ones(2, 4)), TypeError, "needs an nn.Module, got "
                                                                "function"),
    (lambda: scn.fit((m := _mlp()), torch.ones(2, 4), optimizer=torch.optim.LBFGS(
        m.parameters())), ValueError, "LBFGS.step(closure) runs the model again"),
])
def test_what_fit_cannot_plan_gets_one_line_of_fits_own(call, error, words):
    with pytest.raises(error) as raised:
        call()
    message = str(raised.value)
    assert message.startswith("scn.fit") and words in message and "\n" not in message


def test_a_shape_bug_in_the_step_is_named_at_its_module_without_torchs_log(capfd):
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(7, 2))  # 8 outputs into 7 inputs
    with pytest.raises(RuntimeError) as raised:
        scn.fit(model, torch.ones(2, 4))
    message = str(raised.value)
    assert message.startswith("scn.fit: Sequential's step fails in '1' (Linear(in_features=7")
    assert "called with (2, 8)" in message and "reads values" not in message
    assert "\n" not in message
    assert "failed while attempting to run meta" not in capfd.readouterr().err


def test_inspect_all_never_takes_fits_fake_copy_for_a_model():
    model = _mlp()
    with scn.inspect_all():
        scn.fit(model, torch.ones(2, 4))
        model(torch.ones(2, 4))
    assert {n: i.steps_recorded for n, i in scn.inspectors().items()} == {"Sequential": 1}
