"""Comparing two runs: the first divergence, what only one run has, records saved and reopened."""

from __future__ import annotations

import math
import sqlite3
import warnings

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from torch import nn  # noqa: E402
from torch.optim import optimizer as optim_globals  # noqa: E402

import singlecard_nb as scn  # noqa: E402


class Cancel(nn.Module):
    """(x + 1000) W^T - 1000 * W.sum(1) equals x W^T, but in bfloat16 the 1000 swallows x:
    catastrophic cancellation makes this one layer precision-sensitive."""

    def __init__(self, n: int):
        super().__init__()
        self.lin = nn.Linear(n, n, bias=False)

    def forward(self, x):
        return self.lin(x + 1000.0) - 1000.0 * self.lin.weight.sum(1)


def sensitive_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), Cancel(32), nn.ReLU(), nn.Linear(32, 4))


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 4))


def train(model: nn.Module, steps: int = 3, autocast: bool = False, loss_scale: float = 1.0,
          batch: int = 16, **options) -> scn.Inspector:
    """A few SGD steps on fixed data, recorded with `options` (grads and params by default)."""
    options = {"grads": True, "params": True, **options}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randn(batch, 8, generator=generator) for _ in range(steps)]
    with scn.inspect(model, **options) as insp:
        for x in batches:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = model(x).float().pow(2).mean() * loss_scale
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return insp


# --- the first divergence ------------------------------------------------------------------------
def test_bf16_autocast_first_divergence_is_the_precision_sensitive_layer():
    fp32 = train(sensitive_model())
    bf16 = train(sensitive_model(), autocast=True)
    cmp = scn.compare(fp32, bf16)  # the contract's defaults
    first = cmp.first
    assert (first.step, first.module, first.type, first.io, first.call) == (0, "2", "Cancel",
                                                                             "output", 0)
    assert first.rel > 0.1 and first.stat in ("mean", "std", "absmax")
    row = cmp.frame().query("step == 0 and module == '2' and io == 'output'").iloc[0]
    assert row[f"{first.stat}_a"] == first.a and row[f"{first.stat}_b"] == first.b
    # the bfloat16 Linear before it ran in another dtype but within tolerance: compared, not first
    linear = cmp.frame().query("step == 0 and module == '0' and io == 'output'").iloc[0]
    assert (linear["status"], linear["dtype_a"], linear["dtype_b"]) == ("compared", "float32",
                                                                        "bfloat16")
    assert not linear["diverged"] and "dtype float32 vs bfloat16" in linear["note"]
    # the dtype change is named where it first happens; precision sets the tolerance
    assert cmp.dtype_change == "step 0, '0' (Linear) output: float32 vs bfloat16"
    assert cmp.rtol == 4 * 2.0 ** -7 and "(rtol=0.001 given)" in " ".join(cmp.notes)


def test_perturbed_weight_diverges_first_at_that_layers_step0_output():
    reference = mlp()
    perturbed = mlp()
    with torch.no_grad():
        perturbed[2].weight += 1e-3
    cmp = scn.compare(train(reference, steps=4), train(perturbed, steps=4))
    first = cmp.first
    assert (first.step, first.module, first.io, first.index) == (0, "2", "output", "")
    frame = cmp.frame()
    before = frame.query("step == 0 and io == 'output' and module in ['0', '1']")
    assert len(before) == 2 and not before["diverged"].any()
    # it keeps diverging afterwards: the later rows are there, they are just not first
    later = frame.query("step > 0 and module == '2' and io == 'output'")
    assert later["diverged"].all() and len(later) == 3
    diverged = frame[frame["diverged"]]
    assert (diverged.iloc[0]["step"], diverged.iloc[0]["module"]) == (0, "2")


def test_identical_runs_agree_and_say_so():
    cmp = scn.compare(train(mlp()), train(mlp()))
    assert cmp.first is None
    frame = cmp.frame()
    assert (frame["status"] == "compared").all() and not frame["diverged"].any()
    assert (frame["rel"] == 0).all()
    assert cmp.counts["compared"] == len(frame) and cmp.notes == []
    assert "agree within rtol=0.001" in repr(cmp) and "agree within" in cmp._repr_html_()


def test_tolerance_decides_what_diverges():
    reference, perturbed = mlp(), mlp()
    with torch.no_grad():
        perturbed[2].weight.mul_(1 + 1e-5)
    a, b = train(reference, steps=1), train(perturbed, steps=1)
    assert scn.compare(a, b).first is None  # 1e-5 is inside rtol=1e-3
    strict = scn.compare(a, b, rtol=1e-7, atol=0)
    assert (strict.first.module, strict.first.io) == ("2", "output")


def test_a_gradient_that_differs_is_found_where_the_backward_starts():
    # Same forward, loss doubled in b: every forward row agrees; the first divergence in
    # execution order is the first gradient the backward computes, at the model's output.
    cmp = scn.compare(train(mlp(), steps=1), train(mlp(), steps=1, loss_scale=2.0))
    frame = cmp.frame()
    assert not frame.query("io in ['input', 'output']")["diverged"].any()
    assert cmp.first.io == "grad" and cmp.first.module in ("4", "")
    assert cmp.first.b == pytest.approx(2 * cmp.first.a, rel=1e-6)
    grads = frame[frame["io"] == "param_grad"]
    assert grads["module"].tolist()[:2] == ["4", "4"]  # backward order: last layer first


def test_nan_on_one_side_diverges_nan_on_both_agrees():
    insp = train(mlp(), steps=1)
    a = insp.frame()
    b = a.copy()
    b.loc[3, "mean"] = math.nan
    a.loc[5, "std"], b.loc[5, "std"] = math.nan, math.nan
    cmp = scn.compare(a, b)
    assert cmp.first.step == 0 and cmp.first.module == a.loc[3, "module"]
    assert cmp.first.stat == "mean" and math.isinf(cmp.first.rel)
    assert cmp.counts["diverged"] == 1


# --- what only one run has ------------------------------------------------------------------------
def test_every_n_and_different_step_counts_align_on_common_steps():
    every = train(mlp(), steps=6, every=2)  # steps 0, 2, 4
    short = train(mlp(), steps=3)  # steps 0, 1, 2
    cmp = scn.compare(every, short)
    assert cmp.first is None
    frame = cmp.frame()
    assert set(frame.loc[frame["status"] == "compared", "step"]) == {0, 2}
    assert set(frame.loc[frame["status"] == "only in a", "step"]) == {4}
    assert set(frame.loc[frame["status"] == "only in b", "step"]) == {1}
    assert "steps only in a: 4 (1 of 3; b recorded 3)" in cmp.notes
    assert "steps only in b: 1 (1 of 3; a recorded 3)" in cmp.notes
    # a's rows come first, in a's execution order; b's extra rows after them
    assert frame["status"].tolist()[-1] == "only in b"


def test_include_subset_and_grads_only_in_one_run_are_named():
    full = train(mlp(), steps=2)
    subset = train(mlp(), steps=2, include="0,1", grads=False, params=False)
    cmp = scn.compare(full, subset)
    assert cmp.first is None
    compared = cmp.frame().query("status == 'compared'")
    assert set(compared["module"]) == {"0", "1"} and set(compared["io"]) == {"output"}
    notes = "\n".join(cmp.notes)
    assert "modules only in a: '', '2', '3', '4'" in notes
    # the root's input is not in the subset either
    assert "io 'grad', 'input', 'param', 'param_grad', 'step_grad', 'update' only in a (recorded with " \
           "grads=True / params=True)" in notes


def test_different_batch_is_a_shape_difference_not_a_divergence():
    cmp = scn.compare(train(mlp(), steps=1, batch=16), train(mlp(), steps=1, batch=8))
    frame = cmp.frame()
    reshaped = frame[frame["status"] == "shape differs"]
    assert not reshaped.empty and not reshaped["diverged"].any()
    assert reshaped["rel"].isna().all()
    assert any(n.startswith("shape differs in") and "(16, 8) vs (8, 8)" in n for n in cmp.notes)


# --- results a user reads ------------------------------------------------------------------------
def test_html_and_text_put_the_first_divergence_on_top_and_plot_marks_it():
    cmp = scn.compare(train(sensitive_model(), steps=2), train(sensitive_model(), steps=2,
                                                                autocast=True))
    html = cmp._repr_html_()
    assert html.index("first divergence: step 0, &#x27;2&#x27; (Cancel) output") < html.index(
        "<table")
    assert html.count('style="background:rgba(214, 39, 40, 0.18)"') == 1  # the first row
    text = repr(cmp)
    assert text.splitlines()[0].startswith("first divergence: step 0, '2' (Cancel) output")
    fig = cmp.plot()
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels.index("0") < labels.index("2.lin") < labels.index("2") < labels.index("4")
    assert any("first: step 0 output" in t.get_text() for t in ax.texts)
    assert {line.get_label() for line in ax.get_lines()} >= {"output", "grad", "rtol 0.03125"}
    with pytest.raises(ValueError, match="stat must be one of mean, std, absmax; got 'min'"):
        cmp.plot("min")


def test_bad_arguments_name_the_value_and_what_is_accepted():
    frame = train(mlp(), steps=1).frame()
    with pytest.raises(ValueError, match="stat 'median' is not a statistic column.*accepted: "
                                         "mean, std, min, max, absmax, nan, inf, zeros"):
        scn.compare(frame, frame, stats=("mean", "median"))
    with pytest.raises(ValueError, match="rtol and atol must be non-negative"):
        scn.compare(frame, frame, rtol=-1)
    with pytest.raises(TypeError, match="got int"):
        scn.compare(frame, 42)
    with pytest.raises(ValueError, match="records without the columns"):
        scn.compare(frame, frame.drop(columns=["io"]))


# --- params=True ----------------------------------------------------------------------------------
def test_params_records_parameters_after_each_optimiser_step_and_gives_the_hook_back():
    hooks_before = len(optim_globals._global_optimizer_post_hooks)
    model = mlp()
    insp = train(model, steps=2)
    assert len(optim_globals._global_optimizer_post_hooks) == hooks_before
    frame = insp.frame()
    last = frame.query("step == 1 and module == '4' and index == 'weight'")
    param = last[last["io"] == "param"].iloc[0]
    assert param["mean"] == pytest.approx(model[4].weight.double().mean().item(), rel=1e-6)
    step_grad = last[last["io"] == "step_grad"].iloc[0]
    grad = model[4].weight.grad.double()
    # a mean is known to 1e-6 of the values' spread, not of itself (stats.py)
    assert step_grad["mean"] == pytest.approx(grad.mean().item(), rel=1e-6,
                                              abs=1e-6 * grad.std().item())
    # parameters come after the backward in execution order
    rows = frame[frame["step"] == 1]["io"].tolist()
    assert rows.index("param") > max(i for i, io in enumerate(rows) if io == "param_grad")


def bn_model(momentum: float) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16, momentum=momentum), nn.ReLU(),
                         nn.Linear(16, 4))


def test_running_statistics_that_drift_apart_are_found_in_the_buffers():
    # In training, BatchNorm normalises with the batch's own statistics: a wrong momentum changes
    # no output and no gradient, only the running statistics eval() will use.
    a, b = train(bn_model(0.1)), train(bn_model(0.3))
    buffers = a.frame().query("io == 'buffer' and step == 0")
    assert set(buffers["index"]) == {"running_mean", "running_var", "num_batches_tracked"}
    assert (buffers["module"] == "1").all() and (buffers["type"] == "BatchNorm1d").all()
    model = bn_model(0.1)
    train(model, steps=1)
    row = buffers.query("index == 'running_var'").iloc[0]
    assert row["mean"] == pytest.approx(model[1].running_var.double().mean().item(), rel=1e-6)
    first = scn.compare(a, b).first
    assert (first.step, first.module, first.io, first.index) == (0, "1", "buffer", "running_mean")
    assert scn.compare(a, train(bn_model(0.1))).first is None


def test_params_hook_is_given_back_when_the_training_loop_raises():
    hooks_before = len(optim_globals._global_optimizer_post_hooks)
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="the user's own error"):
        with scn.inspect(model, params=True):
            model(torch.randn(2, 8)).sum().backward()
            optimizer.step()
            raise RuntimeError("the user's own error")
    assert len(optim_globals._global_optimizer_post_hooks) == hooks_before


def test_params_without_an_optimiser_says_so():
    model = mlp()
    with pytest.warns(RuntimeWarning, match="no torch.optim optimiser stepped"):
        with scn.inspect(model, params=True):
            model(torch.randn(2, 8))


def test_params_on_a_model_only_evaluated_says_nothing():
    # a best checkpoint reloaded for the test set (word_language_model): no optimiser to see
    model = mlp().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad(), scn.inspect(model, params=True):
            model(torch.randn(2, 8))


# --- saved and reopened ---------------------------------------------------------------------------
def test_save_and_load_round_trip_every_column_exactly(tmp_path):
    insp = train(mlp(), steps=2)
    path = insp.save(tmp_path / "run.db")
    assert path == tmp_path / "run.db"
    frame = insp.frame()
    loaded = scn.load(path)
    pd.testing.assert_frame_equal(loaded, frame)
    assert loaded["shape"].iloc[0] == frame["shape"].iloc[0] and isinstance(
        loaded["shape"].iloc[0], tuple)
    assert str(loaded["nan"].dtype) == "Int64"
    # plain pandas reads it too, with nothing but sqlite3
    with sqlite3.connect(path) as db:
        plain = pd.read_sql_query("SELECT * FROM records", db)
    assert len(plain) == len(frame) and plain["mean"].tolist() == frame["mean"].tolist()
    assert scn.compare(path, insp).first is None


def test_a_column_the_frame_gains_later_is_saved_too(tmp_path):
    from singlecard_nb.inspection.runs import record_file

    frame = train(mlp(), steps=1).frame()
    frame["training"] = True
    frame.loc[0, "nan"] = pd.NA
    loaded = scn.load(record_file.save(frame, tmp_path / "new.db"))
    pd.testing.assert_frame_equal(loaded, frame)


def test_each_rank_writes_its_file_and_load_merges_the_job(tmp_path, monkeypatch):
    files = {}
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        files[rank] = train(mlp(), steps=2).save(tmp_path / "job.db")
    assert files == {0: tmp_path / "job.rank0.db", 1: tmp_path / "job.rank1.db"}
    for pattern in (tmp_path / "job.db", tmp_path / "job.rank*.db", tmp_path):
        job = scn.load(pattern)
        assert job["rank"].drop_duplicates().tolist() == [0, 1]
        assert job.attrs["singlecard_nb"]["files"] == [str(files[0]), str(files[1])]
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    single = train(mlp(), steps=2).save(tmp_path / "single" / "run.db")
    with pytest.raises(ValueError, match="both hold rank 0: they are two runs, not one job"):
        scn.load([files[0], single])


def test_load_says_what_it_cannot_read(tmp_path):
    with pytest.raises(FileNotFoundError, match="no saved records at"):
        scn.load(tmp_path / "missing.db")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="not a file written by insp.save"):
        scn.load(tmp_path / "notes.txt")
    with sqlite3.connect(tmp_path / "other.db") as db:
        db.execute("CREATE TABLE t (x)")
    with pytest.raises(ValueError, match="an SQLite file but not one written by insp.save"):
        scn.load(tmp_path / "other.db")


# --- ranks, without a job -------------------------------------------------------------------------
def test_frame_ranks_outside_a_job_is_this_process_and_bad_values_are_named():
    insp = train(mlp(), steps=1)
    pd.testing.assert_frame_equal(insp.frame(ranks="all"), insp.frame())
    with pytest.raises(ValueError, match="ranks must be None .* or 'all'; got 'every'"):
        insp.frame(ranks="every")


def test_compare_ranks_on_one_rank_says_there_is_nothing_to_compare():
    result = scn.compare_ranks(train(mlp(), steps=1))
    assert result.first is None and result.ranks == [] and result.pairs == {}
    assert "one rank only" in repr(result) and "records of one rank only" in result.notes[0]


def test_compare_ranks_finds_a_rank_whose_parameters_drift(monkeypatch):
    # Two ranks' records joined by hand (the torchrun test does it for real): rank 1's model
    # gets an update DDP never sees after step 1's optimiser step.
    frames = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        model = mlp()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.Generator().manual_seed(10 + rank)  # each rank its own data
        with scn.inspect(model, params=True) as insp:
            for step in range(3):
                optimizer.zero_grad()
                model(torch.randn(4, 8, generator=data)).pow(2).mean().backward()
                for p in model.parameters():  # DDP's all-reduce: the same gradient everywhere
                    p.grad = torch.full_like(p, 0.01)
                optimizer.step()
                if rank == 1 and step == 1:
                    with torch.no_grad():
                        model[0].bias.mul_(1.001)
        frames.append(insp.frame())
    job = pd.concat(frames, ignore_index=True)
    result = scn.compare_ranks(job)
    assert result.ranks == [1]
    first = result.first
    assert (first.rank, first.step, first.module, first.io, first.index) == (1, 2, "0", "param",
                                                                             "bias")
    assert any("inputs differ at 3 of 3 steps" in n for n in result.notes)
    # two ranks: no majority can say which one is wrong, so the headline says both
    assert "rank 0 and rank 1 differ" in repr(result) and "rank 1 differs" not in repr(result)
    # with inputs=True the ranks' data is compared too, and it differs from the start
    assert scn.compare_ranks(job, inputs=True).first.io == "input"
