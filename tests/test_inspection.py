"""The inspection engine: what a user reads in insp.frame(), and that the forward pass is untouched."""

from __future__ import annotations

import collections
import dataclasses
import gc
import math
import subprocess
import sys
import warnings
import weakref

import pytest
import torch
from gc_support import objects_left_by
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.modules import module as module_globals

import singlecard_nb as scn
from singlecard_nb.inspection.engine import COLUMNS
from singlecard_nb.inspection.kernel import stats


def hooks_left(model: nn.Module) -> int:
    """Every hook a model and torch's global tables hold."""
    count = len(module_globals._global_forward_hooks) + len(module_globals._global_forward_pre_hooks)
    for m in model.modules():
        count += len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
        for p in m.parameters(recurse=False):
            count += len(getattr(p, "_post_accumulate_grad_hooks", None) or {})
    return count


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


# --- the frame a user reads ----------------------------------------------------------------
def test_frame_has_contract_columns_and_one_row_per_module_output():
    model, x = mlp(), torch.randn(5, 8)
    with scn.inspect(model) as insp:
        model(x)
    df = insp.frame()
    assert list(df.columns[:17]) == ["step", "module", "type", "call", "io", "index", "shape",
                                     "dtype", "device", "mean", "std", "min", "max", "absmax",
                                     "nan", "inf", "zeros"]
    outputs = df[df.io == "output"]
    assert list(outputs.module) == ["0", "1", "2", ""]
    assert list(outputs.type) == ["Linear", "ReLU", "Linear", "Sequential"]
    assert outputs["shape"].tolist() == [(5, 16), (5, 16), (5, 4), (5, 4)]
    inputs = df[df.io == "input"]
    assert inputs.module.tolist() == [""] and inputs["index"].tolist() == ["[0]"]
    assert set(df.dtype) == {"float32"} and set(df.device) == {"cpu"}


@pytest.mark.parametrize("shape", [(3, 5), (4, stats.SMALL_NUMEL), (2, 150_000)],
                         ids=["small-batched", "large-aminmax", "large-amin-amax"])
def test_statistics_equal_torch_reductions(shape):
    torch.manual_seed(1)
    x = torch.randn(*shape) * 3 + 1
    x[0, :2] = 0.0
    model = nn.Sequential(nn.Identity())
    with scn.inspect(model) as insp:
        model(x)
    row = insp.frame().query("module == '0'").iloc[0]
    assert row["mean"] == pytest.approx(x.double().mean().item(), rel=1e-5, abs=1e-6)
    assert row["std"] == pytest.approx(x.double().std().item(), rel=1e-4)
    assert row["min"] == x.min().item() and row["max"] == x.max().item()
    assert row["absmax"] == x.abs().max().item()
    assert row["zeros"] == pytest.approx((x == 0).double().mean().item())
    assert row["nan"] == 0 and row["inf"] == 0


@pytest.mark.parametrize("numel", [4, 100_000], ids=["small", "large"])
def test_nan_and_inf_are_counted(numel):
    x = torch.ones(numel)
    x[:3] = torch.tensor([math.nan, math.inf, -math.inf])
    x[3] = 0.0
    model = nn.Sequential(nn.Identity())
    with scn.inspect(model) as insp:
        model(x)
    row = insp.frame().query("module == '0'").iloc[0]
    assert (row["nan"], row["inf"]) == (1, 2)
    assert row["zeros"] == pytest.approx(1 / numel)
    assert math.isnan(row["mean"])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_low_and_high_precision_accumulate_exactly_enough(dtype):
    x = (torch.arange(4096, dtype=torch.float32) / 64).to(dtype)
    model = nn.Sequential(nn.Identity())
    with scn.inspect(model) as insp:
        model(x)
    row = insp.frame().query("module == '0'").iloc[0]
    assert row["dtype"] == str(dtype).removeprefix("torch.")
    assert row["mean"] == pytest.approx(x.double().mean().item(), rel=1e-6)
    assert row["max"] == pytest.approx(x.double().max().item())


def test_integer_bool_complex_and_empty_tensors():
    class Mixed(nn.Module):
        def forward(self, x):
            return {"ids": torch.arange(10), "mask": torch.ones(3, dtype=torch.bool),
                    "z": torch.tensor([3 + 4j, 0j]), "empty": x[:0], "count": 7}

    model = nn.Sequential(Mixed())
    with scn.inspect(model) as insp:
        model(torch.randn(4, 2))
    df = insp.frame().query("module == '0'").set_index("index")
    assert df.loc["['ids']", "min"] == 0 and df.loc["['ids']", "max"] == 9
    assert df.loc["['ids']", "mean"] == 4.5 and df.loc["['ids']", "nan"] == 0
    assert df.loc["['mask']", "mean"] == 1.0
    assert df.loc["['z']", "max"] == 5.0  # magnitudes
    empty = df.loc["['empty']"]
    assert empty["shape"] == (0, 2) and math.isnan(empty["mean"])
    assert "['count']" not in df.index  # an int is skipped, not raised


def test_sparse_and_meta_tensors_keep_shape_only():
    class Odd(nn.Module):
        def forward(self, x):
            return x.to_sparse(), torch.empty(2, 3, device="meta")

    model = nn.Sequential(Odd())
    with scn.inspect(model) as insp:
        model(torch.eye(3))
    df = insp.frame().query("module == '0'")
    assert df["shape"].tolist() == [(3, 3), (2, 3)]
    assert df.device.tolist() == ["cpu", "meta"]
    assert df["mean"].isna().all()


# --- a zoo of real output structures ---------------------------------------------------------
@dataclasses.dataclass
class DataclassOut:
    logits: torch.Tensor
    aux: torch.Tensor | None = None


@dataclasses.dataclass
class HFLikeOutput(collections.OrderedDict):
    """Shaped like Hugging Face's ModelOutput: an OrderedDict that is also a dataclass."""

    last_hidden_state: torch.Tensor = None
    attentions: tuple | None = None

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None:
                self[field.name] = value


Pair = collections.namedtuple("Pair", ["left", "right"])


class Zoo(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 6, batch_first=True)
        self.attn = nn.MultiheadAttention(6, 2, batch_first=True)
        self.emb = nn.Embedding(10, 6)
        self.shared = nn.Linear(6, 6)

    def forward(self, x, ids):
        seq, (h, c) = self.lstm(x)
        attended, weights = self.attn(seq, seq, seq, need_weights=False)
        assert weights is None
        e = self.emb(ids)
        y = self.shared(self.shared(attended + e))  # one module called twice per step
        return HFLikeOutput(last_hidden_state=y), DataclassOut(logits=y.sum(-1)), Pair(h, c)


def test_zoo_of_structures_is_walked_and_named():
    torch.manual_seed(0)
    model = Zoo()
    x, ids = torch.randn(2, 5, 4), torch.randint(0, 10, (2, 5))
    with scn.inspect(model) as insp:
        model(x, ids=ids)
    df = insp.frame()
    lstm = df.query("module == 'lstm' and io == 'output'")
    assert lstm["index"].tolist() == ["[0]", "[1][0]", "[1][1]"]
    assert df.query("module == 'attn' and io == 'output'")["index"].tolist() == ["[0]"]
    assert df.query("module == 'shared'")["call"].tolist() == [0, 1]
    emb_in = df.query("module == '' and io == 'input'")
    assert emb_in["index"].tolist() == ["[0]", "['ids']"]  # keyword inputs included
    assert emb_in.set_index("index").loc["['ids']", "dtype"] == "int64"
    root = df.query("module == '' and io == 'output'")["index"].tolist()
    assert root == ["[0].last_hidden_state", "[1].logits", "[2].left", "[2].right"]


def test_recursive_module_and_empty_batch():
    class Tree(nn.Module):
        def __init__(self, depth):
            super().__init__()
            self.leaf = nn.Linear(3, 3)
            self.child = Tree(depth - 1) if depth else None

        def forward(self, x):
            x = self.leaf(x)
            return self.child(x) if self.child is not None else x

    model = Tree(2)
    with scn.inspect(model) as insp:
        model(torch.randn(4, 3))
        model(torch.randn(0, 3))
    df = insp.frame()
    assert set(df.module) >= {"leaf", "child.leaf", "child.child.leaf"}
    assert df.step.max() == 1  # recursive calls of modules inside did not start new steps
    empty = df.query("step == 1 and io == 'output'")
    assert (empty["shape"].map(lambda s: s[0]) == 0).all() and empty["mean"].isna().all()


nested = st.recursive(
    st.one_of(st.none(), st.integers(), st.text(max_size=3),
              st.builds(lambda n: torch.randn(n), st.integers(0, 40)),
              st.builds(lambda n: torch.arange(n), st.integers(0, 5))),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.tuples(children, children),
        st.dictionaries(st.text(min_size=1, max_size=3), children, max_size=3),
        st.builds(lambda a, b: Pair(a, b), children, children),
        st.builds(lambda a: DataclassOut(logits=a), children)),
    max_leaves=12)


def _tensors(obj):
    from singlecard_nb.inspection.recording.structures import walk_tensors

    return [t for _, t in walk_tensors(obj)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(structure=nested)
def test_any_output_structure_passes_through_untouched(structure):
    class Returns(nn.Module):
        def forward(self, x):
            return structure

    model = nn.Sequential(Returns())
    with scn.inspect(model, grads=True) as insp:
        out = model(torch.zeros(1))
    assert out is structure
    rows = insp.frame().query("module == '0' and io == 'output'")
    assert len(rows) == len(_tensors(structure))
    assert insp.errors == []
    assert hooks_left(model) == 0


# --- the forward pass is never changed -------------------------------------------------------
def test_outputs_and_gradients_are_bit_identical():
    torch.manual_seed(3)
    model = Zoo()
    x, ids = torch.randn(2, 5, 4), torch.randint(0, 10, (2, 5))
    bare = model(x, ids=ids)
    bare[0].last_hidden_state.sum().backward()
    bare_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with scn.inspect(model, grads=True, inputs=True):
        seen = model(x, ids=ids)
        seen[0].last_hidden_state.sum().backward()
    assert torch.equal(bare[0].last_hidden_state, seen[0].last_hidden_state)
    assert torch.equal(bare[2].left, seen[2].left)
    for before, p in zip(bare_grads, model.parameters()):
        assert torch.equal(before, p.grad)


def test_failure_inside_the_inspector_warns_once_and_never_raises(monkeypatch):
    def broken(self, *args, **kwargs):
        raise RuntimeError("statistics exploded")

    monkeypatch.setattr(stats.StepStats, "add", broken)
    monkeypatch.setattr(stats.StepStats, "add_dense", broken)  # most CPU tensors' way
    model, x = mlp(), torch.randn(2, 8)
    expected = model(x)
    with pytest.warns(RuntimeWarning, match="statistics exploded") as record:
        with scn.inspect(model) as insp:
            out = model(x)
            model(x)
    assert torch.equal(out, expected)
    assert len([w for w in record if "statistics exploded" in str(w.message)]) == 1
    assert len(insp.errors) >= 4 and "'0'" in insp.errors[1]


# --- hooks are given back ----------------------------------------------------------------------
@pytest.mark.parametrize("interrupt", [RuntimeError, KeyboardInterrupt])
def test_hooks_removed_after_exception_or_ctrl_c(interrupt):
    model = mlp()
    with pytest.raises(interrupt):
        with scn.inspect(model, grads=True):
            model(torch.randn(2, 8))
            assert hooks_left(model) > 0
            raise interrupt()
    assert hooks_left(model) == 0


def test_activations_are_not_kept_alive():
    refs = []

    class Remember(nn.Module):
        def forward(self, x):
            y = x * 2
            refs.append(weakref.ref(y))
            return y

    model = nn.Sequential(Remember(), nn.ReLU(), Remember())
    with scn.inspect(model, grads=True) as insp:
        for _ in range(3):
            model(torch.randn(64, 512, requires_grad=True)).sum().backward()
        gc.collect()
        assert refs and all(r() is None for r in refs)  # while still inspecting
    assert len(insp.frame()) > 0


def _objects_a_step_leaves(options: dict | None) -> int:
    """Objects the garbage collector tracks that one training step (forward, backward, SGD)
    of a 200-layer model leaves alive for the next, once a collection of the youngest
    generation has untracked what it can: what it would count as long-lived."""
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(4, 4) for _ in range(200)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(2, 4)

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    insp = scn.inspect(model, **options) if options is not None else None
    try:
        step()
        step()
        return objects_left_by(step)
    finally:
        if insp is not None:
            insp.stop()


def test_a_recorded_step_leaves_the_garbage_collector_little_to_walk():
    """Objects that live through a step count for Python's collector as long-lived, and when
    they add up to a quarter of the process's objects it walks all of them: 0.2 s a time under
    a 5 000-module model, which took every third step with grads=True before (per_call.py
    --collector). A gradient hook is now one object (a closure was eight), a row's shape an
    older tuple (a new one left the row tracked) and params=True keeps one object a parameter
    (two) and makes no tuple or copy per parameter that outlives the step."""
    calls, params = 200, 400
    bare = _objects_a_step_leaves(None)
    forward = _objects_a_step_leaves({}) - bare
    grads = _objects_a_step_leaves({"grads": True}) - bare
    everything = _objects_a_step_leaves({"grads": True, "params": True}) - bare
    assert forward <= 0.1 * calls, forward  # rows are untracked: a few lists, the step
    # per output: our hook, the tensor's hook dict and its grad_fn's object (torch's own
    # register_hook makes the last two as well)
    assert grads <= 3 * calls + 20, grads
    assert everything - grads <= 1.1 * params, everything - grads  # the .grad seen, weakly


def test_a_large_parameter_and_its_update_get_their_own_statistics():
    """params=True rows of a parameter of more than 16 384 values (read whole by the kernel
    since they can never be a tensor seen before) hold the parameter after the step and Δw."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x = torch.randn(16, 256)
    with scn.inspect(model, grads=True, params=True) as insp:
        for _ in range(2):
            before = model[0].weight.detach().clone()
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    frame = insp.frame()
    rows = frame[(frame.step == 1) & (frame.module == "0") & (frame["index"] == "weight")]
    after = model[0].weight.detach()
    for io, t in (("param", after.double()), ("update", (after - before).double())):
        row = rows[rows.io == io].iloc[0]
        assert row["shape"] == (256, 256)
        assert row["min"] == t.min().item() and row["max"] == t.max().item(), io
        assert row["mean"] == pytest.approx(t.mean().item(), rel=1e-9, abs=1e-15), io
        assert row["std"] == pytest.approx(t.std().item(), rel=1e-9), io
    assert (rows[rows.io == "update"]["absmax"] > 0).all()  # the step moved it


def test_memory_for_records_is_bounded_and_says_so():
    model = nn.Sequential(*[nn.Identity() for _ in range(10)])
    with pytest.warns(RuntimeWarning, match="max_rows=25 reached"):
        with scn.inspect(model, max_rows=25) as insp:
            for _ in range(10):
                model(torch.randn(3))
    df = insp.frame()
    assert len(df) == 25
    assert df.step.max() == 9  # the newest rows are the ones kept


# --- steps, filters, gradients, trap ------------------------------------------------------------
def test_every_records_steps_0_n_2n():
    model = mlp()
    with scn.inspect(model, every=3) as insp:
        for _ in range(7):
            model(torch.randn(2, 8))
    assert sorted(insp.frame().step.unique()) == [0, 3, 6]
    assert insp.steps_recorded == 3


def test_explicit_steps_group_several_forwards():
    model = mlp()
    with scn.inspect(model, steps="manual") as insp:
        for _ in range(2):
            for _ in range(4):  # gradient accumulation: four micro-batches per step
                model(torch.randn(2, 8))
            insp.step()
    df = insp.frame()
    assert sorted(df.step.unique()) == [0, 1]
    assert df.query("step == 1 and module == '0'")["call"].tolist() == [0, 1, 2, 3]


def test_include_and_exclude_match_paths_and_classes():
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), nn.Linear(2, 2)))
    with scn.inspect(model, include="1.*") as insp:
        model(torch.randn(1, 2))
    assert set(insp.frame().module) == {"1.0", "1.1"}
    with scn.inspect(model, exclude=["ReLU", ""]) as insp:
        model(torch.randn(1, 2))
    assert set(insp.frame().module) == {"0", "1", "1.1"}


def test_gradients_of_outputs_and_parameters():
    model, x = mlp(), torch.randn(5, 8)
    with scn.inspect(model, grads=True) as insp:
        loss = model(x).pow(2).sum()
        loss.backward()
    df = insp.frame()
    weight = df.query("io == 'param_grad' and module == '0' and index == 'weight'").iloc[0]
    assert weight["shape"] == (16, 8)
    assert weight["absmax"] == pytest.approx(model[0].weight.grad.abs().max().item())
    out_grad = df.query("io == 'grad' and module == '2'").iloc[0]
    assert out_grad["mean"] == pytest.approx((2 * model(x)).mean().item(), rel=1e-5)


def test_trap_names_the_first_nonfinite_output_and_keeps_rows():
    class Boom(nn.Module):
        def forward(self, x):
            return x / 0.0

    model = nn.Sequential(nn.Linear(3, 3), nn.Sequential(nn.ReLU(), Boom()), nn.Linear(3, 1))
    with pytest.raises(scn.NonFiniteError) as info:
        with scn.inspect(model, trap=True) as insp:
            model(torch.randn(2, 3))
    err = info.value
    assert (err.module, err.module_type, err.io, err.index) == ("1.1", "Boom", "output", "")
    assert err.nan + err.inf > 0 and err.inputs_finite is True
    assert "'1.1'" in str(err) and "Boom" in str(err)
    assert {"0", "1.0", "1.1"} <= set(insp.frame().module)
    assert hooks_left(model) == 0


def test_trap_in_backward():
    class BadGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return g * math.inf

    class Layer(nn.Module):
        def forward(self, x):
            return BadGrad.apply(x)

    model = nn.Sequential(nn.Linear(3, 3), Layer(), nn.Linear(3, 1))
    with pytest.raises(scn.NonFiniteError) as info:
        with scn.inspect(model, grads=True, trap=True):
            model(torch.randn(2, 3)).sum().backward()
    assert info.value.io in ("grad", "param_grad") and info.value.module == "0"


# --- compile, ranks, no IPython ---------------------------------------------------------------
def test_module_compile_is_inspected():
    model = mlp()
    model.compile(backend="eager")
    x = torch.randn(2, 8)
    expected = model(x)
    with scn.inspect(model) as insp:
        out = model(x)
    assert torch.equal(out, expected)
    assert {"0", "1", "2"} <= set(insp.frame().module)


def test_torch_compile_wrapper_inspects_the_original_and_warns():
    model = mlp()
    compiled = torch.compile(model, backend="eager")
    with pytest.warns(UserWarning, match="run eagerly while inspected"):
        insp = scn.inspect(compiled)
    assert compiled.forward == model.__call__
    insp.stop()
    assert insp.model is model and compiled.forward != model.__call__


def test_rows_carry_the_rank(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    model = mlp()
    with scn.inspect(model) as insp:
        model(torch.randn(1, 8))
    assert set(insp.frame()["rank"]) == {3}


def test_engine_runs_without_ipython():
    code = (
        "import sys, torch, singlecard_nb as scn\n"
        "m = torch.nn.Linear(2, 2)\n"
        "with scn.inspect(m) as insp: m(torch.randn(1, 2))\n"
        "assert len(insp.frame()) == 2\n"
        "assert 'IPython' not in sys.modules, 'IPython imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_history_and_summary_tables():
    model = mlp()
    with scn.inspect(model) as insp:
        for _ in range(3):
            model(torch.randn(4, 8))
    history = insp.history("absmax")
    assert list(history.columns) == [0, 1, 2] and list(history.index) == ["0", "1", "2", ""]
    summary = insp.summary()
    assert "<table" in summary._repr_html_() and "Linear" in repr(summary)
    assert summary.frame.set_index("module").loc["0", "steps"] == 3
    with pytest.raises(ValueError, match="stat must be one of"):
        insp.history("median")


def test_bad_arguments_are_refused_before_anything_is_attached():
    model = mlp()
    for kwargs in ({"every": 0}, {"max_rows": -1}, {"inputs": "all"}):
        with pytest.raises(ValueError):
            scn.inspect(model, **kwargs)
    with pytest.raises(TypeError, match="nn.Module"):
        scn.inspect([1, 2])
    assert hooks_left(model) == 0


def test_column_list_is_the_documented_one():
    assert COLUMNS[-2:] == ("rank", "training") and len(COLUMNS) == 19


def test_warnings_are_not_emitted_in_normal_use():
    model = mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with scn.inspect(model, grads=True) as insp:
            model(torch.randn(3, 8)).sum().backward()
        insp.frame()


def test_histograms_are_taken_on_request_without_keeping_activations():
    model = mlp()
    with scn.inspect(model, hist=["1"]) as insp:
        model(torch.randn(64, 8))
        counts, edges = insp.histograms()["1"]
        assert counts.sum() == 64 * 16 and edges[0] == 0.0  # ReLU output starts at zero
        with pytest.raises(ValueError, match="from the next recorded step"):
            insp.hist(modules=["0"])
        model(torch.randn(64, 8))
        figure = insp.hist(modules=["0", "1"])
    titles = [ax.get_title() for ax in figure.axes if ax.get_title()]
    assert sorted(t for t in titles if not t.startswith("per step")) == ["0", "1"]
