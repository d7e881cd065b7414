"""Heatmap and histogram figures drawn from a real Inspector."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import LogNorm  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from torch import nn  # noqa: E402

import singlecard_nb as scn  # noqa: E402
from singlecard_nb.inspection.views import heatmap, histograms  # noqa: E402


class Skipper(nn.Module):
    """`extra` runs only on even steps; step 3 gets a NaN input."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(4, 8)
        self.extra = nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x):
        h = self.first(x)
        if self.calls % 2 == 0:
            h = self.extra(h)
        self.calls += 1
        return h


def _recorded(steps=6, nan_step=3, **options):
    torch.manual_seed(0)
    model = Skipper()
    with scn.inspect(model, **options) as insp:
        for step in range(steps):
            x = torch.randn(3, 4)
            if step == nan_step:
                x[0, 0] = float("nan")
            model(x)
    return insp


def _images(fig):
    return fig.axes[0].get_images()


def test_heatmap_is_module_by_step_with_nan_red_and_missing_blank():
    open_before = plt.get_fignums()
    insp = _recorded()
    fig = insp.plot("absmax")
    assert isinstance(fig, Figure)
    assert plt.get_fignums() == open_before  # returned, not also left for the inline backend
    values, overlay = _images(fig)
    table = insp.history("absmax")
    assert values.get_array().shape == table.shape == (3, 6)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["first · Linear", "extra · Linear", "(root) · Skipper"]
    red = ~np.ma.getmaskarray(overlay.get_array())
    # step 3: every module that ran got NaN; `extra` did not run on odd steps
    assert red[:, 3].tolist() == [True, False, True]
    assert red.sum() == 2
    blank = np.ma.getmaskarray(values.get_array()) & ~red
    assert blank[1].tolist() == [False, True, False, True, False, True]
    assert "red: NaN/Inf" in fig.axes[0].get_title()


def test_heatmap_of_other_statistics_and_log_scale_for_wide_ranges():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    with torch.no_grad():
        model[1].weight.mul_(1e4)
    with scn.inspect(model) as insp:
        for _ in range(3):
            model(torch.randn(2, 4))
    assert isinstance(_images(heatmap.heatmap(insp, "absmax"))[0].norm, LogNorm)
    std_fig = heatmap.heatmap(insp, "mean")
    assert not isinstance(_images(std_fig)[0].norm, LogNorm)  # mean can be negative
    assert "mean of module outputs" in std_fig.axes[0].get_title()


def test_heatmap_before_any_step_says_so():
    insp = scn.inspect(nn.Linear(2, 2))
    insp.stop()
    fig = heatmap.heatmap(insp)
    assert "no output 'absmax' recorded yet" in fig.axes[0].texts[0].get_text()


def test_histograms_per_module_merge_bins_exactly_and_name_what_is_missing():
    insp = _recorded(nan_step=None, hist=["first", "extra"], hist_bins=64)
    fig = insp.hist()
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["first", "per step", "extra", "per step"]  # each: latest, then per step
    counts, _ = insp.histograms()["first"]
    coarse = histograms.histograms(insp, modules=["fir*"], bins=16)
    (bars,) = [p for p in coarse.axes[0].patches]
    assert len(bars.get_path().vertices) > 0
    merged, edges = histograms._rebin(counts, np.linspace(0, 1, 65), 16)
    assert len(merged) == 16 and merged.sum() == counts.sum() and len(edges) == 17
    with pytest.raises(ValueError, match="modules with histograms: 'first', 'extra'"):
        histograms.histograms(insp, modules=["decoder.*"])


def test_histograms_without_any_requested_say_how_to_ask():
    insp = _recorded(nan_step=None)
    fig = insp.hist()
    assert "hist=" in fig.axes[0].texts[0].get_text()


def test_histograms_over_steps_and_a_note_where_values_were_nan():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 8))
    with scn.inspect(model, hist=["0", "1"]) as insp:
        for step in range(5):
            x = torch.randn(16, 4) * (1 + step)
            if step == 4:
                x[:] = float("nan")  # every value of the last step is NaN
            model(x)
    fig = insp.hist()
    assert [len(kept) for kept in insp.histograms(steps=True).values()] == [5, 5]
    latest, per_step = fig.axes[0], fig.axes[1]
    assert latest.get_title() == "0"
    # the last step had no finite value: said, not two empty axes
    assert "no finite values to count" in latest.texts[0].get_text()
    assert "NaN ×128 not counted" in latest.texts[0].get_text()
    (image,) = per_step.get_images()
    assert image.get_array().shape == (5, 64)
    assert "NaN/Inf in that step" in per_step.get_title()
    assert [t.get_text() for t in per_step.get_yticklabels()][-1] == "4"


def test_heatmap_at_scale_labels_every_row_folds_containers_and_has_a_block_panel():
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(30)]
    model = nn.Sequential(*blocks)
    with scn.inspect(model) as insp:
        for _ in range(4):
            with torch.no_grad():
                model[17][0].weight.mul_(1.5)
            model(torch.randn(2, 8))
    fig = insp.plot(top=10)
    ax, grid = fig.axes[0], fig.axes[1]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) == 10 == ax.get_images()[0].get_array().shape[0]  # every row labelled
    assert "17.0 · Linear" in labels
    assert not any(label.startswith("(root)") for label in labels)  # root == 29.1: folded
    # the block panel: 30 blocks as rows, the module kinds as columns (containers folded)
    assert [t.get_text() for t in grid.get_xticklabels()] == ["0", "1"]
    assert len(grid.get_yticklabels()) == 30
    rel = insp.plot(relative=True, top=10)
    values = rel.axes[0].get_images()[0].get_array()
    assert np.allclose(values[:, 0], 1.0)  # each row ÷ its own first step
    assert "÷ first step" in rel.axes[0].get_title()
