"""The global hook enters and leaves torch's tables safely at any instant: other threads never
see it half-registered, and a Ctrl-C in the middle leaves nothing behind."""

from __future__ import annotations

import threading
from collections import OrderedDict

import pytest
import torch
from torch import nn
from torch.nn.modules import module as torch_module

import singlecard_nb as scn
from singlecard_nb.inspection.recording import global_hook


class _Watching(OrderedDict):
    """torch's table of global forward hooks, noting what a reader would see at each insert."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.unflagged: list[int] = []

    def __setitem__(self, key, value):
        if key not in torch_module._global_forward_hooks_with_kwargs:
            self.unflagged.append(key)  # a module call now would pass the wrong arguments
        super().__setitem__(key, value)


def test_the_hook_never_appears_without_its_with_kwargs_flag(monkeypatch):
    watching = _Watching(torch_module._global_forward_hooks)
    monkeypatch.setattr(torch_module, "_global_forward_hooks", watching)
    monkeypatch.setattr(global_hook, "_GLOBAL_HOOKS", watching)
    model = nn.Sequential(nn.Linear(2, 2))
    with scn.inspect(model) as insp:
        model(torch.ones(1, 2))
    assert not watching.unflagged
    assert len(insp.frame()) > 0


def test_an_uninspected_model_in_another_thread_keeps_working():
    inspected, other = nn.Sequential(nn.Linear(4, 4)), nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    errors: list[BaseException] = []
    stop = threading.Event()

    def train() -> None:
        try:
            while not stop.is_set():
                with scn.inspect(inspected, steps="manual") as insp:  # the hook comes and goes
                    inspected(torch.ones(1, 4))
                    insp.step()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    thread = threading.Thread(target=train)
    thread.start()
    try:
        for _ in range(2000):
            other(torch.ones(1, 4))
    finally:
        stop.set()
        thread.join()
    assert not errors


def test_a_call_that_took_the_hook_table_before_the_hook_left_is_let_be():
    """The interleaving behind the test above: another thread's module call copies torch's
    global hook table, the inspector stops (hook, then its with_kwargs flag, taken away), and
    that call then finds no flag and passes (module, args, output)."""
    model, x = nn.Linear(4, 4), torch.ones(1, 4)
    with scn.inspect(model, steps="manual"):
        taken = dict(torch_module._global_forward_hooks)  # what the other call copied
    late = [hook for hook_id, hook in taken.items()
            if hook_id not in torch_module._global_forward_hooks_with_kwargs]
    assert late  # the inspector's hook, its flag gone
    for hook in late:
        assert hook(model, (x,), model(x)) is None


class _Interrupting(dict):
    def __init__(self, *args):
        super().__init__(*args)
        self.armed = True

    def __setitem__(self, key, value):
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt  # Ctrl-C between the handle and the tables
        super().__setitem__(key, value)


def test_ctrl_c_while_the_hook_is_installed_leaves_no_hook(monkeypatch):
    before = dict(torch_module._global_forward_hooks)
    interrupting = _Interrupting(torch_module._global_forward_hooks_with_kwargs)
    monkeypatch.setattr(torch_module, "_global_forward_hooks_with_kwargs", interrupting)
    monkeypatch.setattr(global_hook, "_GLOBAL_WITH_KWARGS", interrupting)
    model = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(KeyboardInterrupt):
        scn.inspect(model, steps="manual")  # manual steps install the hook at start
    assert dict(torch_module._global_forward_hooks) == before
    insp = scn.inspect(model, steps="manual")
    interrupting.armed = True
    insp._attach.remove_hook()
    with pytest.raises(KeyboardInterrupt):
        insp._attach.install_hook()  # as the next step does
    insp.stop()
    assert dict(torch_module._global_forward_hooks) == before
    model(torch.ones(1, 2))  # and torch calls modules as before


def _newcomer_with(freed_ids: set[int], make):
    others = []  # kept meanwhile: each new module takes memory no other holds
    for _ in range(200):  # CPython hands a freed object's memory to a new one of its size
        newcomer = make()
        if {id(newcomer), *(id(p) for p in newcomer.parameters())} & freed_ids:
            return newcomer
        others.append(newcomer)
    pytest.skip("the interpreter gave the freed ids to no new module")


def test_a_module_made_later_with_a_freed_modules_id_is_not_recorded_as_it():
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    with scn.inspect(model) as insp:
        freed = {id(model[0])}
        model[0] = nn.Identity()  # the inspected Linear is freed
        newcomer = _newcomer_with(freed, lambda: nn.Linear(3, 3))
        model[0] = newcomer
        model(torch.ones(1, 3))
    rows = insp.frame().query("io == 'output'")
    assert "0" not in set(rows["module"])  # not recorded under the freed Linear's path
    assert "1" in set(rows["module"])


def test_starting_a_params_inspector_during_an_optimizer_step_breaks_no_step():
    from torch.optim.optimizer import register_optimizer_step_post_hook

    model = nn.Sequential(nn.Linear(2, 2))
    other = nn.Sequential(nn.Linear(2, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scn.inspect(other, params=True).stop()  # the process's optimiser hook is in place
    started: list = []

    def meanwhile(opt, args, kwargs):  # what another thread may do while torch loops its hooks
        if started:
            started[-1].stop()
        started.append(scn.inspect(other, params=True))

    handle = register_optimizer_step_post_hook(meanwhile)
    try:
        for _ in range(3):
            model(torch.ones(1, 2)).sum().backward()
            optimizer.step()  # torch iterates its global hooks here
    finally:
        handle.remove()
        for insp in started:
            insp.stop()
    assert len(started) == 3


def _optimizer_hooks() -> tuple:
    from torch.optim import optimizer as optim_globals

    return (dict(optim_globals._global_optimizer_pre_hooks),
            dict(optim_globals._global_optimizer_post_hooks),
            torch.optim.Optimizer.__dict__["_optimizer_step_code"])


def _train(model, optimizer, steps=2):
    for _ in range(steps):
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()


def test_stopping_the_last_params_inspector_leaves_nothing_in_torchs_optimizer_hooks():
    before = _optimizer_hooks()
    model = nn.Sequential(nn.Linear(2, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with scn.inspect(model, params=True) as insp:
        _train(model, optimizer)
        assert _optimizer_hooks() != before
    assert _optimizer_hooks() == before
    assert {"param", "update"} <= set(insp.frame()["io"])
    _train(model, optimizer)  # torch steps as before


def test_an_inspector_stopped_inside_an_optimizer_step_leaves_once_the_step_ends():
    from torch.optim.optimizer import register_optimizer_step_post_hook

    before = _optimizer_hooks()
    model = nn.Sequential(nn.Linear(2, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    insp = scn.inspect(model, params=True)
    seen: list = []

    def stop_meanwhile(opt, args, kwargs):  # torch is looping over its tables here
        insp.stop()
        seen.append(_optimizer_hooks() == before)

    handle = register_optimizer_step_post_hook(stop_meanwhile)
    try:
        _train(model, optimizer, steps=1)
    finally:
        handle.remove()
    assert seen == [False]  # not while the step ran
    _train(model, optimizer, steps=1)  # the next step ends it
    assert _optimizer_hooks() == before


def test_a_parameter_made_later_with_a_freed_parameters_id_is_not_recorded_as_it():
    import gc
    import weakref

    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3), nn.Linear(3, 3))
    with scn.inspect(model, params=True) as insp:
        freed = {id(p) for p in model[0].parameters()}
        swapped_out = weakref.ref(model[0])
        model[0] = nn.Identity()
        gc.collect()
        assert swapped_out() is None  # the inspector does not keep a swapped-out module
        model[2] = _newcomer_with(freed, lambda: nn.Linear(3, 3))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()
    rows = insp.frame().query("io == 'param'")
    assert "0" not in set(rows["module"])  # not recorded under the freed Linear's path
    assert "3" in set(rows["module"])


def test_memory_counts_a_module_made_later_with_a_freed_modules_id_where_it_is():
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3))
    with scn.inspect(model, memory=True) as insp:
        freed = {id(model[0])}
        model[0] = nn.Identity()
        model[2] = _newcomer_with(freed, lambda: nn.Linear(3, 3))
        model(torch.ones(1, 3)).sum().backward()
        frame = insp.memory().frame().set_index("module")
    assert "0" not in frame.index or frame.loc["0", "parameters"] == 0
