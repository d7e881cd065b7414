"""`inspect_all()`: models found as the code calls them, by the rules the README gives."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_globals

import singlecard_nb as scn
from singlecard_nb import borrow


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))

    def forward(self, z, scale=1.0):
        return self.body(z) * scale


class Critic(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        return self.head(x)


def global_hooks() -> int:
    return (len(module_globals._global_forward_pre_hooks)
            + len(module_globals._global_forward_hooks))


@pytest.fixture(autouse=True)
def nothing_left():
    yield
    left = borrow.active_owners()  # the optimizer step hooks too, once the last inspector stops
    assert global_hooks() == 0 and left == []


def test_each_outermost_model_with_parameters_gets_an_inspector_named_by_class():
    g, d, g2 = Generator(), Critic(), Generator()
    loss = nn.MSELoss()
    with scn.inspect_all() as finder:
        for _ in range(3):
            fake = g(torch.randn(2, 4), scale=torch.tensor(2.0))
            loss(d(fake), torch.ones(2, 1)).backward()
        g.body(torch.randn(1, 4))  # a part of a model called on its own: no new model
        copy.deepcopy(g)(torch.randn(1, 4))  # an EMA copy: no new model
        torch.optim.swa_utils.AveragedModel(d)(torch.randn(1, 4))  # SWA: no new model
        nn.DataParallel(g2)(torch.randn(1, 4))  # a wrapper counts as the model it wraps
    found = scn.inspectors()
    assert list(found) == ["Generator", "Critic", "Generator#2"]
    assert found["Generator"].steps_recorded == 3 and found["Critic"].steps_recorded == 3
    frame = found["Generator"].frame()
    assert set(frame.module) == {"", "body", "body.0", "body.1", "body.2"}
    # step 0 began inside the hook that found the model: its keyword input is recorded too
    inputs = frame[frame.io == "input"]
    assert len(inputs[inputs.step == 0]) == len(inputs[inputs.step == 1]) == 2
    assert set(found["Generator#2"].frame().module) == set(frame.module)  # not "module.body"
    assert not finder.active and not any(i.active for i in found.values())
    assert scn.inspector() is found["Generator#2"]  # the model called most recently


def test_unrecorded_steps_run_without_any_global_hook_and_a_failing_model_is_left_alone():
    seen = []

    class Probe(nn.Module):
        def forward(self, x):
            seen.append(global_hooks())
            return x

    model = nn.Sequential(nn.Linear(3, 3), Probe())
    with scn.inspect_all(every=2):
        for _ in range(4):
            model(torch.randn(1, 3))
        with pytest.raises(RuntimeError, match="mat1 and mat2"):
            model(torch.randn(1, 5))  # the user's own error, as torch raised it
        other = Critic()
        other(torch.randn(1, 4))  # the finder is back after the failed call
    assert seen == [1, 0, 1, 0]  # recorded steps: the inspector's one hook; others: none
    assert list(scn.inspectors()) == ["Sequential", "Critic"]


def test_a_model_found_in_a_lightning_style_step_method_is_that_module_from_that_step():
    class Lit(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Linear(4, 2)

        def training_step(self, batch):
            return self.encoder(batch).sum()

    lit = Lit()
    with scn.inspect_all():
        for _ in range(3):
            lit.training_step(torch.randn(2, 4))
    insp = scn.inspectors()["Lit"]
    assert insp.steps_recorded == 3 and set(insp.frame().module) == {"encoder"}


def test_torch_compile_of_an_inspected_model_records_eagerly_and_stop_gives_it_back():
    model = Generator()
    insp = scn.inspect(model)
    with pytest.warns(UserWarning, match=r"torch.compile\(Generator\) while it is inspected"):
        compiled = torch.compile(model)
    assert compiled.forward == model.__call__  # runs the model eagerly while inspected
    compiled(torch.randn(1, 4))
    assert set(insp.frame().module) == {"", "body", "body.0", "body.1", "body.2"}
    assert any("torch.compile(Generator)" in note for note in insp.notes)
    assert scn.inspector(compiled) is insp
    insp.stop()
    assert compiled.forward != model.__call__  # the compiled code is back


def test_torch_compile_is_torchs_own_again_once_nobody_listens():
    original = torch.compile
    model = Critic()
    with scn.inspect(model):
        assert torch.compile is not original and torch.compile.__wrapped__ is original
    assert torch.compile is original
    with scn.inspect_all():
        assert torch.compile is not original
    assert torch.compile is original


def test_bad_options_are_refused_before_anything_changes():
    with pytest.raises(ValueError, match="every must be a positive integer"):
        scn.inspect_all(every=0)
    with pytest.raises(TypeError, match="colour"):
        scn.inspect_all(colour=True)
    assert global_hooks() == 0


def test_inspectors_stay_readable_after_stop_and_a_new_inspect_all_replaces_the_old():
    first = scn.inspect_all()
    Critic()(torch.randn(1, 4))
    second = scn.inspect_all(grads=True)
    assert not first.active and second.active
    assert scn.inspectors() == {}  # the new one has found nothing yet
    second.stop()
    assert first.inspectors["Critic"].steps_recorded == 1


def test_a_model_the_user_inspects_already_keeps_its_inspector():
    model = Critic()
    mine = scn.inspect(model, every=1)
    with scn.inspect_all(every=5):
        for _ in range(3):
            model(torch.randn(1, 4))
    assert scn.inspectors() == {"Critic": mine}
    assert mine.steps_recorded == 3 and mine.active  # one step per call, still recording
    mine.stop()


def test_a_model_the_user_inspects_after_its_first_call_is_listed_with_its_own_inspector():
    model = Critic()
    with scn.inspect_all():
        model(torch.randn(1, 4))  # found: our inspector records this call
        with pytest.warns(UserWarning, match="replaces the inspector already recording"):
            mine = scn.inspect(model)  # which stops ours
        for _ in range(3):
            model(torch.randn(1, 4))
        assert scn.inspectors() == {"Critic": mine}
    assert mine.active and mine.steps_recorded == 3  # the user's own: never stopped by us
    mine.stop()


def test_module_compile_in_place_after_inspect_records_eagerly_until_stop():
    model = Generator()
    original = nn.Module.compile
    with scn.inspect(model) as insp:
        assert nn.Module.compile is not original
        model.body.compile(backend="eager")  # a part compiled in place, after inspect()
        assert model.body._compiled_call_impl is None  # runs eagerly while inspected
        model(torch.randn(1, 4))
    assert {"body.0", "body.2"} <= set(insp.frame().module)
    assert model.body._compiled_call_impl is not None and nn.Module.compile is original


def test_after_reset_a_model_of_the_last_run_called_again_is_found_again():
    model = Critic()
    with scn.inspect_all() as finder:
        model(torch.randn(1, 4))
        first = finder.inspectors["Critic"]
        finder.reset()  # what %run does before each run
        model(torch.randn(1, 4))
        again = finder.inspectors
    assert list(again) == ["Critic"] and again["Critic"] is not first
    assert again["Critic"].steps_recorded == 1 and not first.active


def test_a_new_module_per_step_stops_being_inspected_past_the_bound(monkeypatch):
    from singlecard_nb.inspection.finding import discovery

    monkeypatch.setattr(discovery, "MAX_MODELS", 3)
    with scn.inspect_all() as finder, pytest.warns(UserWarning, match="more than 3 models"):
        for _ in range(5):
            nn.Linear(2, 2)(torch.randn(1, 2))
    assert list(finder.inspectors) == ["Linear", "Linear#2", "Linear#3"]
