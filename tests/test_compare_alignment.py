"""compare()'s parts: the alignment is a function whose table a Comparison receives, the statuses
are named constants, and every figure comes from the one helper in figures."""

from __future__ import annotations

import inspect

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import singlecard_nb as scn  # noqa: E402
from singlecard_nb.inspection.runs import alignment, comparison, structure  # noqa: E402
from singlecard_nb.inspection.runs.alignment import (  # noqa: E402
    COMPARED,
    ONLY_IN_A,
    ONLY_IN_B,
    PER_RANK_GRADIENT,
    SHAPE_DIFFERS,
    STATUSES,
    align,
)
from singlecard_nb.inspection.runs.comparison import Comparison  # noqa: E402
from singlecard_nb.inspection.views import figures, heatmap, histograms  # noqa: E402


def records(rows: list[tuple], rank: int | None = None) -> pd.DataFrame:
    """A frame of records: (step, module, io, mean, shape) per row."""
    frame = pd.DataFrame(
        [{"step": step, "module": module, "call": 0, "io": io, "index": "", "mean": mean,
          "std": 1.0, "absmax": abs(mean), "shape": shape, "type": "Linear", "dtype": "float32"}
         for step, module, io, mean, shape in rows])
    return frame if rank is None else frame.assign(rank=rank)


A = records([(0, "fc", "output", 1.0, (2, 4)), (0, "head", "output", 2.0, (2, 4)),
             (1, "fc", "output", 1.0, (2, 4))])
B = records([(0, "fc", "output", 1.5, (2, 4)), (0, "head", "output", 2.0, (3, 4)),
             (2, "fc", "output", 1.0, (2, 4))])


def test_every_status_is_one_of_the_named_constants():
    frame = scn.compare(A, B).frame()
    assert dict(zip(zip(frame["step"], frame["module"]), frame["status"])) == {
        (0, "fc"): COMPARED, (0, "head"): SHAPE_DIFFERS, (1, "fc"): ONLY_IN_A,
        (2, "fc"): ONLY_IN_B}
    job = pd.concat([records([(0, "fc", "param_grad", 1.0, (4,))], rank=r) for r in (0, 1)])
    one = records([(0, "fc", "param_grad", 1.0, (4,))])
    assert set(scn.compare(job, one).frame()["status"]) == {PER_RANK_GRADIENT}
    assert STATUSES == (COMPARED, SHAPE_DIFFERS, ONLY_IN_A, ONLY_IN_B, PER_RANK_GRADIENT)
    assert set(scn.compare(A, B).counts) == {COMPARED, "diverged", ONLY_IN_A, ONLY_IN_B,
                                             SHAPE_DIFFERS}


def test_the_alignment_is_computed_by_a_function_and_received_by_the_comparison():
    aligned = align(A, B, ("mean",), rtol=1e-3, atol=1e-6)
    assert (aligned.stats, aligned.ranks_a, aligned.ranks_b, aligned.by_rank) == (
        ("mean",), [0], [0], False)
    assert list(aligned.table["module"]) == ["fc", "head", "fc", "fc"]  # a's order, b's extra last
    received = Comparison(aligned, notes=["given"], labels=("x", "y"))
    assert received.notes == ["given"] and received.first.module == "fc"
    assert received.first.rel == pytest.approx(0.5 / 1.5)
    pd.testing.assert_frame_equal(received.frame(), scn.compare(A, B, ("mean",)).frame())
    # the constructor only reads the table: it aligns nothing itself
    assert "merge" not in inspect.getsource(Comparison.__init__)


def test_every_figure_is_made_by_the_one_helper(monkeypatch):
    made = []
    original = figures.new_figure

    def counting(*args, **kwargs):
        made.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(figures, "new_figure", counting)
    assert isinstance(scn.compare(A, B).plot(), Figure)  # the divergence plot (compare_plot)
    assert isinstance(scn.compare(A, records([(5, "x", "output", 0.0, (1,))])).plot(), Figure)
    assert isinstance(scn.compare_ranks(A).plot(), Figure)  # one rank: a message figure

    class Recorded:  # what the figures read of an Inspector
        def histograms(self, steps=False):
            one = (np.ones(4), np.linspace(0.0, 1.0, 5))
            return {"fc": [(0, *one)]} if steps else {"fc": one}

        def history(self, *args, **kwargs):
            return None

        def frame(self):
            return records([(0, "fc", "output", 0.0, (4,))]).assign(nan=0, inf=0)

    assert isinstance(histograms.histograms(Recorded()), Figure)
    assert isinstance(heatmap.heatmap(Recorded()), Figure)  # nothing recorded: a message figure
    assert len(made) == 5 and made[3][:2] == (4.5, 2.6)  # the histograms: one module, one step
    for module in (comparison, structure, alignment):
        assert "matplotlib" not in inspect.getsource(module), module.__name__
