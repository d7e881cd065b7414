"""An inspector's life: what it keeps alive, and that `active` is what its hooks are."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from torch import nn

import singlecard_nb as scn
from singlecard_nb import borrow


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


@pytest.fixture
def ip():
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "singlecard_nb")
    shell.run_cell("import torch\nfrom torch import nn\n"
                   "model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))\n"
                   "x = torch.randn(3, 4)\n")
    yield shell
    if "singlecard_nb" in shell.extension_manager.loaded:
        shell.run_line_magic("unload_ext", "singlecard_nb")
    assert borrow.active_owners() == []


def run(shell, cell: str):
    result = shell.run_cell(cell)
    assert result.success, result.error_in_exec or result.error_before_exec
    return result


# --- what a stopped inspector keeps alive ---------------------------------------------------

def test_inspect_as_a_cells_last_line_lets_the_model_go_after_off(ip):
    # the last line of a cell: a value it returned would stay in Out
    assert run(ip, "%inspect model").result is None
    run(ip, "y = model(x).detach()")
    model = weakref.ref(ip.user_ns["model"])
    weight = weakref.ref(ip.user_ns["model"][0].weight)
    run(ip, "%inspect off")
    run(ip, "del model")
    gc.collect()
    assert model() is None and weight() is None


def test_a_stopped_inspector_does_not_keep_its_model_and_still_reads_its_records():
    model, x = mlp(), torch.randn(3, 4)
    insp = scn.inspect(model)
    model(x)
    assert insp.model is model  # while active: the model it records
    insp.stop()
    assert insp.model is model  # stopped: still the model while someone keeps it
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None and insp.model is None
    assert len(insp.frame()) > 0 and insp.steps_recorded == 1
    assert "Sequential: stopped" in repr(insp) and "Linear" in repr(insp.summary())
    with pytest.raises(RuntimeError, match="no longer exists"):
        insp.start()


def test_an_active_inspector_keeps_recording_a_model_only_it_holds():
    insp = scn.inspect(mlp())
    gc.collect()
    insp.model(torch.randn(3, 4))
    assert insp.active and insp.steps_recorded + len(insp.frame()) > 0
    insp.stop()


# --- `active` is what the inspector's hooks are ---------------------------------------------

def test_restore_all_stops_an_inspector_which_can_then_start_again_and_record():
    model, x = mlp(), torch.randn(3, 4)
    insp = scn.inspect(model)
    model(x)
    borrow.restore_all()  # what %unload_ext does
    assert not insp.active and "stopped" in repr(insp)
    model(x)
    assert insp.steps_recorded == 1  # no hook is left to record
    insp.start()
    assert insp.active
    model(x)
    insp.stop()
    assert insp.steps_recorded == 2 and sorted(insp.frame().step.unique()) == [0, 1]
    assert borrow.active_owners() == []


def test_unload_ext_stops_an_inspector_which_can_then_start_again_and_record(ip):
    run(ip, "import singlecard_nb as scn\ninsp = scn.inspect(model)\nmodel(x);")
    insp = ip.user_ns["insp"]
    ip.run_line_magic("unload_ext", "singlecard_nb")
    assert not insp.active
    run(ip, "insp.start()\nmodel(x);")
    assert insp.active
    insp.stop()
    assert insp.steps_recorded == 2


def test_unload_ext_stops_what_the_line_magic_started(ip):
    run(ip, "%inspect model\nmodel(x);")
    insp = scn.inspector(ip.user_ns["model"])
    ip.run_line_magic("unload_ext", "singlecard_nb")
    assert not insp.active
    ip.run_line_magic("load_ext", "singlecard_nb")
    run(ip, "%inspect model\nmodel(x);")
    again = scn.inspector(ip.user_ns["model"])
    assert again.active and len(again.frame()) > 0


def test_a_copy_of_an_inspected_model_with_hooks_of_its_own_is_not_recorded():
    import copy

    model, x = mlp(), torch.randn(3, 4)
    model[0].register_forward_hook(lambda module, args, output: output * 2)  # its own hook
    with scn.inspect(model) as insp:
        twin = copy.deepcopy(model)  # what EMA / SWA callbacks do: the hooks are copied too
        model(x)
        twin(x)
    assert insp.steps_recorded == 1 and set(insp.frame().step) == {0}
