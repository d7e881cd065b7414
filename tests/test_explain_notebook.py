"""The explanation under a failing cell: through a real InteractiveShell, and through a real
kernel driven by nbclient (as Jupyter runs a notebook)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from conftest import linear_shape_error, notebook_runner
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from singlecard_nb import borrow
from singlecard_nb.diagnosis import explain
from singlecard_nb.notebook import explain_cells, magics

ROOT = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;]*m")

MODEL = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.head = nn.Linear(32, 2)

    def forward(self, x):
        return self.head(self.body(x))

model = Net()
"""


@pytest.fixture
def shown(monkeypatch) -> list:
    """What was passed to IPython's display() after cells and by the magic."""
    objects: list = []
    monkeypatch.setattr(explain_cells, "display", objects.append)
    monkeypatch.setattr(magics, "display", objects.append)
    return objects


@pytest.fixture
def ip(shown):
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "singlecard_nb")
    shell.run_cell(MODEL).raise_error()
    yield shell
    if "singlecard_nb" in shell.extension_manager.loaded:
        shell.run_line_magic("unload_ext", "singlecard_nb")


def test_a_cell_failing_inside_a_module_shows_the_explanation(ip, shown):
    result = ip.run_cell("model(torch.randn(4, 8))")
    error = result.error_in_exec
    # the exception is torch's own, untouched, and is what %debug / sys.last_value see
    assert type(error) is RuntimeError
    assert str(error) == linear_shape_error(4, 16, 32, 2)
    assert sys.last_value is error and sys.last_traceback is error.__traceback__
    banner, shown = shown  # the banner above the traceback, the explanation under it
    assert isinstance(banner, explain.Banner) and isinstance(shown, explain.Explanation)
    assert shown.module == "head" and shown.chain == [("", "Net"), ("head", "Linear")]
    assert shown.hint.startswith("Linear 'head' expects the last dimension of its input to be 32")
    assert banner.text == f"singlecard_nb.explain: Linear 'head' failed: {shown.hint} (details " \
        "under the traceback)"
    # the line of the cell that called it, named as IPython names cells
    assert re.fullmatch(r"In\[\d+\], line 11 in forward: return self.head\(self.body\(x\)\)",
                        shown.where)


def test_tb_still_prints_torchs_traceback(ip, shown, capsys):
    ip.run_cell("model(torch.randn(4, 8))")
    capsys.readouterr()
    ip.run_line_magic("tb", "")
    out = ANSI.sub("", capsys.readouterr().out)
    assert "mat1 and mat2 shapes cannot be multiplied" in out and "F.linear(input" in out


def test_nothing_is_shown_for_cells_that_pass_or_fail_outside_modules(ip, shown):
    ip.run_cell("model(torch.randn(4, 8)) if False else None").raise_error()
    ip.run_cell("torch.ones(2) @ torch.ones(3)")
    ip.run_cell("1 / 0")
    assert shown == []


def test_ctrl_c_inside_a_forward_is_not_explained(ip, shown):
    ip.run_cell("class Stop(nn.Module):\n"
                "    def forward(self, x):\n"
                "        raise KeyboardInterrupt\n")
    result = ip.run_cell("Stop()(torch.ones(1))")
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert shown == []


def test_explain_off_and_on(ip, shown, capsys):
    ip.run_line_magic("singlecard", "explain off")
    assert "are off" in capsys.readouterr().out
    ip.run_cell("model(torch.randn(4, 8))")
    assert shown == []
    ip.run_line_magic("singlecard", "explain on")
    assert "are on" in capsys.readouterr().out
    ip.run_cell("model(torch.randn(4, 8))")
    assert [type(o) for o in shown] == [explain.Banner, explain.Explanation]


def test_bare_explain_shows_the_last_error(ip, shown):
    ip.run_line_magic("singlecard", "explain off")
    ip.run_cell("model(torch.randn(4, 8))")
    result = ip.run_cell("%singlecard explain")
    assert result.success and result.result is None  # nothing kept in Out
    assert [e.module for e in shown] == ["head"]


def test_bad_explain_argument_is_a_usage_error_that_changes_nothing(ip, shown):
    for line in ("explain sideways", "explain on off"):
        error = ip.run_cell(f"%singlecard {line}").error_in_exec
        assert isinstance(error, UsageError) and "'on' or 'off'" in str(error)
        assert explain_cells.is_on(ip)


def test_the_callback_is_borrowed_and_given_back(ip, shown):
    callbacks = ip.events.callbacks["post_run_cell"]
    assert callbacks.count(explain_cells._show_explanation) == 1
    assert "%singlecard explain" in [o.name for o in borrow.active_owners()]
    ip.run_line_magic("unload_ext", "singlecard_nb")
    assert explain_cells._show_explanation not in ip.events.callbacks["post_run_cell"]
    assert not explain_cells.is_on(ip)
    ip.run_cell("model(torch.randn(4, 8))")
    assert shown == []
    ip.run_line_magic("load_ext", "singlecard_nb")
    assert ip.events.callbacks["post_run_cell"].count(explain_cells._show_explanation) == 1


def test_the_banner_comes_before_the_traceback_and_unloading_gives_showtraceback_back(
        ip, monkeypatch, capsys):
    from IPython.display import display

    monkeypatch.setattr(explain_cells, "display", display)  # the shell's own, printing here
    original = type(ip).showtraceback
    ip.run_cell("model(torch.randn(4, 8))")
    out = ANSI.sub("", capsys.readouterr().out)
    banner = out.index("singlecard_nb.explain: Linear 'head' failed: Linear 'head' expects")
    assert banner < out.index("Traceback (most recent call last)") < out.index("  hint    Linear")
    assert out.count("(details under the traceback)") == 1
    ip.run_line_magic("unload_ext", "singlecard_nb")
    assert "showtraceback" not in vars(ip) and ip.showtraceback.__func__ is original
    ip.run_cell("model(torch.randn(4, 8))")
    assert "singlecard_nb.explain" not in capsys.readouterr().out


TRAP = """
import singlecard_nb as scn

class Log(nn.Module):
    def forward(self, x):
        return torch.log(x)

trapped = nn.Sequential(nn.Linear(8, 8), Log())
insp = scn.inspect(trapped, trap=True)
"""


def test_the_traps_frames_are_hidden_unless_xmode_verbose(ip, shown, capsys):
    ip.run_cell(TRAP).raise_error()
    try:
        ip.run_cell("trapped(torch.randn(4, 8))")
        hidden = ANSI.sub("", capsys.readouterr().out)
        ip.run_line_magic("xmode", "verbose")
        ip.run_cell("trapped(torch.randn(4, 8))")
        verbose = ANSI.sub("", capsys.readouterr().out)
    finally:
        ip.run_line_magic("xmode", "context")
        ip.run_cell("insp.stop()")
    # the traceback ends at torch's call of the hook: none of the package's frames
    assert "NonFiniteError: " in hidden and "in Module._call_impl" in hidden
    assert "hook_result = hook(" in hidden and "singlecard_nb" not in hidden.split("Traceback")[1]
    assert "skipping hidden" not in verbose
    assert "CallTracker.on_forward" in verbose and "Recorder.record_call" in verbose
    assert "in Recorder._check_finite" in verbose
    assert [type(o).__name__ for o in shown] == ["Banner", "Explanation"] * 2


def test_a_failure_to_explain_is_said_once_not_raised(ip, shown, monkeypatch, capsys):
    def broken(exc):
        raise RuntimeError("boom")

    monkeypatch.setattr(explain, "build", broken)
    result = ip.run_cell("model(torch.randn(4, 8))")
    assert type(result.error_in_exec) is RuntimeError and "mat1" in str(result.error_in_exec)
    assert "could not explain this error (RuntimeError: boom)" in capsys.readouterr().err
    assert shown == []


# --- a real kernel ----------------------------------------------------------------------------


@pytest.mark.slow
def test_in_a_kernel_the_banner_precedes_and_the_explanation_follows_the_traceback(tmp_path):
    import nbformat

    tagged = {"tags": ["raises-exception"]}
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("%load_ext singlecard_nb\n" + MODEL),
        nbformat.v4.new_code_cell("model(torch.randn(4, 8))", metadata=tagged),
        nbformat.v4.new_code_cell("%singlecard explain off"),
        nbformat.v4.new_code_cell("model(torch.randn(4, 8))", metadata=tagged),
        nbformat.v4.new_code_cell("print('after')"),
    ])
    path = tmp_path / "failing.ipynb"
    nbformat.write(nb, str(path))
    report = notebook_runner().execute(path, timeout=120)
    assert report.errors == [], str(report)
    assert len(report.expected_errors) == 2

    outputs = report.nb.cells[1].outputs
    # the banner first (on screen when the cell fails), the traceback, then the explanation
    assert [o.output_type for o in outputs] == ["display_data", "error", "display_data"]
    banner, error, shown = outputs
    assert "class='singlecard-explain-banner " in banner.data["text/html"]
    assert banner.data["text/plain"].startswith("singlecard_nb.explain: Linear 'head' failed: "
                                                "Linear 'head' expects the last dimension")
    assert error.ename == "RuntimeError"
    assert error.evalue == linear_shape_error(4, 16, 32, 2)
    # IPython's traceback, intact, down to torch's own line
    assert "F.linear(input" in ANSI.sub("", "\n".join(error.traceback))
    assert "class='singlecard-explain " in shown.data["text/html"]
    text = shown.data["text/plain"]
    assert text.startswith("singlecard_nb.explain: Linear 'head' failed")
    assert "hint    Linear 'head' expects the last dimension of its input to be 32" in text
    assert [o.output_type for o in report.nb.cells[3].outputs] == ["error"]  # switched off
    assert report.nb.cells[4].outputs[0].text == "after\n"


@pytest.mark.slow
def test_run_notebook_counts_only_unexpected_errors(tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("1 / 0", metadata={"tags": ["raises-exception"]}),
        nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["raises-exception"]}),
        nbformat.v4.new_code_cell("undefined_name"),
    ])
    path = tmp_path / "errors.ipynb"
    nbformat.write(nb, str(path))
    report = notebook_runner().execute(path, timeout=60)
    assert report.expected_errors == ["cell 0: ZeroDivisionError: division by zero"]
    assert report.errors == ["cell 1: tagged raises-exception but raised nothing",
                             "cell 2: NameError: name 'undefined_name' is not defined"]


def test_loading_and_a_failing_cell_without_torch_do_not_import_torch():
    from conftest import run_fresh_python

    code = (
        "import json, sys\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance()\n"
        "ip.run_line_magic('load_ext', 'singlecard_nb')\n"
        "ip.run_cell('1 / 0')\n"
        "print(json.dumps({'torch': 'torch' in sys.modules,"
        " 'explain': 'singlecard_nb.diagnosis.explain' in sys.modules}))\n"
    )
    result, _ = run_fresh_python(code)
    assert result == {"torch": False, "explain": False}
