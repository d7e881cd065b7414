"""`%inspect` / `%%inspect` through a real InteractiveShell."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from torch.nn.modules import module as module_globals

import singlecard_nb as scn
from singlecard_nb import borrow


@pytest.fixture
def ip():
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "singlecard_nb")
    shell.run_cell(
        "import torch\nfrom torch import nn\n"
        "model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))\n"
        "x = torch.randn(3, 4)\n"
    )
    yield shell
    shell.run_line_magic("unload_ext", "singlecard_nb")
    assert borrow.active_owners() == []


def hooks(shell) -> int:
    model = shell.user_ns["model"]
    return (len(module_globals._global_forward_hooks)
            + sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()))


def magics(shell):
    return shell.magics_manager.registry["InspectMagics"]


def run(shell, cell):
    result = shell.run_cell(cell)
    assert result.success, result.error_in_exec or result.error_before_exec
    return result


def test_inspect_across_cells_then_show_and_off(ip, capsys):
    run(ip, "%inspect model --every 2 --grads")
    assert hooks(ip) > 0
    run(ip, "for _ in range(4):\n    model(x).sum().backward()")
    insp = magics(ip).inspectors["model"]
    df = insp.frame()
    assert sorted(df.step.unique()) == [0, 2] and "param_grad" in set(df.io)
    run(ip, "%inspect show model")
    assert "Linear" in capsys.readouterr().out
    run(ip, "%inspect off")
    assert hooks(ip) == 0 and magics(ip).inspectors == {}
    assert ip.events.callbacks["post_run_cell"].count(magics(ip)._flush_callback) == 0


def test_params_option_records_parameters_after_each_optimiser_step(ip):
    run(ip, "%inspect model --params\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "for _ in range(2):\n"
            "    model(x).sum().backward(); opt.step(); opt.zero_grad()")
    df = scn.inspector(ip.user_ns["model"]).frame()
    weight = df.query("io == 'param' and module == '2' and index == 'weight' and step == 1")
    assert weight["mean"].iloc[0] == pytest.approx(
        ip.user_ns["model"][2].weight.double().mean().item(), rel=1e-6, abs=1e-7)
    assert "step_grad" in set(df.io)


def test_last_step_of_a_cell_reaches_the_host_when_the_cell_ends(ip):
    run(ip, "%inspect model")
    run(ip, "model(x)")
    insp = magics(ip).inspectors["model"]
    assert insp.steps_recorded == 1 and len(insp.last_step()) > 0


def test_cell_magic_inspects_only_that_cell_and_shows_summary(ip, capsys):
    run(ip, "%%inspect model --include 0,2\nmodel(x)")
    out = capsys.readouterr().out
    assert "Linear" in out and "ReLU" not in out
    assert hooks(ip) == 0


def test_cell_magic_removes_hooks_when_the_cell_fails(ip):
    ip.run_cell("%%inspect model\nmodel(x)\nraise ValueError('boom')")
    assert hooks(ip) == 0


def test_a_failing_cell_fails_with_its_own_error_and_still_shows_the_summary(ip, capsys):
    result = ip.run_cell("%%inspect model\nmodel(x)\nraise ValueError('boom')")
    assert type(result.error_in_exec) is ValueError and str(result.error_in_exec) == "boom"
    assert not result.success  # nbclient and "Run all" stop at this cell
    out = capsys.readouterr()
    assert "Linear" in out.out  # the summary of what was recorded
    assert out.out.index("Linear") < (out.out + out.err).index("boom")
    assert len(scn.inspector(ip.user_ns["model"]).frame()) == 5


def test_the_cell_magic_shows_a_last_value_like_a_cell(ip):
    result = run(ip, "%%inspect model\ny = model(x)\n2 + 3")
    assert result.result == 5 and ip.user_ns["y"].shape == (3, 1)
    assert run(ip, "%%inspect model\n2 + 3;").result is None


def test_the_line_magic_returns_nothing_and_scn_finds_its_inspector(ip):
    result = run(ip, "%inspect model --grads")
    assert result.result is None  # nothing for IPython's Out cache to keep
    run(ip, "model(x).sum().backward()")
    insp = scn.inspector(ip.user_ns["model"])
    assert insp is magics(ip).inspectors["model"] and insp.active
    assert scn.inspector(ip.user_ns["model"]) is insp
    assert "param_grad" in set(insp.frame().io)
    with pytest.raises(UsageError, match="already inspected across cells"):
        ip.run_cell_magic("inspect", "model", "model(x)")
    assert insp.active
    run(ip, "%inspect off")
    assert ip.run_line_magic("inspect", "off") is None


def test_ctrl_c_in_a_cell_leaves_inspection_working_in_the_next_cells(ip):
    run(ip, "class Stop(nn.Module):\n"
            "    calls = 0\n"
            "    def forward(self, x):\n"
            "        Stop.calls += 1\n"
            "        if Stop.calls == 2:\n"
            "            raise KeyboardInterrupt\n"
            "        return x\n"
            "net = nn.Sequential(nn.Linear(4, 4), Stop(), nn.ReLU())")
    run(ip, "%inspect net --every 2")
    run(ip, "net(x)")
    result = ip.run_cell("net(x)")  # Ctrl-C inside the model, in a step that is not recorded
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert module_globals._global_forward_hooks == {}  # nothing left over after the cell
    run(ip, "for _ in range(4):\n    net(x)")
    insp = magics(ip).inspectors["net"]
    assert sorted(insp.frame().step.unique()) == [0, 2, 4]
    assert set(insp.frame().query("step == 4").call) == {0}


def test_torchscript_model_is_a_usage_error(ip):
    ip.run_cell("scripted = torch.jit.script(model)")
    with pytest.raises(UsageError, match="TorchScript"):
        ip.run_line_magic("inspect", "scripted")
    assert magics(ip).inspectors == {}


def test_trap_from_the_magic(ip, capsys):
    ip.run_cell("class Boom(nn.Module):\n    def forward(self, x):\n        return x.log() * 0 - x.abs().log()\n"
                "bad = nn.Sequential(nn.Linear(4, 4), Boom())\n"
                "nn.init.constant_(bad[0].bias, -1.0)")  # log(-1) is NaN, whatever the RNG state
    result = ip.run_cell("%%inspect bad --trap\nbad(torch.zeros(2, 4))")
    err = capsys.readouterr()
    assert "NonFiniteError" in err.out + err.err
    assert "'1'" in err.out + err.err
    assert isinstance(result.error_in_exec, scn.NonFiniteError)  # the cell fails with it
    assert result.error_in_exec.module == "1"


@pytest.mark.parametrize("line, message", [
    ("%inspect nosuch", "no variable named 'nosuch'"),
    ("%inspect x", "is a Tensor, not a torch.nn.Module"),
    ("%inspect model --every 0", "--every must be a positive integer, got 0"),
    ("%inspect model --every ten", "ten"),
    ("%inspect model --bogus", "--bogus"),
    ("%inspect off other", "'other' is not being inspected"),
    ("%inspect model other", "takes one model"),
])
def test_bad_input_is_a_usage_error_and_changes_nothing(ip, line, message):
    before = hooks(ip)
    with pytest.raises(UsageError, match=message):
        ip.run_line_magic("inspect", line.split(" ", 1)[1])
    assert hooks(ip) == before and magics(ip).inspectors == {}


def test_unload_removes_every_inspector_hook(ip):
    run(ip, "%inspect model --grads")
    ip.run_line_magic("unload_ext", "singlecard_nb")
    assert hooks(ip) == 0
    assert "inspect" not in ip.magics_manager.magics["line"]
    ip.run_line_magic("load_ext", "singlecard_nb")  # the fixture unloads again


def test_live_option_attaches_a_view_that_updates_while_training(ip):
    run(ip, "%inspect model --live")
    insp = magics(ip).inspectors["model"]
    assert len(insp._store.listeners) == 1  # the live view listens for finished steps
    run(ip, "for _ in range(3):\n    model(x)")
    run(ip, "%inspect off model")
    assert insp._store.listeners == []  # the view lets go when inspection stops
