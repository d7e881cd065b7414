"""Every view survives any value a float64 run can hold: parameters near float64's largest
value (an exploding run), an Inf among them, denormals, and a model whose layers lie at both
ends of the range at once. Each view answers in words; none raises (an OverflowError of a mean
squared in Python floats took `summary()`, `findings()`, `live()`, `plot()` and
`scn.findings(file)` down)."""

from __future__ import annotations

import math

import matplotlib
import pytest
import torch
from torch import nn

import singlecard_nb as scn
from singlecard_nb.inspection.views import live

matplotlib.use("Agg")

TINY = 5e-324  # float64's smallest denormal
CASES = {  # per layer: the size of its weights (and how much they grow per step)
    "1e200, growing": ((1e200, 10.0), (1e200, 10.0)),
    "1e308": ((1.5e308, 1.0), (1.7e308, 1.0)),
    "inf": ((math.inf, 1.0), (1.0, 1.0)),
    "denormals": ((1e-310, 1.0), (TINY, 1.0)),
    "both ends": ((1e-310, 1.0), (1.7e308, 1.0)),
}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4, dtype=torch.float64)
        self.b = nn.Linear(4, 2, dtype=torch.float64)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def run(case: str, steps: int = 4):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    insp = scn.inspect(model, grads=True, params=True)
    with insp:
        for step in range(steps):
            with torch.no_grad():
                for layer, (size, growth) in zip((model.a, model.b), CASES[case]):
                    for p in layer.parameters():
                        sign = torch.randint(0, 2, p.shape, dtype=p.dtype) * 2 - 1
                        p.copy_(sign * (0.5 + torch.rand_like(p) / 2) * size * growth ** step)
            loss = model(torch.randn(8, 4, dtype=torch.float64)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return insp


@pytest.fixture(scope="module", params=list(CASES))
def inspected(request):
    return run(request.param)


def test_summary_and_findings_answer_in_words(inspected):
    summary = inspected.summary()
    text = repr(summary) + summary._repr_html_()
    assert "OverflowError" not in text
    rows = inspected.findings(top=None)
    for row in rows:
        assert isinstance(row.text(), str)
        assert "inf×" not in row.why and "×inf" not in row.why  # out of range, said in words
    assert inspected.errors == []


def test_live_view_draws(inspected, monkeypatch):
    monkeypatch.setattr(live, "display", lambda *a, **k: None)
    view = live.LiveView(inspected, shell=None)
    bundle = view._bundle()  # raised, or drew "live view failed"
    assert "failed" not in bundle["text/plain"]
    assert bundle["text/html"]


@pytest.mark.parametrize("io", ["output", "param", "param_grad", "update"])
@pytest.mark.parametrize("stat", ["absmax", "mean"])
def test_plot_draws(inspected, io, stat):
    import matplotlib.pyplot as plt

    for relative in (False, True):
        figure = inspected.plot(stat, io=io, relative=relative)
        figure.canvas.draw()
        plt.close(figure)


@pytest.mark.parametrize("size", [1.7e308, 1e-310])
def test_the_block_panel_draws(size):
    import matplotlib.pyplot as plt

    model = nn.Sequential(*(nn.Linear(4, 4, dtype=torch.float64) for _ in range(4)))
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.fill_(size if i % 4 else 1.0)
    with scn.inspect(model) as insp:
        for _ in range(2):
            model(torch.ones(2, 4, dtype=torch.float64))
    for relative in (False, True):
        figure = insp.plot(relative=relative)
        figure.canvas.draw()
        plt.close(figure)


def test_findings_of_the_saved_file(inspected, tmp_path):
    path = inspected.save(tmp_path / "run.db")
    rows = scn.findings(path)
    assert [r.path for r in rows] == [r.path for r in inspected.findings()]
    frame = scn.load(path)
    assert len(frame) == len(inspected.frame())


def test_a_ratio_beyond_float64_is_said_in_words():
    from singlecard_nb.inspection.causes.series import times
    from singlecard_nb.inspection.views.formatting import trend

    assert times(math.inf) == "beyond 10^308×"
    assert trend(1e-300, 1e300) == "1e-300→1e300 ×10^600"
