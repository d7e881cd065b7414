"""No `$` in our HTML is MathJax's: every `_repr_html_` / `_repr_mimebundle_` singlecard_nb
defines (found in the source, so a new one without a case here fails), the picker's HTML and
the live view, each built with a `$` in what it shows, writes it `&#36;`."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from torch import nn

import singlecard_nb as scn
from singlecard_nb.inspection.views import live
from singlecard_nb.notebook import picker_view, watch
from singlecard_nb.pinning import devices

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "singlecard_nb"
MACHINE = Path(__file__).with_name("browser_machine.json")
DOLLAR = "cost$"  # a module name users can give (nn.ModuleDict keys may hold `$`)


def html_of(obj) -> str:
    bundle = getattr(obj, "_repr_mimebundle_", None)
    if bundle is not None:
        data = bundle()
        data = data[0] if isinstance(data, tuple) else data
        if "text/html" in data:
            return data["text/html"]
    return obj._repr_html_()


class Net(nn.Module):
    def __init__(self, features: int = 4):
        super().__init__()
        self.parts = nn.ModuleDict({DOLLAR: nn.Linear(features, 4)})

    def forward(self, x):
        return self.parts[DOLLAR](x)


def model() -> nn.Module:
    torch.manual_seed(0)
    return Net()


def run(m: nn.Module) -> scn.Inspector:
    with scn.inspect(m) as insp:
        m(torch.randn(3, 4))
    return insp


@pytest.fixture(scope="module")
def runs():
    a, b = model(), model()
    with torch.no_grad():
        b.parts[DOLLAR].weight.mul_(2)
    return run(a), run(b)


def machine():
    described = json.loads(MACHINE.read_text())
    described["gpus"][0]["name"] = "NVIDIA A100 $5/h"
    return devices.Machine.from_dict(described, source="described: $HOME/machine.json")


def explanation():
    try:
        Net(features=4)(torch.randn(2, 3))
    except RuntimeError as e:
        return scn.explain(e)


def memory_table():
    m = model()
    with scn.inspect(m, memory=True) as insp:
        m(torch.randn(3, 4, requires_grad=True)).sum().backward()
    return insp.memory()


# module:Class -> what builds one with a `$` in its content
CASES = {
    "pinning.report:Status": lambda runs, mp: (mp.setenv("CUDA_VISIBLE_DEVICES", "$SLURM_GPUS"),
                                               scn.status())[1],
    "pinning.model:Machine": lambda runs, mp: machine(),
    "inspection.runs.comparison:Comparison": lambda runs, mp: scn.compare(*runs),
    "inspection.runs.comparison:RankComparison": lambda runs, mp: scn.compare_ranks(
        __import__("pandas").concat([runs[0].frame().assign(rank=0),
                                     runs[1].frame().assign(rank=1)]), inputs=True),
    "inspection.views.summary:Summary": lambda runs, mp: runs[0].summary(),
    "inspection.engine:Inspector": lambda runs, mp: runs[0],
    "diagnosis.explain:Explanation": lambda runs, mp: explanation(),
    "diagnosis.explain:Banner": lambda runs, mp: explanation().banner(),
    "inspection.memory.table:MemoryTable": lambda runs, mp: memory_table(),
    "sizing.plan:Plan": lambda runs, mp: scn.fit(model(), torch.randn(3, 4)),
    "notebook.watch:CellMemory": lambda runs, mp: watch.CellMemory(
        "cpu", "RSS", 1, 1, 1, True, 0.1, note="$PATH"),
}


def defined_html_classes() -> set[str]:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(item, ast.FunctionDef)
                    and item.name in ("_repr_html_", "_repr_mimebundle_") for item in node.body):
                found.add(f"{module}:{node.name}")
    return found


def test_every_html_rendering_has_a_case_here():
    assert defined_html_classes() == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_bare_dollar_in_html(name, runs, monkeypatch):
    markup = html_of(CASES[name](runs, monkeypatch))
    assert "&#36;" in markup, "the case shows no `$`: it would test nothing"
    assert "$" not in markup
    assert "mathjax_ignore" in markup and "tex2jax_ignore" in markup


def test_no_bare_dollar_in_the_picker():
    m = machine()
    gpu = m.gpus[0].uuid
    for markup in (picker_view.header_html(m, None), picker_view.table_html(m, gpu, gpu, "$why")):
        assert "&#36;" in markup and "$" not in markup


def test_no_bare_dollar_in_the_live_view(monkeypatch):
    InteractiveShell.instance()  # the view displays only where IPython runs
    shown: list[str] = []

    def fake_display(obj, *args, **kwargs):
        shown.append(obj["text/html"] if isinstance(obj, dict) else html_of(obj))

        class Handle:
            def update(self, obj, *args, **kwargs):
                shown.append(obj["text/html"] if isinstance(obj, dict) else html_of(obj))

        return Handle()

    monkeypatch.setattr(live, "display", fake_display)
    m = model()
    with scn.inspect(m) as insp:
        view = insp.live()
        m(torch.randn(3, 4))
    shown += [html_of(view)] if hasattr(view, "_repr_html_") else []
    assert shown and any("&#36;" in h for h in shown)
    # MathJax never reads a <script> (the view's own code has `$` in its regular expressions)
    outside_scripts = [re.sub(r"<script\b.*?</script>", "", h, flags=re.S) for h in shown]
    assert not [h for h in outside_scripts if "$" in h]
    assert all("mathjax_ignore" in h and "tex2jax_ignore" in h for h in shown)
