"""An inspected model saved, loaded, pickled or deep-copied: it works and the copy carries no
hook of ours (pytorch/examples' word_language_model saves `torch.save(model)` each epoch)."""

from __future__ import annotations

import copy
import io
import pickle

import torch
from torch import nn

import singlecard_nb as scn


def users_hook(module, args, output):  # picklable: a module-level function of the user's
    return output


class Lit(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))

    def forward(self, x):
        return self.net(x)

    def training_step(self, x):
        return self(x).sum()


def hook_counts(model: nn.Module) -> list[int]:
    return [len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
            for m in model.modules()]


def saved_and_loaded(model: nn.Module) -> nn.Module:
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def test_torch_save_of_an_inspected_model_works_and_the_loaded_model_has_no_hooks():
    model = Lit()
    model.net[0].register_forward_hook(users_hook)  # the user's own hook is kept
    before = hook_counts(model)
    with scn.inspect(model, grads=True, params=True, inputs=True) as insp:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            model.training_step(torch.ones(2, 3)).backward()
            optimizer.step()
            loaded = saved_and_loaded(model)  # a checkpoint each step
        pickled = pickle.loads(pickle.dumps(model))
    assert hook_counts(loaded) == hook_counts(pickled) == before
    assert "__getstate__" not in vars(loaded) and "training_step" not in vars(loaded)
    assert loaded.net[0]._forward_hooks[next(iter(loaded.net[0]._forward_hooks))] is users_hook
    torch.testing.assert_close(loaded(torch.ones(1, 3)), model(torch.ones(1, 3)))
    assert insp.steps_recorded == 2  # saving changed nothing in the recording
    assert hook_counts(model) == before and "__getstate__" not in vars(model)


def test_a_deep_copy_of_an_inspected_model_carries_no_hook_and_is_not_recorded():
    model = Lit()
    with scn.inspect(model) as insp:
        model(torch.ones(1, 3))
        twin = copy.deepcopy(model)
        twin(torch.ones(1, 3))
    assert hook_counts(twin) == [0] * len(hook_counts(twin))
    assert "__getstate__" not in vars(twin) and "training_step" not in vars(twin)
    assert insp.steps_recorded == 1


def test_under_inspect_all_a_model_saves_and_a_deep_copy_is_still_no_new_model():
    model = Lit()
    with scn.inspect_all():
        model(torch.ones(1, 3))
        loaded = saved_and_loaded(model)
        ema = copy.deepcopy(model)  # an EMA copy: no new model
        ema(torch.ones(1, 3))
        model(torch.ones(1, 3))
    assert list(scn.inspectors()) == ["Lit"]
    assert hook_counts(loaded) == [0] * len(hook_counts(loaded))
    assert scn.inspectors()["Lit"].steps_recorded == 2


# --- a checkpoint loaded back (word_language_model: `model = torch.load(f)` after training) -----
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden, self.head = nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x):
        return self.head(torch.relu(self.hidden(x)))


def trained_and_saved(path, steps: int = 3) -> nn.Module:
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.randn(2, 3)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        torch.save(model, path)  # the best model so far, each step
    return model


def evaluated(model: nn.Module, steps: int = 2) -> None:
    model.eval()
    with torch.no_grad():
        for _ in range(steps):
            model(torch.randn(2, 3))


def test_a_model_loaded_back_after_training_continues_its_records(tmp_path):
    path = tmp_path / "model.pt"
    with scn.inspect_all(params=True) as finder:
        model = trained_and_saved(path)
        model = torch.load(path, weights_only=False)  # the original is dropped here
        evaluated(model)
    assert list(scn.inspectors()) == ["Net"]
    insp = scn.inspectors()["Net"]
    steps = insp.frame().groupby("step")["training"].first()
    assert steps.to_dict() == {0: True, 1: True, 2: True, 3: False, 4: False}
    assert scn.inspector() is insp  # the model called last is the one the user trained
    (note,) = [e for e in finder.errors if "loaded back" in e]
    assert "Net's checkpoint of step 2, loaded back, continues Net's records from step 3" in note
    hooks_left = [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()]
    assert hooks_left == [0, 0, 0]  # and it is given back like any model found


def test_a_model_loaded_back_beside_its_living_original_is_a_second_model(tmp_path):
    path = tmp_path / "model.pt"
    with scn.inspect_all() as finder:
        model = trained_and_saved(path)
        best = torch.load(path, weights_only=False)
        evaluated(best)
        evaluated(model)
    assert list(scn.inspectors()) == ["Net", "Net#2"]
    assert scn.inspectors()["Net"].steps_recorded == 5
    assert scn.inspectors()["Net#2"].steps_recorded == 2
    (note,) = [e for e in finder.errors if "loaded back" in e]
    assert note.startswith("Net#2 is Net's checkpoint of step 2 loaded back: a second model"), note
    assert note.endswith("(Net still lives).")


def test_a_fresh_model_of_the_same_class_after_a_save_is_a_new_model(tmp_path):
    # a sweep: each run saves its model, the next starts from a new initialisation
    with scn.inspect_all() as finder:
        trained_and_saved(tmp_path / "run1.pt")
        trained_and_saved(tmp_path / "run2.pt")
    assert list(scn.inspectors()) == ["Net", "Net#2"]
    assert [insp.steps_recorded for insp in scn.inspectors().values()] == [3, 3]
    assert not any("loaded back" in e for e in finder.errors)


def test_params_says_once_that_no_optimiser_stepped_a_model_trained_by_hand_and_loaded_back(
        tmp_path, recwarn):
    # word_language_model updates its parameters by hand (p.data.add_), then tests its best
    # checkpoint: one inspector from start to end, so one warning
    path = tmp_path / "model.pt"
    with scn.inspect_all(params=True):
        model = Net()
        for _ in range(2):
            model(torch.randn(2, 3)).sum().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(p.grad, alpha=-0.1)
                    p.grad = None
            torch.save(model, path)
        model = torch.load(path, weights_only=False)
        evaluated(model)
    assert list(scn.inspectors()) == ["Net"]
    said = [w for w in recwarn if "no torch.optim optimiser stepped" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in said]
    assert said[0].filename == __file__  # the user's line, not ours


def seeded_run(path) -> None:
    # a sweep's run: evaluate, save the best model (at epoch 0: its initial values), train
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        evaluated(model, steps=1)
        if epoch == 0:
            torch.save(model, path)
        model.train()
        model(torch.randn(2, 3)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()


def test_a_seeded_sweeps_fresh_model_is_a_new_model_though_its_values_match_a_save(tmp_path):
    # the second run's constructor builds the values the first run saved: no unpickle, no
    # checkpoint
    with scn.inspect_all() as finder:
        seeded_run(tmp_path / "run1.pt")
        seeded_run(tmp_path / "run2.pt")
    assert {name: i.steps_recorded for name, i in scn.inspectors().items()} == {
        "Net": 6, "Net#2": 6}
    assert not any("loaded back" in e for e in finder.errors)


def test_a_checkpoint_unpickled_or_copied_continues_and_carries_nothing_of_ours(tmp_path):
    path = tmp_path / "model.pt"
    with scn.inspect_all():
        trained_and_saved(path)
        loaded = torch.load(path, weights_only=False)
        model = copy.deepcopy(loaded)  # a copy of the checkpoint is the checkpoint too
        del loaded
        evaluated(model)
    assert list(scn.inspectors()) == ["Net"]
    assert scn.inspectors()["Net"].steps_recorded == 5
    assert not any(name.startswith("_singlecard") for name in vars(model))


def test_an_ema_copy_saved_and_loaded_back_is_no_checkpoint_of_its_model(tmp_path):
    path = tmp_path / "ema.pt"
    with scn.inspect_all():
        model = Net()
        model(torch.randn(2, 3))
        torch.save(copy.deepcopy(model), path)  # the EMA's checkpoint, not the model's
        del model
        evaluated(torch.load(path, weights_only=False))
    assert list(scn.inspectors()) == ["Net", "Net#2"]
