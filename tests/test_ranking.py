"""The "what changed" order shared by the live view, the summary and the heatmap: an exploding
layer of a nanoGPT-shaped model comes first at 164 and ~1 000 modules; folding, grouping and
search mean what they say. Asserted through the text forms, which list what the notebook shows."""

from __future__ import annotations

import math

import pytest
import torch
from gc_support import objects_left_by
from gpt_like import GPT, exploding_steps
from torch import nn

import singlecard_nb as scn
from singlecard_nb.inspection.views import formatting, live, ranking


def _first_paths(text: str, n: int) -> list[str]:
    """Module paths of the first `n` rows of a live view's text form."""
    return [line.split()[1] for line in text.splitlines()[1:n + 1]]


@pytest.fixture(autouse=True)
def no_shell(monkeypatch):
    monkeypatch.setattr(live, "_current_shell", lambda: None)  # a script: no display


@pytest.fixture
def one_thread():
    # Toy-width layers: torch's thread pool only adds waiting on a busy 2-core runner.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(("layers", "steps"), [(12, 10), (76, 7)])
def test_an_exploding_layer_leads_the_live_view_and_the_summary(layers, steps, capsys,
                                                                one_thread):
    torch.manual_seed(0)
    model = GPT(n_layer=layers)
    modules = sum(1 for _ in model.named_modules())
    assert modules == {12: 164, 76: 996}[layers]
    with scn.inspect(model) as insp:
        view = insp.live()
        exploding_steps(model, steps, growth=3.0)  # ×3 a step: 10^3 in 7 steps
    text = repr(view)
    first = _first_paths(text, 3)
    assert "transformer.h.9.mlp.c_fc" in first, text[:800]
    # it leads a collapsed group of all layers' c_fc, and says why it is there
    line = next(line for line in text.splitlines() if " transformer.h.9.mlp.c_fc " in line)
    assert f"worst of transformer.h.{{0-{layers - 1}}}.mlp.c_fc, {layers}]" in line
    assert "absmax ×" in line or "std ×" in line
    # the rich view has the same rows in the same order
    html = view._bundle()["text/html"].replace("<wbr>", "")
    assert html.index("transformer.h.{0-") < html.index("transformer.wte")
    assert "live inspection · step" in capsys.readouterr().out  # the script's final table
    summary = repr(insp.summary(top=8)).splitlines()
    # (the summary lists folded modules too, after the one whose output they repeat)
    assert "transformer.h.9.mlp.c_fc" in " ".join(summary[1:7])
    assert summary[-1].startswith(f"… {modules - 2 - 8} more modules")  # ModuleDict/List never run


def _tracks(series: dict[str, tuple[str, list[float]]], zeros=0.0) -> ranking.Tracks:
    tracks = ranking.Tracks()
    for path, (type_, values) in series.items():
        for step, v in enumerate(values):
            nan = 1 if v != v else 0
            tracks.add(step, path, type_, (4, 8), "float32", 0.0, v, v, nan, 0,
                       zeros if path.endswith("dead") else 0.0)
    return tracks


def test_tiers_nonfinite_then_moved_then_outliers_then_dead():
    flat = [1.0] * 6
    tracks = _tracks({
        "a.quiet": ("Linear", flat), "a.jump": ("Linear", [1.0] * 5 + [9e3]),
        "a.nan": ("Linear", [1.0] * 5 + [math.nan]), "a.grow": ("Linear", [10.0 ** i for i in range(6)]),
        # healthy movement (×40: a fresh head's logits as it learns) is no finding
        "a.learns": ("Linear", [1.0, 2.0, 5.0, 10.0, 20.0, 40.0]),
        **{f"n.{i}": ("LayerNorm", [1.0] * 6) for i in range(5)},
        "big": ("LayerNorm", [50.0] * 6), "x.dead": ("ReLU", flat),
    }, zeros=1.0)
    rows = ranking.rank(tracks, group=False)
    order = [r.path for r in rows]
    assert order[:5] == ["a.nan", "a.grow", "a.jump", "big", "x.dead"]
    why = {r.path: r.why for r in rows}
    # born in a.nan: the module before it in the step was finite
    assert why["a.nan"].startswith("NaN ×1 in output (step 5); born here from a finite input")
    assert why["a.jump"] == "absmax jumped ×9e+03 at step 5 (to 9e+03)"
    assert why["a.grow"] == ("absmax ×1e+05 since step 0 (to 1e+05, growing from step 2): the "
                             "activations are exploding")
    assert why["a.learns"] == ""
    assert why["big"] == "absmax ×50 the median of 6 LayerNorm"
    assert why["x.dead"] == "dead: 100.0% zeros" and why["a.quiet"] == ""


def test_containers_fold_into_the_child_whose_output_they_return():
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.0)))
    with scn.inspect(model) as insp:
        model(torch.randn(2, 4))
    view = live.LiveView(insp, shell=None)
    rows = view.rows()
    # "1" (the inner Sequential), "1.1" (Dropout p=0) and the root return 1.0's output
    assert [r.path for r in rows] == ["0", "1.0"]
    assert rows[1].same == ["1.1", "1", "(root)"]
    assert "same output: 1.1, 1, (root)" in view._bundle()["text/html"]


def test_repeated_blocks_group_by_numeric_components_and_search_opens_them():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.Tanh()) for _ in range(6)],
                          nn.Linear(4, 2))
    with torch.no_grad():
        model[5][0].weight.mul_(100)
    x = torch.randn(2, 4)
    with scn.inspect(model) as insp:
        for _ in range(3):
            model(x)
    rows = live.LiveView(insp, shell=None).rows()
    groups = {r.label: r for r in rows if r.is_group}
    # "6" has its own shape: not one of them
    assert set(groups) == {"{0-5}.0", "{0-5}.1"} and "6" in [r.path for r in rows]
    assert groups["{0-5}.0"].path == "5.0" and len(groups["{0-5}.0"].members) == 6
    # the ×100 layer leads: an outlier among the 7 Linears
    assert rows[0].label == "{0-5}.0" and "the median of 7 Linear" in rows[0].why
    assert "3.0" in [r.path for r in ranking.search(rows, "3.*")]
    assert {r.path for r in ranking.search(rows, "linear")} == {*(f"{i}.0" for i in range(6)), "6"}
    assert {r.path for r in ranking.search(rows, "6, 2.0")} == {"2.0", "6"}
    assert ranking._ranges([0, 1, 2, 3, 7, 9, 10]) == "0-3,7,9-10"


def test_sparklines_in_one_pass_draw_what_one_sparkline_draws():
    series = [[0, 1, 2, math.nan, math.inf], [3, 3], [], [math.nan], [-1.0, 5.0, 2.0]]
    assert formatting.sparklines(series) == [formatting.sparkline(s) for s in series]
    assert formatting.sparkline([0, 1, 2, math.nan, math.inf]) == "▁▅█·!"


def test_no_dollar_reaches_mathjax_and_summary_top_n():
    import re

    model = nn.Sequential()
    model.add_module("price$", nn.Linear(3, 3))
    model.add_module("cost$2", nn.Linear(3, 3))
    with scn.inspect(model) as insp:
        model(torch.randn(2, 3))
    summary = insp.summary(top=1)
    html = summary._repr_html_()
    assert "$" not in html and ("price&#36;" in html or "cost&#36;2" in html)
    assert len(summary.frame) == 1 and "… 2 more modules" in repr(summary)
    view = live.LiveView(insp, shell=None)._bundle()["text/html"]
    outside_scripts = re.sub(r"<script.*?</script>", "", view, flags=re.S)
    assert "$" not in outside_scripts and "&#36;" in outside_scripts


def test_the_trend_compares_a_step_with_several_outputs_alike_at_both_ends():
    # nanoGPT's model returns (logits, loss): the step's absmax is the larger of the two at the
    # first step as at the last, so a model whose figures do not move shows no trend
    class WithLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(4, 4)

        def forward(self, x):
            logits = self.head(x)
            return logits, 100.0 + logits.square().mean()

    torch.manual_seed(0)
    model, x = WithLoss(), torch.randn(3, 4)
    with scn.inspect(model) as insp:
        for _ in range(3):
            model(x)
    frame = insp.summary().frame
    (trend,) = set(frame.loc[frame["module"] == "", "trend"])
    first, last = trend.split("→")
    assert first == last and "×" not in trend, trend


def test_a_layer_far_below_its_peers_is_no_finding_one_far_above_is():
    # nanoGPT scales its residual projections' init down (c_proj ÷24 the other Linears): usual
    flat = [1.0] * 4
    tracks = _tracks({**{f"h.{i}.fc": ("Linear", flat) for i in range(6)},
                      "h.0.proj": ("Linear", [0.04] * 4), "h.1.proj": ("Linear", [0.04] * 4),
                      "head": ("Linear", [30.0] * 4)}, zeros=0.0)
    why = {r.path: r.why for r in ranking.rank(tracks, group=False)}
    assert why["h.0.proj"] == why["h.1.proj"] == ""
    assert why["head"] == "absmax ×30 the median of 9 Linear"


def test_reading_a_run_leaves_the_garbage_collector_a_few_objects_per_series():
    """The ranking reads every recorded row when a script ends (up to max_rows, 100 000 by
    default). Each step of a series it keeps was a list, which the collector tracks for as long
    as it lives, so reading a long run brought full collections of the whole process and
    doubled the read (benchmarks/real_scripts.py's GPT: 0.75 ms an iteration). Kept as tuples
    of numbers they are untracked: a few objects per series remain, however many steps."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with scn.inspect(model, grads=True, params=True) as insp:
        for _ in range(300):
            opt.zero_grad()
            model(torch.randn(4, 8)).square().mean().backward()
            opt.step()
    records = insp.records()
    tracks = ranking.Tracks()
    left = objects_left_by(lambda: tracks.feed(records))
    series = sum(len(t) for t in (tracks.by_path, tracks.inputs, tracks.params, tracks.grads,
                                  tracks.step_grads, tracks.updates))
    assert series >= 20 and tracks.last_step == 299
    # a series: its Track, deque, Trail...; a record: the note that it was read
    assert left <= 10 * series + 2 * len(records), (left, series, len(records))
